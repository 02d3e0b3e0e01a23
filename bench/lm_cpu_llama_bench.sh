#!/usr/bin/env bash
# llama.cpp's own benchmark (llama-bench) on the CPU, built from the llama.cpp that the
# llama-cpp-python 0.3.36 source package vendors, on the same GGUF as `nuvec bench`:
# prefill of 128 tokens, and 32 decode steps after a context of 128 (`tg32 @ d128`), with 2
# threads and 1. It replaces bench/lm_cpu_peers.py where that package's Python build crashes.
#
# Usage: bash bench/lm_cpu_llama_bench.sh GGUF [BUILD_DIR]
#
# Built without -march=native: on this VM the native build uses AMX tiles and dies of an
# illegal instruction; AVX-512 (VNNI, VBMI, BF16) and AVX2 are enabled explicitly instead.
set -euo pipefail
gguf=${1:?usage: lm_cpu_llama_bench.sh GGUF [BUILD_DIR]}
dir=${2:-${TMPDIR:-/tmp}/nuvec-llama-bench}
src="$dir/llama_cpp_python-0.3.36/vendor/llama.cpp"
if [ ! -x "$src/build/bin/llama-bench" ]; then
  mkdir -p "$dir"
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$dir"
  tar xzf "$dir/llama_cpp_python-0.3.36.tar.gz" -C "$dir"
  command -v cmake >/dev/null || python3 -m pip install --quiet cmake
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON \
    -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  cmake --build "$src/build" --target llama-bench -j "$(nproc)" >/dev/null
fi
"$src/build/bin/llama-bench" -m "$gguf" -p 128 -n 0 -t 2 -r 3
"$src/build/bin/llama-bench" -m "$gguf" -p 0 -n 32 -d 128 -t 2,1 -r 3
