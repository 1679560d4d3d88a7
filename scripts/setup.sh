#!/usr/bin/env bash
# Create .venv and install rlharness with everything its tests need.
# Usage: bash scripts/setup.sh   (idempotent; re-running only installs what is missing)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. scripts/venv_install.sh
# torch first, pinned: the CPU build of 2.13.0 lies on these machines' disks; anything
# unpinned would pull a multi-GB CUDA build (../shared/ENVIRONMENT.md).
venv_install .venv "torch==2.13.0"
venv_install .venv -e ".[dev]"
# DeepSpeed without its CUDA ops, built against the torch above (ENVIRONMENT.md).
DS_BUILD_OPS=0 venv_install .venv --no-build-isolation "deepspeed>=0.16"
# The embedded default model ships in the repo; rebuild it only if it is missing.
[ -f assets/tiny-arith/config.json ] || .venv/bin/python scripts/make_tiny_model.py --out assets/tiny-arith
