"""Build the CPU kernels ahead of time: ``python -m minisgl.kernels.cpu`` (exit status 1 if they can't be)."""

import logging
import time

import torch

from minisgl.kernels.cpu import is_available

logging.basicConfig(level=logging.WARNING)
start = time.perf_counter()
ok = is_available()
print(
    f"minisgl CPU kernels: {'ready' if ok else 'NOT available'} ({time.perf_counter() - start:.1f}s, "
    f"ISA {torch.backends.cpu.get_cpu_capability()})"
)
raise SystemExit(0 if ok else 1)
