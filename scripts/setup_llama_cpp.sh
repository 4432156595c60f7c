#!/usr/bin/env bash
# Build llama.cpp's server, llama-perplexity and llama-bench from llama-cpp-python's PyPI source
# distribution, in their own folder (default .venv-llamacpp, ~200 MB), so that benchmarks/bench_offline.py,
# benchmarks/bench_quant.py and tools/quant_accuracy.py can run them beside minisgl.
#   scripts/setup_llama_cpp.sh [VENV_DIR]
# It takes 15-40 minutes on two cores. llama.cpp is a peer we measure against, never a dependency.
#
# Why llama-server and not llama-cpp-python's own server (`python -m llama_cpp.server`): that one
# holds a lock around its model, so it runs one request at a time. llama-server, built here from the
# llama.cpp sources vendored in the same source distribution, batches continuously over parallel
# slots (--parallel N, one slot per request), the way minisgl and vLLM do.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(realpath -m "${1:-.venv-llamacpp}")"
version=0.3.36

[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "cmake>=3.21" ninja  # the build tools, from PyPI too
src="$venv/src/llama_cpp_python-$version"
if [[ ! -d "$src" ]]; then
  "$venv/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$venv/src"
  tar -xzf "$venv/src/llama_cpp_python-$version.tar.gz" -C "$venv/src"
fi

# Compiled for this CPU's vector ISA (AVX2 or AVX-512), as minisgl's kernels are, but named flag by
# flag from /proc/cpuinfo instead of GGML_NATIVE: -march=native also defines __AMX_INT8__ on an AMX
# CPU, which compiles in ggml's AMX backend, and llama.cpp then repacks quantized weights (Q4_1
# among them; f32 and bf16 stay on the plain path) into its AMX buffer, whose matmul has segfaulted
# on Sapphire Rapids machines (ggml_backend_amx_mul_mat, ggml-org/llama.cpp#20824): bench_offline's
# Q4_1 row died there with signal 11 while the f32 and bf16 rows ran. The flags are also read anew
# on every run, so a build folder carried over from another CPU is reconfigured and recompiled
# (with GGML_NATIVE its objects kept the old CPU's instructions). Static libraries, so the binary
# runs on its own; no web UI (it would need npm or a download), no curl.
has() { grep -qw "$1" /proc/cpuinfo; }
isa=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
for flag in avx avx2 fma f16c bmi2 avx_vnni avx512f avx512_vnni avx512_bf16 avx512vbmi; do
  name=$(tr a-z A-Z <<<"$flag" | sed 's/^AVX512F$/AVX512/; s/^AVX512VBMI$/AVX512_VBMI/')
  if has "$flag"; then isa+=("-DGGML_$name=ON"); else isa+=("-DGGML_$name=OFF"); fi
done
"$venv/bin/cmake" -S "$src/vendor/llama.cpp" -B "$venv/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
  -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >/dev/null
# One tool after another, each copied as soon as it links: the two the comparisons of
# tools/quant_accuracy.py and benchmarks/peer_llama_cpp.py need first, the server (the longest) last.
for tool in llama-perplexity llama-bench llama-server; do
  "$venv/bin/cmake" --build "$venv/build" --target "$tool" -j "$(nproc)"
  cp "$venv/build/bin/$tool" "$venv/bin/$tool"
done
"$venv/bin/llama-server" --version
