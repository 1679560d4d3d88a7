#!/usr/bin/env bash
# Create .venv and install rlharness with everything its tests need.
# Usage: bash scripts/setup.sh   (idempotent; re-running only installs what is missing)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
. scripts/pip_env.sh
# torch first, pinned: the CPU build of 2.13.0 lies on these machines' disks; anything
# unpinned would pull a multi-GB CUDA build (../shared/ENVIRONMENT.md).
python -c "import torch" 2>/dev/null || pip install -q $NO_COMPILE "torch==2.13.0"
pip install -q $NO_COMPILE -e ".[dev]"
# DeepSpeed without its CUDA ops, built against the torch above (ENVIRONMENT.md).
python -c "import deepspeed" 2>/dev/null || DS_BUILD_OPS=0 pip install -q $NO_COMPILE --no-build-isolation "deepspeed>=0.16"
# The embedded default model ships in the repo; rebuild it only if it is missing.
[ -f assets/tiny-arith/config.json ] || python scripts/make_tiny_model.py --out assets/tiny-arith
