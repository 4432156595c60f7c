"""ModelConfig: the model's personality, normalized before any model class is chosen.

Mirrors python/sglang/srt/configs/model_config.py (ModelConfig.__init__,
from_server_args, _derive_context_length, _derive_model_shapes, _get_and_verify_dtype,
_verify_quantization). SGLang also handles multimodal processors, NSA/hybrid
(SWA, Mamba) shapes and remote model pulls; minisgl serves dense and MoE
decoder-only text models, with MHA/GQA or DeepSeek's MLA, so those branches
are omitted.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Optional

import torch
from transformers import AutoConfig, PretrainedConfig

from minisgl import tracing

if TYPE_CHECKING:
    from minisgl.server_args import ServerArgs

_STR_TO_DTYPE = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}

# Architectures whose attention is DeepSeek's multi-head latent attention (SGLang lists more).
_MLA_ARCHITECTURES = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}


class AttentionArch(enum.Enum):
    MHA = enum.auto()  # K and V per KV head (MHA, GQA, MQA)
    MLA = enum.auto()  # one latent + one rope key per token, expanded per head (DeepSeek-V2/V3)


class ModelConfig:
    """Everything the runtime needs to know about a checkpoint, read once from config.json."""

    def __init__(
        self,
        model_path: str,
        revision: Optional[str] = None,
        context_length: Optional[int] = None,
        dtype: str = "auto",
        device: str = "cpu",
        is_draft_model: bool = False,
        quantization: Optional[str] = None,
    ) -> None:
        self.model_path = model_path  # an HF folder: ServerArgs has resolved aliases and GGUF files
        self.revision = revision
        self.is_draft_model = is_draft_model
        self.hf_config: PretrainedConfig = AutoConfig.from_pretrained(self.model_path, revision=revision)
        self.architectures: list[str] = list(self.hf_config.architectures or [])
        if not self.architectures:
            raise ValueError(f"{self.model_path}/config.json names no 'architectures'")

        # EAGLE draft heads (LlamaForCausalLMEagle, ...Eagle3) generate too.
        self.is_generation = any(
            a.endswith(("ForCausalLM", "ForCausalLMEagle", "ForCausalLMEagle3")) for a in self.architectures
        )
        # minisgl has no vision/audio towers; a multimodal config is recognized only to refuse it.
        self.is_multimodal = hasattr(self.hf_config, "vision_config") or hasattr(self.hf_config, "audio_config")
        self.dtype = _get_and_verify_dtype(self.hf_config, dtype, device)
        self._derive_context_length(context_length)
        self._derive_model_shapes()
        self.hf_eos_token_id = self._get_hf_eos_token_id()
        self.quantization = quantization
        self._verify_quantization()

    @staticmethod
    @tracing.traced(attrs=lambda server_args, model_path=None, is_draft_model=False: {"is_draft_model": is_draft_model})
    def from_server_args(
        server_args: "ServerArgs", model_path: Optional[str] = None, is_draft_model: bool = False
    ) -> "ModelConfig":
        return ModelConfig(
            model_path=model_path or server_args.model_path,
            revision=server_args.revision,
            context_length=server_args.context_length,
            dtype=server_args.dtype,
            device=server_args.device,
            is_draft_model=is_draft_model,
            # A draft model runs as its checkpoint says (SGLang has a separate draft flag).
            quantization=None if is_draft_model else server_args.quantization,
        )

    def _derive_context_length(self, context_length: Optional[int]) -> None:
        derived = getattr(self.hf_config, "max_position_embeddings", None) or 2048
        if context_length is not None and context_length > derived:
            raise ValueError(f"context_length={context_length} exceeds the model's max_position_embeddings={derived}")
        self.context_len: int = context_length or derived

    def _derive_model_shapes(self) -> None:
        c = self.hf_config
        self.hidden_size: int = c.hidden_size
        self.num_hidden_layers: int = c.num_hidden_layers
        self.vocab_size: int = c.vocab_size
        self.num_attention_heads: int = c.num_attention_heads
        self.num_key_value_heads: int = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        # Qwen3 decouples head_dim from hidden_size / num_heads.
        self.head_dim: int = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        # Qwen3-MoE says num_experts, Mixtral num_local_experts.
        self.num_experts: int = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None) or 0
        self.num_experts_per_tok: int = getattr(c, "num_experts_per_tok", 0) if self.num_experts else 0
        self.is_moe = self.num_experts > 0
        # transformers 5 keeps rope_theta inside rope_parameters (and serves rope_scaling from
        # there); 4.x configs have top-level rope_theta. Models read config.rope_theta.
        if getattr(c, "rope_theta", None) is None:
            c.rope_theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        self.attention_arch = AttentionArch.MLA if _MLA_ARCHITECTURES & set(self.architectures) else AttentionArch.MHA
        if self.attention_arch == AttentionArch.MLA:
            # As SGLang: the KV pool stores kv_lora_rank + qk_rope_head_dim values per token and
            # layer; head_dim is the query/key width of one head (its config says the rope part).
            self.kv_lora_rank: int = c.kv_lora_rank
            self.qk_rope_head_dim: int = c.qk_rope_head_dim
            self.qk_nope_head_dim: int = c.qk_nope_head_dim
            self.v_head_dim: int = c.v_head_dim
            self.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim

    def _parse_quant_hf_config(self) -> Optional[dict]:
        """The checkpoint's quantization_config from config.json, as a dict, or None."""
        quant_cfg = getattr(self.hf_config, "quantization_config", None)
        if quant_cfg is not None and not isinstance(quant_cfg, dict):
            quant_cfg = quant_cfg.to_dict()
        return quant_cfg

    def _verify_quantization(self) -> None:
        """Settle self.quantization from --quantization and the checkpoint's quant_method.

        As SGLang: the checkpoint's scheme wins when no flag is given, and a flag naming another
        scheme is an error. SGLang also refuses an unknown scheme here; in minisgl configs/ may not
        import layers/ (tests/test_c1_c10_layering.py), so the loader does that
        (model_loader/loader.py::get_quant_config), before any weight is read.
        self.quant_hf_config keeps the checkpoint's dict for the QuantizationConfig."""
        self.quant_hf_config = self._parse_quant_hf_config()
        if self.quantization is not None:
            self.quantization = self.quantization.lower()
        if self.quant_hf_config is not None:
            quant_method = str(self.quant_hf_config.get("quant_method", self.quantization or "")).lower()
            if self.quantization is None:
                self.quantization = quant_method
            elif self.quantization != quant_method:
                raise ValueError(
                    f"quantization={self.quantization!r} does not match quantization_config.quant_method="
                    f"{quant_method!r} in {self.model_path}/config.json"
                )

    def _get_hf_eos_token_id(self) -> set[int]:
        eos = self.hf_config.eos_token_id
        if eos is None:
            return set()
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def get_num_kv_heads(self, tp_size: int) -> int:
        # With more ranks than KV heads, heads are replicated (SGLang does the same).
        return max(1, self.num_key_value_heads // tp_size)

    def verify_tp_size(self, tp_size: int) -> None:
        """Refuse a TP size that does not split this model evenly, naming the dimension.

        Query heads are split, never replicated; KV heads are split, or replicated when
        there are fewer of them than ranks (tp_size a multiple of the KV heads)."""
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        fits = [t for t in range(1, heads + 1) if heads % t == 0 and (kv_heads % t == 0 or t % kv_heads == 0)]
        if heads % tp_size != 0:
            raise ValueError(
                f"tp_size={tp_size} does not divide the {heads} attention heads of {self.model_path}; "
                f"tensor parallelism splits heads across ranks (tp sizes that fit: {fits})"
            )
        if kv_heads % tp_size != 0 and tp_size % kv_heads != 0:
            raise ValueError(
                f"tp_size={tp_size} neither divides nor is a multiple of the {kv_heads} KV heads of "
                f"{self.model_path} (tp sizes that fit: {fits})"
            )
        for name in ("intermediate_size", "moe_intermediate_size"):
            size = getattr(self.hf_config, name, None)
            if size is not None and size % tp_size != 0:
                raise ValueError(f"tp_size={tp_size} does not divide {name}={size} of {self.model_path}")


def _get_and_verify_dtype(hf_config: PretrainedConfig, dtype: str, device: str) -> torch.dtype:
    if dtype != "auto":
        if dtype not in _STR_TO_DTYPE:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_STR_TO_DTYPE)} or 'auto'")
        return _STR_TO_DTYPE[dtype]
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = _STR_TO_DTYPE.get(config_dtype, torch.float32)
    config_dtype = config_dtype or torch.float32
    # SGLang serves a float32 checkpoint in float16 under "auto" on any device (bfloat16 only for
    # Gemma). minisgl picks bfloat16 on a GPU, whose exponent range is float32's, so activations
    # that fit in float32 cannot overflow; a CPU keeps float32.
    if config_dtype == torch.float32 and device.startswith("cuda"):
        return torch.bfloat16
    return config_dtype
