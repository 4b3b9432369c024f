#!/usr/bin/env bash
# Set up autotune on a fresh Debian/Ubuntu machine: system libraries the knobs preload, a Python
# virtual environment in .venv with autotune installed. `./setup.sh --test` then runs the checks.
set -euo pipefail
cd "$(dirname "$0")"

usage() {
  cat <<'USAGE'
usage: ./setup.sh [--llamacpp] [--test [PYTEST ARGS...]]

Installs the system libraries the knobs preload (apt-get) and .venv with torch, autotune and the
peer runtimes OpenVINO (with OpenVINO GenAI) and ONNX Runtime. Run it again at any time: it
installs only what is missing.

  --llamacpp  also install llama.cpp (llama-cpp-python, backend=llamacpp for --task generate);
              pip compiles it from source: several minutes on 2 cores, once (pip keeps the wheel)
  --test      install what the tests need (chromium, postgresql, llama.cpp as --llamacpp does),
              then run ruff, mypy, lint-imports and pytest (with PYTEST ARGS)
  --help      this text
USAGE
}

LLAMACPP=""
case "${1:-}" in
  --help|-h) usage; exit 0 ;;
  --llamacpp) LLAMACPP=1; shift ;;
esac
[ "${1:-}" = "--test" ] && LLAMACPP=1  # CI runs every runtime the search offers

SYSTEM_PACKAGES=(libjemalloc2 libtcmalloc-minimal4 libomp5 numactl util-linux)
BUILD_PACKAGES=(build-essential cmake)  # --llamacpp: pip compiles llama.cpp
TEST_SYSTEM_PACKAGES=(chromium postgresql)  # the report e2e test opens a real browser; the fleet tests start a real server
TORCH=${AUTOTUNE_TORCH:-"torch==2.14.1 torchvision==0.29.1"}
PYTHON=${PYTHON:-python3}

install_system_packages() {  # the packages named, those not installed yet
  command -v apt-get >/dev/null || { echo "setup: no apt-get; install $* yourself" >&2; return; }
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

install_python_env() {
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  echo "setup: installing autotune into .venv (torch from: $TORCH)"
  # openvino, openvino-genai, onnxruntime: the peer backends (optional for users: pip install
  # 'autotune[openvino]'); transformers: --model hf:... (optional for users: pip install 'autotune[transformers]')
  local extras="test,postgres,openvino,openvino-genai,onnxruntime,transformers" modules=""
  if [ -n "$LLAMACPP" ]; then
    # llama-cpp-python compiles llama.cpp (cmake, a C++ compiler) for this CPU on both cores, once
    extras+=",llamacpp" modules=", llama_cpp"
    .venv/bin/python -c "import llama_cpp" 2>/dev/null || echo "setup: building llama.cpp (several minutes)"
  fi
  # shellcheck disable=SC2086
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" .venv/bin/python -m pip install -q --disable-pip-version-check $TORCH \
    -e ".[$extras]" \
    2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import autotune, torch, torchvision, optuna, psycopg, openvino, nncf, openvino_genai, onnxruntime, onnx, onnxscript, transformers, gguf, accelerate$modules" \
    || { echo "setup: the Python environment is incomplete; see pip's messages above" >&2; exit 1; }
}

install_system_packages "${SYSTEM_PACKAGES[@]}"
[ -n "$LLAMACPP" ] && install_system_packages "${BUILD_PACKAGES[@]}"
install_python_env

if [ "${1:-}" = "--test" ]; then
  shift
  install_system_packages "${TEST_SYSTEM_PACKAGES[@]}"
  .venv/bin/ruff check autotune tests benchmarks examples
  .venv/bin/mypy
  .venv/bin/lint-imports --no-cache --no-logo
  exec .venv/bin/python -m pytest "$@"
fi
echo "setup: done; run .venv/bin/autotune --help"
