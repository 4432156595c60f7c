"""Run the offline workload of bench_offline.py through llama.cpp's server; print one JSON line.

    python benchmarks/peer_llama_cpp.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --dtype float32 \\
        --server .venv-llamacpp/bin/llama-server --workload '{...}'

Run by bench_offline.py, which finds llama-server where scripts/setup_llama_cpp.sh puts it.
--dtype float32 or bfloat16 first writes (once, into minisgl's cache folder) a GGUF file of the
same weights minisgl runs, every matrix dequantized from --gguf and stored in that dtype with the
`gguf` package; --dtype q4_1 serves --gguf as it is, a reference row at llama.cpp's usual
precision. The server gets one slot per request (--parallel N, continuous batching) and a KV
cache in the same dtype; all requests are sent at once, greedy, EOS ignored, as the other engines
run them. Peak RSS is the server process's own high-water mark (VmHWM).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workload import make_workload  # noqa: E402

GGUF_TYPE = {"float32": "F32", "bfloat16": "BF16"}
KV_CACHE_TYPE = {"float32": "f32", "bfloat16": "bf16", "q4_1": "f16"}  # q4_1: llama.cpp's default cache


def write_gguf(src: Path, dst: Path, dtype: str) -> None:
    """dst: src's metadata and tokenizer, and each of its tensors dequantized; matrices stored in
    `dtype` (rounded to nearest even for bf16, as torch rounds), norms kept float32 as llama.cpp does."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    qtype = getattr(gguf.GGMLQuantizationType, GGUF_TYPE[dtype])
    writer = gguf.GGUFWriter(str(dst) + ".part", arch=arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer adds these itself
        if name == "general.file_type":
            writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "float32" else gguf.LlamaFileType.MOSTLY_BF16)
            continue
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if data.ndim >= 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(tensor.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(str(dst) + ".part", dst)


def served_gguf(src: Path, dtype: str) -> Path:
    """The GGUF file to serve for `dtype`, written on first use."""
    if dtype == "q4_1":
        return src
    from minisgl.model_loader.gguf import cache_root

    dst = cache_root() / "llama-cpp" / f"{src.stem.split('.')[0]}.{GGUF_TYPE[dtype]}.gguf"
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(src, dst, dtype)
    return dst


def post(port: int, body: dict) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=3600) as resp:
        return json.loads(resp.read())


def completion(port: int, prompt: list[int], n: int) -> dict:
    """Greedy, exactly n tokens: llama-server takes a prompt of token ids as is (no BOS added)."""
    return post(
        port,
        {
            "prompt": prompt,
            "n_predict": n,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
            "return_tokens": True,
        },
    )


def wait_ready(proc: subprocess.Popen, port: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("llama-server did not become ready")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", required=True, help="the GGUF file the model came from")
    parser.add_argument("--dtype", required=True, choices=["float32", "bfloat16", "q4_1"])
    parser.add_argument("--server", required=True, help="the llama-server binary")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--workload", required=True, help="JSON of bench_offline's workload arguments")
    args = parser.parse_args()
    workload = make_workload(**json.loads(args.workload))
    model = served_gguf(Path(args.gguf), args.dtype)

    with socket.socket() as s:  # a free port on the loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    longest = max(len(p) + n for p, n in workload)
    cmd = [
        args.server,
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(len(workload)),
        "--cont-batching",
        "--ctx-size",
        str(len(workload) * (longest + 16)),
        "--threads",
        str(args.threads),
        "--threads-batch",
        str(args.threads),
        "--cache-type-k",
        KV_CACHE_TYPE[args.dtype],
        "--cache-type-v",
        KV_CACHE_TYPE[args.dtype],
        "--no-warmup",
        "--log-disable",
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(proc, port)
        completion(port, [1, 2, 3], 1)  # first token: startup ends here
        startup = time.perf_counter() - start
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(workload)) as pool:
            outs = list(pool.map(lambda req: completion(port, *req), workload))
        elapsed = time.perf_counter() - start
        tokens = sum(o["tokens_predicted"] for o in outs)
        assert tokens == sum(n for _, n in workload), (tokens, sum(n for _, n in workload))
        rss = peak_rss_mb(proc.pid)
    except Exception:
        proc.kill()
        print(proc.stderr.read()[-3000:] if proc.stderr else "", file=sys.stderr)
        raise
    proc.terminate()
    proc.wait(timeout=30)
    print(
        json.dumps(
            {
                "tok_s": tokens / elapsed,
                "seconds": elapsed,
                "startup_s": startup,
                "peak_rss_mb": rss,
                # llama-server's own per-request timings: the prompt's time (TTFT, less the HTTP) and
                # the decode rate after it, per stream, measured as bench_one_batch measures minisgl's
                "ttft_ms": statistics.mean(o["timings"]["prompt_ms"] for o in outs),
                "decode_tok_s": statistics.mean(o["timings"]["predicted_per_second"] for o in outs),
                "outputs": [o["tokens"] for o in outs],
            }
        )
    )


if __name__ == "__main__":
    main()
