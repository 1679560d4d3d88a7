# Sourced by scripts/setup.sh and scripts/setup_vllm.sh: `venv_install VENV ARGS...` is
# `pip install ARGS` into VENV, done by uv (installed into VENV from PyPI by pip on first use).
# uv resolves, fetches and unpacks in parallel native code: the .venv's packages took pip about
# 2 minutes here and uv about 25 s of CPU, the vLLM venv's ~180 CPU-s and 40 (docs/notes/benchmarks-log.md, "Issue 21: uv"),
# the same versions either way. It reads no pip configuration: pip's wheel folders (where
# these machines keep the CPU build of torch) and certificate are passed on.
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -z "${UV_FIND_LINKS:-}" ]; then
  UV_FIND_LINKS=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
  [ -n "$UV_FIND_LINKS" ] && export UV_FIND_LINKS || unset UV_FIND_LINKS
fi
[ -n "${PIP_CERT:-}" ] && [ -z "${SSL_CERT_FILE:-}" ] && export SSL_CERT_FILE=$PIP_CERT
# Nothing is byte-compiled at install (torch alone: 34 s of CPU here): where Python writes
# bytecode itself, it compiles only the modules a run imports, once. Where PYTHONDONTWRITEBYTECODE
# is set nothing would ever be cached, so every module is compiled at install.
UV_COMPILE=$([ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && echo --compile-bytecode || true)

venv_install() {
  local venv=$1
  shift
  [ -x "$venv/bin/uv" ] || "$venv/bin/python" -m pip install -q "uv>=0.5"
  "$venv/bin/uv" pip install -q --python "$venv/bin/python" $UV_COMPILE "$@"
}
