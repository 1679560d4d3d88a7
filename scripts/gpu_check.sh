#!/usr/bin/env bash
# The first thing to run on a machine with an NVIDIA GPU: vLLM's CUDA build with sleep mode, NCCL
# weight sync of SmolLM2, training on CUDA, the bfloat16 log-prob gap between engine and trainer, packed
# against padded training rows, and the tokens/s of each phase, into one JSON file (scripts/gpu_check.py
# says what each phase does).
# Usage: bash scripts/gpu_check.sh [OUT.json]   (default gpu_check.json; exit 1 if anything failed)
#
# It sets up what is missing first (scripts/setup.sh, scripts/setup_vllm.sh: vLLM's CUDA build,
# scripts/fetch_smollm2.sh), then gives the checks GPU_CHECK_TIMEOUT_S (default 480) seconds.
# Where no GPU answers it stops at once with one line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_check.json}
fail() { echo "gpu_check: FAILED: $*" >&2; exit 1; }

command -v nvidia-smi >/dev/null 2>&1 || fail "no NVIDIA GPU here (nvidia-smi is not installed): nothing was checked"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
[ "$gpus" -gt 0 ] || fail "no NVIDIA GPU here (nvidia-smi lists none): nothing was checked"
echo "gpu_check: $gpus GPU(s): $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)"

START_S=$SECONDS
[ -x .venv/bin/python ] || bash scripts/setup.sh
bash scripts/setup_vllm.sh
[ -f assets/smollm2-135m-instruct/config.json ] || bash scripts/fetch_smollm2.sh
echo "gpu_check: set-up took $((SECONDS - START_S)) s"

timeout "${GPU_CHECK_TIMEOUT_S:-480}" .venv-vllm/bin/python scripts/gpu_check.py --out "$OUT" \
  || fail "scripts/gpu_check.py exited with status $? (124: it ran past ${GPU_CHECK_TIMEOUT_S:-480} s); see $OUT"
