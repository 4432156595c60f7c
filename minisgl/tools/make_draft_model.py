"""Make a draft model for speculative decoding: the target itself, cut to its first layers.

    python -m minisgl.tools.make_draft_model --model-path DIR --num-layers 8 --out DRAFT_DIR

The copy keeps the embedding, the first ``num_layers`` decoder layers, the final norm
and the LM head, so it shares the target's tokenizer and vocabulary and reads the
residual stream where the target would go on. It is cheap to run and needs no training,
which makes it the draft of the speculative benchmark; a trained small model of the same
family would accept more.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from minisgl.model_loader.gguf import resolve_model_path

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def make_truncated_model(model_path: str, out_dir, num_layers: int) -> Path:
    src, out = Path(resolve_model_path(model_path)), Path(out_dir)
    config = json.loads((src / "config.json").read_text())
    total = config["num_hidden_layers"]
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in [1, {total}], got {num_layers}")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, out / f.name)
    # Per-layer config lists (layer_types, ...) keep their first num_layers entries.
    for key, value in config.items():
        if isinstance(value, list) and len(value) == total:
            config[key] = value[:num_layers]
    if "mlp_only_layers" in config:
        config["mlp_only_layers"] = [i for i in config["mlp_only_layers"] if i < num_layers]
    config["num_hidden_layers"] = num_layers
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, tensor in load_file(f).items():
            layer = _LAYER.search(name)
            if layer is None or int(layer.group(1)) < num_layers:
                tensors[name] = tensor
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--num-layers", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    print(make_truncated_model(args.model_path, args.out, args.num_layers))


if __name__ == "__main__":
    main()
