# Sourced by scripts/setup.sh and scripts/setup_vllm.sh: how they call pip.
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip byte-compiles every module it installs (torch alone: 34 s of CPU here, more than unpacking
# it). Where Python writes bytecode itself, it compiles only the modules a run imports, once, on
# first import: skip pip's (`pip install $NO_COMPILE ...`). Where PYTHONDONTWRITEBYTECODE is set,
# nothing would ever be cached: every process would compile torch again, so pip compiles.
NO_COMPILE=$([ -z "${PYTHONDONTWRITEBYTECODE:-}" ] && echo --no-compile || true)
