#!/usr/bin/env bash
# Create .venv and install rlharness with everything its tests need.
# Usage: bash scripts/setup.sh   (idempotent; re-running only installs what is missing)
set -euo pipefail
cd "$(dirname "$0")/.."
# The python tool's sandbox (rlharness/sandbox, docs/concepts/sandbox.md): bubblewrap for its namespaces,
# libseccomp for its filter, Debian's python3 as the interpreter the sandboxed code runs with.
if ! command -v bwrap >/dev/null || [ ! -x /usr/bin/python3 ] || ! ldconfig -p | grep libseccomp.so.2 >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap libseccomp2 python3 >/dev/null
  else
    echo "note: the python tool's sandbox needs bubblewrap, libseccomp2 and /usr/bin/python3 (as root:" \
         "apt-get install bubblewrap libseccomp2 python3); train.py refuses agent.tools=[python] without them" >&2
  fi
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. scripts/venv_install.sh
# torch first, pinned: the CPU build of 2.13.0 lies on these machines' disks; anything
# unpinned would pull a multi-GB CUDA build (../shared/ENVIRONMENT.md).
venv_install .venv "torch==2.13.0"
venv_install .venv -e ".[dev]"
# DeepSpeed without its CUDA ops, built against the torch above (ENVIRONMENT.md).
DS_BUILD_OPS=0 venv_install .venv --no-build-isolation "deepspeed>=0.16"
# A headless browser for the documentation test (tests/docs/test_site.py renders the built site):
# Debian's chromium, installed as root where apt-get exists; elsewhere that test says what is missing.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null; } \
    || echo "warning: apt-get could not install chromium; tests/docs/test_site.py needs it" >&2
fi
# The embedded default model ships in the repo; rebuild it only if it is missing.
[ -f assets/tiny-arith/config.json ] || .venv/bin/python scripts/make_tiny_model.py --out assets/tiny-arith
