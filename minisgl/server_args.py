"""ServerArgs: every knob of the engine, in one dataclass, with SGLang's flag names.

Mirrors python/sglang/srt/server_args.py (ServerArgs, add_cli_args, from_cli_args,
__post_init__ with its _handle_* normalizers). SGLang has ~400 fields; minisgl
keeps the ones its code reads, and validates them once here so the rest of
the engine can trust them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Optional

import torch

# --kv-cache-dtype's values (SGLang's names; "bf16" is normalized to "bfloat16"), and the KV pool's
# element type for each but "auto", the model's own (ModelRunner.load_model).
KV_CACHE_DTYPES = {"bfloat16": torch.bfloat16, "fp8_e5m2": torch.float8_e5m2, "fp8_e4m3": torch.float8_e4m3fn}
KV_CACHE_DTYPE_CHOICES = ("auto", *KV_CACHE_DTYPES)

# SGLang's other spellings of minisgl's flags (add_cli_args at 64bca53).
CLI_ALIASES = {
    "model_path": ("--model",),
    "tp_size": ("--tensor-parallel-size",),
    "pp_size": ("--pipeline-parallel-size",),
    "dist_init_addr": ("--nccl-init-addr",),
    "speculative_draft_model_path": ("--speculative-draft-model",),
}


def _parse_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


@dataclass
class ServerArgs:
    # Model and tokenizer
    model_path: str = "SmolLM2-135M-Instruct"
    tokenizer_path: Optional[str] = None
    revision: Optional[str] = None
    context_length: Optional[int] = None
    dtype: str = "auto"
    # A scheme of layers/quantization (SGLang's name, e.g. w8a8_int8); a quantized checkpoint's
    # config.json names its own, and this flag may then only repeat it.
    quantization: Optional[str] = None

    # Device and memory
    device: Optional[str] = None
    mem_fraction_static: Optional[float] = None
    max_total_tokens: Optional[int] = None
    page_size: int = 1
    # The KV pool's dtype, as SGLang spells it: "auto" (the model's) or "bf16"/"bfloat16", which halves
    # a float32 model's KV memory and the bytes decode attention reads per token. SGLang's fp8 and
    # fp4 pools need GPU kernels minisgl does not have, and are refused.
    kv_cache_dtype: str = "auto"

    # Scheduling
    max_running_requests: int = 256
    max_prefill_tokens: int = 16384
    chunked_prefill_size: Optional[int] = None
    enable_mixed_chunk: bool = False  # the running requests decode inside each prefill chunk's forward
    schedule_policy: str = "fcfs"
    disable_radix_cache: bool = False

    # Kernels and graphs
    attention_backend: Optional[str] = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 32

    # Overlap scheduling: None picks per device, overlap on a GPU (SGLang's default), the normal loop on
    # a CPU, where it measured faster (docs/chapters/scheduler.md says why). And the CPU graph runner:
    # torch.compile of decode per batch-size bucket up to torch_compile_max_bs
    disable_overlap_schedule: Optional[bool] = None
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32

    # Side outputs
    enable_return_hidden_states: bool = False
    enable_return_routed_experts: bool = False
    expert_distribution_recorder_mode: Optional[str] = None

    # Parallelism and speculation: pp_size pipeline stages of tp_size ranks each, pp_size x tp_size processes
    tp_size: int = 1
    pp_size: int = 1
    # Multi-node, with SGLang's meaning: nnodes machines each run pp_size * tp_size // nnodes ranks,
    # this one runs ranks [node_rank * that, (node_rank + 1) * that); rank 0 (on node 0)
    # listens on dist_init_addr (host:port). One node picks a free 127.0.0.1 port if unset.
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    # Speculative decoding (SGLang's flags). STANDALONE: a separate small draft model proposes
    # speculative_num_steps tokens one at a time; the target verifies them together with the
    # last token, speculative_num_draft_tokens (= steps + 1, a chain) positions per request.
    # EAGLE / EAGLE3: a draft head reading the target's hidden states drafts a tree, each step
    # keeping speculative_eagle_topk branches, of which the best speculative_num_draft_tokens - 1
    # are verified (a chain when topk is 1); speculative_token_map cuts an EAGLE head's LM head to
    # hot tokens; enable_multi_layer_eagle gives each draft step its own runner and KV.
    speculative_algorithm: Optional[str] = None
    speculative_draft_model_path: Optional[str] = None
    speculative_num_steps: Optional[int] = None
    speculative_eagle_topk: Optional[int] = None
    speculative_num_draft_tokens: Optional[int] = None
    speculative_token_map: Optional[str] = None
    enable_multi_layer_eagle: bool = False

    # HTTP server (launch_server): against clients that send too much, or too slowly
    max_request_bytes: int = 32 << 20  # a larger body is refused with 413
    http_read_timeout: float = 10.0  # seconds for a request's head, and between chunks of its body
    graceful_shutdown_timeout: float = 30.0  # on SIGTERM, how long requests in flight may finish
    # Reliability (http_guards.py, constrained/): a whole-body deadline beside the gap timeout; origins
    # admitted besides loopback ones when bound to loopback ("*": any); grammar compilation's limits.
    http_body_timeout: float = 60.0
    allowed_origins: Optional[str] = None
    grammar_compile_timeout: float = 30.0  # seconds a grammar may compile before its requests are aborted

    # Serving (SGLang's flags): stream only the new text and ids of each /generate chunk, instead of
    # everything so far; run client-supplied logit processors (they are code: off by default).
    stream_output: bool = False
    enable_custom_logit_processor: bool = False

    # Tool calls, grammars, embeddings (SGLang's flags): the detector that reads calls out of a reply under
    # tool_choice auto (function_call/); the constrained-decoding backend (minisgl has xgrammar only);
    # serve an embedding model (/v1/embeddings, Engine.encode) instead of generating.
    tool_call_parser: Optional[str] = None
    grammar_backend: str = "xgrammar"
    is_embedding: bool = False

    # Observability: a Prometheus /metrics route with SGLang's metric names (needs prometheus_client)
    enable_metrics: bool = False

    # Misc
    random_seed: int = 0
    skip_tokenizer_init: bool = False
    log_level: str = "warning"

    def __post_init__(self) -> None:
        self._handle_model_paths()
        self._handle_device()
        self._handle_attention_backend()
        self._handle_memory()
        self._handle_speculative_decoding()
        self._check()

    def _handle_model_paths(self) -> None:
        # Resolved here, before any ModelConfig: the default alias and .gguf files become an HF
        # folder (written once, then cached), so ModelConfig only ever reads config.json. A .gguf
        # file's folder says quant_method "gguf" (kept quantized, as SGLang); the alias is converted
        # to float32 unless --quantization gguf asks for its blocks.
        from minisgl.model_loader.gguf import resolve_model_path

        # As the user wrote it: /get_model_info reports it, as SGLang's does (not the cache folder).
        self.model_path_as_given = getattr(self, "model_path_as_given", self.model_path)
        self.model_path = resolve_model_path(self.model_path, self.quantization)
        if self.speculative_draft_model_path is not None:
            self.speculative_draft_model_path = resolve_model_path(self.speculative_draft_model_path)

    def _handle_device(self) -> None:
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.pp_size > 1 and self.disable_overlap_schedule is False:
            raise ValueError(
                "pp_size > 1 runs the pipeline loop (event_loop_pp); disable_overlap_schedule false cannot apply"
            )
        if self.disable_overlap_schedule is None:
            # On a CPU the forward's OpenMP threads and the scheduler's thread share the same cores.
            # A pipeline stage runs event_loop_pp, whose micro-batches are its overlap.
            self.disable_overlap_schedule = not self.device.startswith("cuda") or self.pp_size > 1

    def _handle_attention_backend(self) -> None:
        # The backend is a personality fixed here and in ModelRunner.init_attention_backend,
        # never re-decided during forward (claim C11).
        if self.attention_backend is None:
            # SGLang's _handle_cpu_backends picks intel_amx on CPU; minisgl does where its C++ kernels
            # can be built (they are built, once, when the model runner first needs them).
            if self.device.startswith("cuda"):
                self.attention_backend = "triton"
            else:
                from minisgl.kernels.cpu import can_build

                self.attention_backend = "intel_amx" if can_build() else "torch_native"
        from minisgl.layers.attention.attention_registry import ATTENTION_BACKENDS

        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"unknown attention_backend {self.attention_backend!r}; choose one of {tuple(ATTENTION_BACKENDS)}"
            )

    def _handle_memory(self) -> None:
        if self.mem_fraction_static is None:
            # On a CPU the "device memory" is the host's RAM, shared with everything else.
            self.mem_fraction_static = 0.88 if self.device.startswith("cuda") else 0.1
        if self.chunked_prefill_size is None and not self.device.startswith("cuda"):
            # A prefill's activations ([tokens, intermediate] per MLP) then stay a few tens of MB, so
            # GEMMs and elementwise kernels run from cache: 2,048-token chunks measured 1.4x faster
            # than one 8,500-token prefill on the offline benchmark (recorded in the history of
            # docs/performance.md: git log -p -- docs/performance.md).
            self.chunked_prefill_size = 2048
        if self.chunked_prefill_size == -1:
            self.chunked_prefill_size = None  # SGLang's "disabled": every prompt prefills in one piece
        if self.kv_cache_dtype == "bf16":
            self.kv_cache_dtype = "bfloat16"  # SGLang's alias

    def _handle_speculative_decoding(self) -> None:
        if self.speculative_algorithm is None:
            return
        if self.pp_size > 1:
            raise ValueError(
                "speculative_algorithm is not supported with pp_size > 1 (minisgl's pipeline has no draft stage)"
            )
        algorithm = self.speculative_algorithm.upper()
        if algorithm not in ("STANDALONE", "EAGLE", "EAGLE3"):
            raise ValueError(
                f"speculative_algorithm must be STANDALONE, EAGLE or EAGLE3, got {self.speculative_algorithm!r}"
            )
        self.speculative_algorithm = algorithm
        if self.speculative_draft_model_path is None:
            raise ValueError(f"speculative_algorithm {algorithm} needs speculative_draft_model_path")
        if algorithm == "STANDALONE":
            self._handle_standalone()
        else:
            self._handle_eagle()
        if self.page_size != 1:
            raise ValueError("speculative decoding needs page_size 1: rejected drafts free single slots")
        if self.enable_return_routed_experts or self.expert_distribution_recorder_mode:
            raise ValueError("speculative decoding does not record experts: the draft would replace the target's hooks")

    def _handle_standalone(self) -> None:
        if self.speculative_eagle_topk not in (None, 1) or self.speculative_token_map or self.enable_multi_layer_eagle:
            raise ValueError(
                "speculative_eagle_topk, speculative_token_map and enable_multi_layer_eagle are EAGLE's; "
                "STANDALONE drafts a chain with a whole model"
            )
        if self.speculative_num_steps is None:
            draft_tokens = self.speculative_num_draft_tokens
            self.speculative_num_steps = 3 if draft_tokens is None else draft_tokens - 1
        self.speculative_eagle_topk = 1
        self._check_chain("minisgl's STANDALONE drafts a chain, not a tree")

    def _handle_eagle(self) -> None:
        if self.speculative_num_steps is None and self.speculative_eagle_topk is None:
            # SGLang's auto_choose_speculative_params: a tree for Llama targets, a chain otherwise.
            with open(os.path.join(self.model_path, "config.json")) as f:
                arch = (json.load(f).get("architectures") or [""])[0]
            steps, topk, draft_tokens = (5, 4, 8) if arch == "LlamaForCausalLM" else (3, 1, 4)
            self.speculative_num_steps, self.speculative_eagle_topk = steps, topk
            self.speculative_num_draft_tokens = self.speculative_num_draft_tokens or draft_tokens
        if self.speculative_num_steps is None:
            self.speculative_num_steps = 3
        if self.speculative_eagle_topk is None:
            self.speculative_eagle_topk = 1
        steps, topk = self.speculative_num_steps, self.speculative_eagle_topk
        if steps < 1 or topk < 1:
            raise ValueError(f"speculative_num_steps and speculative_eagle_topk must be >= 1, got {steps} and {topk}")
        if self.enable_multi_layer_eagle and topk != 1:
            raise ValueError("enable_multi_layer_eagle drafts a chain, one token per runner: speculative_eagle_topk 1")
        if topk == 1:
            self._check_chain("speculative_eagle_topk 1 drafts a chain")
        else:
            # t0, then candidates: topk at the first step, topk * topk at each later one.
            most = 1 + topk + (steps - 1) * topk * topk
            self.speculative_num_draft_tokens = self.speculative_num_draft_tokens or min(most, 8)
            if not 2 <= self.speculative_num_draft_tokens <= most:
                raise ValueError(
                    f"speculative_num_draft_tokens must be in [2, {most}] for {steps} steps of top-{topk}, "
                    f"got {self.speculative_num_draft_tokens}"
                )
            if self.attention_backend == "triton":
                raise ValueError(
                    "speculative_eagle_topk > 1 verifies a tree with a custom attention mask, which the "
                    "triton backend lacks; use attention_backend torch_native or intel_amx"
                )
        if self.speculative_token_map is not None and self.speculative_algorithm == "EAGLE3":
            raise ValueError("speculative_token_map is EAGLE's; an EAGLE3 head carries its own map (d2t)")
        if self.speculative_token_map is not None and self.tp_size > 1:
            raise ValueError("speculative_token_map needs tp_size 1: the cut LM head is not sharded")

    def _check_chain(self, why: str) -> None:
        if self.speculative_num_steps < 1:
            raise ValueError("speculative_num_steps must be >= 1")
        # SGLang's rule for a chain (topk 1): one draft token per step, plus the last verified token.
        if self.speculative_num_draft_tokens not in (None, self.speculative_num_steps + 1):
            raise ValueError(
                f"speculative_num_draft_tokens must be speculative_num_steps + 1 = {self.speculative_num_steps + 1} "
                f"({why})"
            )
        self.speculative_num_draft_tokens = self.speculative_num_steps + 1

    def speculative_num_slots_per_round(self) -> int:
        """KV slots a decode round takes per request: the verified nodes, or the draft tree's
        lanes if more (eagle_worker.py); 1 without speculation."""
        if self.speculative_algorithm is None:
            return 1
        lanes = (self.speculative_num_steps - 1) * self.speculative_eagle_topk
        return max(self.speculative_num_draft_tokens, lanes)

    def _check(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size:
            raise ValueError(f"max_total_tokens must be >= page_size, got {self.max_total_tokens}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size < self.page_size:
            raise ValueError("chunked_prefill_size must be >= page_size")
        if self.kv_cache_dtype not in KV_CACHE_DTYPE_CHOICES:
            raise ValueError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported: minisgl's KV pool holds the model's "
                "dtype ('auto'), 'bf16'/'bfloat16', 'fp8_e5m2' or 'fp8_e4m3'; SGLang's fp4_e2m1 is not implemented"
            )
        if self.kv_cache_dtype.startswith("fp8") and self.attention_backend == "triton":
            raise ValueError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} needs attention_backend 'intel_amx' or 'torch_native': "
                "minisgl's Triton kernels read 16- and 32-bit pools only"
            )
        if self.enable_torch_compile and (self.device != "cpu" or self.attention_backend != "intel_amx"):
            raise ValueError(
                "enable_torch_compile needs device 'cpu' and attention_backend 'intel_amx' (CPUGraphRunner)"
            )
        if self.torch_compile_max_bs < 1:
            raise ValueError("torch_compile_max_bs must be >= 1")
        if self.enable_torch_compile and (self.enable_return_routed_experts or self.expert_distribution_recorder_mode):
            raise ValueError(
                "enable_torch_compile with enable_return_routed_experts or expert_distribution_recorder_mode: "
                "their hooks run Python on every forward, which a compiled forward would skip"
            )
        for name in ("max_request_bytes", "http_read_timeout", "http_body_timeout", "grammar_compile_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.graceful_shutdown_timeout < 0:
            raise ValueError(f"graceful_shutdown_timeout must be >= 0, got {self.graceful_shutdown_timeout}")
        if self.schedule_policy not in ("fcfs", "lpm"):
            raise ValueError(f"schedule_policy must be 'fcfs' or 'lpm', got {self.schedule_policy!r}")
        if self.tp_size < 1:
            raise ValueError("tp_size must be >= 1")
        if self.pp_size < 1:
            raise ValueError("pp_size must be >= 1")
        no_mixing = self.chunked_prefill_size is None or self.pp_size > 1 or self.speculative_algorithm
        if self.enable_mixed_chunk and no_mixing:
            raise ValueError("enable_mixed_chunk needs chunked prefill; minisgl mixes with no pp_size or speculation")
        if self.pp_size > 1 and self.enable_torch_compile:
            raise ValueError(
                "enable_torch_compile is not supported with pp_size > 1: a stage's graph would return logits"
            )
        if self.nnodes < 1 or (self.tp_size * self.pp_size) % self.nnodes != 0:
            raise ValueError(
                f"pp_size x tp_size ({self.pp_size * self.tp_size}) must be a multiple of nnodes ({self.nnodes})"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, nnodes), got {self.node_rank}")
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise ValueError("nnodes > 1 needs dist_init_addr, the host:port of node 0")
        self._check_tools_grammar_embedding()

    def _check_tools_grammar_embedding(self) -> None:
        from minisgl.function_call.function_call_parser import TOOL_CALL_PARSERS

        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            choices = sorted(TOOL_CALL_PARSERS)
            raise ValueError(
                f"tool_call_parser {self.tool_call_parser!r} is not one minisgl has; choose one of {choices}"
            )
        if self.is_embedding:
            # Embeddings pool the hidden states a generation captures (managers/embedding.py).
            self.enable_return_hidden_states = True
        if self.grammar_backend != "xgrammar":
            raise ValueError(
                f"grammar_backend {self.grammar_backend!r} is not available: minisgl implements only xgrammar "
                "(SGLang also has outlines, llguidance and none)"
            )

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for field in dataclasses.fields(ServerArgs):
            flags = ["--" + field.name.replace("_", "-"), *CLI_ALIASES.get(field.name, ())]
            if field.type in ("bool", bool):
                parser.add_argument(*flags, dest=field.name, action="store_true", default=field.default)
                continue
            if field.type == "Optional[bool]":  # the flag alone means True; "false" overrides a default
                parser.add_argument(*flags, dest=field.name, nargs="?", const=True, default=None, type=_parse_bool)
                continue
            base = str(field.type).replace("Optional[", "").rstrip("]")
            kind = {"int": int, "float": float}.get(base, str)
            parser.add_argument(*flags, dest=field.name, type=kind, default=field.default)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: getattr(args, n) for n in names})
