"""Peak resident memory of minisgl loading a model in bfloat16 against float32, in one run.

    PYTHONPATH=$PWD python benchmarks/bench_load_memory.py [--model-path PATH]

Each dtype runs in a fresh process, which builds an offline Engine (loading, packing the weights
for the GEMM, the KV pool) and decodes 8 requests of 32 tokens; it reports its VmHWM (the kernel's
high-water mark of resident memory) after loading and at the end, and the same for a process that
only imports torch and minisgl (the floor every engine pays), and the resident memory that loading
the model added (its tensors, packed copies included: the part that should halve). The default
model is the GGUF SmolLM2-135M, whose converted checkpoint is float32: bfloat16 is read from it
tensor by tensor.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
hwm = lambda: status("VmHWM")
import torch, minisgl.entrypoints.engine as e
from minisgl.model_executor.model_runner import ModelRunner
out = {"import": hwm()}
load_model = ModelRunner.load_model
def measured_load_model(self):  # resident memory the model's tensors add (weights, packed copies)
    before = status("VmRSS")
    load_model(self)
    out["model"] = status("VmRSS") - before
ModelRunner.load_model = measured_load_model
if sys.argv[2] != "none":
    engine = e.Engine(model_path=sys.argv[1], dtype=sys.argv[2], max_total_tokens=2048)
    out["loaded"] = hwm()
    engine.generate(input_ids=[[1, 2, 3, 4]] * 8, sampling_params={"max_new_tokens": 32, "ignore_eos": True})
    out["served"] = hwm()
    engine.shutdown()
print("RESULT " + json.dumps(out))
"""


def measure(model_path: str, dtype: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", CHILD, model_path, dtype], capture_output=True, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default="SmolLM2-135M-Instruct")
    args = parser.parse_args()
    floor = measure(args.model_path, "none")["import"]
    rows = {dtype: measure(args.model_path, dtype) for dtype in ("float32", "bfloat16")}
    print(f"model {args.model_path}; import torch + minisgl alone: {floor:.0f} MB")
    for dtype, r in rows.items():
        print(
            f"  {dtype:9s} peak after loading {r['loaded']:6.0f} MB, after serving {r['served']:6.0f} MB; "
            f"loading the model added {r['model']:4.0f} MB resident"
        )
    print(f"bfloat16 / float32 of the model's own memory: {rows['bfloat16']['model'] / rows['float32']['model']:.2f}")
    for key in ("loaded", "served"):
        ratio = rows["bfloat16"][key] / rows["float32"][key]
        above = (rows["bfloat16"][key] - floor) / (rows["float32"][key] - floor)
        print(f"bfloat16 / float32 peak ({key}): {ratio:.2f} (above the import floor: {above:.2f})")


if __name__ == "__main__":
    main()
