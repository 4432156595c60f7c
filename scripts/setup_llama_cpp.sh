#!/usr/bin/env bash
# Build llama.cpp's server from llama-cpp-python's PyPI source distribution, in its own folder
# (default .venv-llamacpp, ~200 MB), so that benchmarks/bench_offline.py can run it beside minisgl.
#   scripts/setup_llama_cpp.sh [VENV_DIR]
# It takes 10-20 minutes on two cores. llama.cpp is a peer we measure against, never a dependency.
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

# GGML_NATIVE: compiled for this CPU (AVX2 or AVX-512), as minisgl's kernels are. Static libraries,
# so the binary runs on its own; no web UI (it would need npm or a download), no curl.
"$venv/bin/cmake" -S "$src/vendor/llama.cpp" -B "$venv/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >/dev/null
"$venv/bin/cmake" --build "$venv/build" --target llama-server -j "$(nproc)"
cp "$venv/build/bin/llama-server" "$venv/bin/llama-server"
"$venv/bin/llama-server" --version
