"""Linear layers that know how to shard and load their own weights.

Mirrors python/sglang/srt/layers/linear.py (ColumnParallelLinear,
MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear). Each
parameter carries a ``weight_loader`` so the model loader never needs
per-model code: it hands a checkpoint tensor (and, for fused layers, which
shard it is) to the parameter, which slices out this rank's part. Which parameters
a layer has, and how it multiplies by them, is its ``quant_method``'s business
(layers/quantization/: UnquantizedLinearMethod for float weights, W8A8Int8LinearMethod, ...),
chosen by the model's QuantizationConfig, as in SGLang.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from minisgl.kernels.cpu import has_packed_gemm, packed_gemm_block_n
from minisgl.kernels.cpu.features import last_level_cache_bytes, vnni_gemm_engine
from minisgl.layers.quantization.base_config import FROM_LOADER, resolve_quant_config

# A constant for dynamo to read when traced: it refuses to call torch.backends.mkldnn.is_available.
_HAS_ONEDNN = torch.backends.mkldnn.is_available()


def apply_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T + b, on the fastest dense path of the device, for a weight as pack_linear_weight left it.

    SGLang's UnquantizedLinearMethod.apply likewise takes a CPU-specific kernel when it can
    (python/sglang/srt/layers/quantization/unquant.py:142). On CPU that is minisgl's own
    weight_packed_linear for a packed weight (3-D panels, or 4-D VNNI for the matrix engines),
    else oneDNN's linear: F.linear goes through MKL's sgemm, which measured about half of
    oneDNN's rate on these machines. A plain weight in a dtype oneDNN cannot multiply on this CPU
    (a bf16 MoE router on an AVX2 CPU: no layer packs it) goes to F.linear, ATen's own bf16 GEMM.
    """
    if weight.dim() in (3, 4):  # panels from convert_weight_packed(_vnni) (minisgl/kernels/cpu/gemm*.cpp)
        if x.dim() == 2:  # the models' [tokens, hidden]: a reshape and a view cost ~3 us a linear at batch 1
            return torch.ops.minisgl_kernel.weight_packed_linear(x, weight, bias)
        y = torch.ops.minisgl_kernel.weight_packed_linear(x.reshape(-1, x.shape[-1]), weight, bias)
        return y.view(*x.shape[:-1], y.shape[-1])
    if weight.is_mkldnn or (x.is_cpu and _HAS_ONEDNN and weight.dtype in _ONEDNN_DTYPES):
        x2d = x.reshape(-1, x.shape[-1])
        if weight.dtype != x.dtype:  # a float32 copy of a 16-bit weight oneDNN cannot multiply here
            y = _onednn_linear(x2d.to(weight.dtype), weight, None if bias is None else bias.to(weight.dtype))
            y = y.to(x.dtype)
        else:
            y = _onednn_linear(x2d, weight, bias)
        return y.view(*x.shape[:-1], y.shape[-1])
    return F.linear(x, weight, bias)


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # Traced by torch.compile (CPUGraphRunner), the call goes through an op of minisgl's own that
    # inductor calls as it is: inductor's lowering of mkldnn._linear_pointwise fails on a weight
    # already in oneDNN's blocked layout (an MoE router, too narrow for a packed panel, has one).
    if torch.compiler.is_compiling():
        return onednn_linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@torch.library.custom_op("minisgl::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@onednn_linear.register_fake
def _(x, weight, bias):
    return x.new_empty(x.shape[0], weight.shape[0])


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight in the layout apply_linear runs fastest with; elsewhere than CPU, the weight as is.

    Mirrors SGLang's _amx_process_weight_after_loading (layers/amx_utils.py), which repacks CPU
    weights once after loading for its own GEMM kernel. On CPU, in the weight's own dtype:

    - for a bf16 (fp16) weight on a CPU with AVX512-BF16 or AMX (AMX-FP16), SGLang's own VNNI layout
      [N / 32, K / 2, 32, 2], which those matrix engines multiply (kernels/cpu/gemm_vnni.cpp);
    - else panels [N / B, K, B] for minisgl's weight_packed_linear (B = 32 with AVX-512, 16 with
      AVX2; N must be a multiple of B), unless oneDNN measures faster on this CPU in this dtype
      (:func:`_onednn_is_faster`);
    - else oneDNN's blocked layout, which oneDNN would otherwise re-derive on every call (packed
      once, decode-sized GEMMs measured 25-35% faster). Where oneDNN cannot multiply a 16-bit
      dtype (bf16 needs AVX-512), that one layer keeps a float32 copy.

    A bf16 or fp16 weight therefore stays 16-bit, and a 16-bit model takes half the memory of a
    float32 one. The result is only for apply_linear to read.
    """
    if not weight.is_cpu:
        return weight
    weight = weight.detach()
    n, k = weight.shape
    if has_packed_gemm() and vnni_gemm_engine(weight.dtype) and n % 32 == 0 and k % 2 == 0:
        return torch.ops.minisgl_kernel.convert_weight_packed_vnni(weight)
    if has_packed_gemm() and weight.shape[0] % packed_gemm_block_n() == 0 and not _onednn_is_faster(weight.dtype):
        return torch.ops.minisgl_kernel.convert_weight_packed(weight)
    if not _HAS_ONEDNN:
        return weight
    # The hint is the batch size oneDNN tunes the layout for; any batch size works.
    return torch.ops.mkldnn._reorder_linear_weight(weight if weight.dtype in _ONEDNN_DTYPES else weight.float(), 64)


def weight_rows(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """weight[ids] of an [N, K] weight as pack_linear_weight left it: plain, or minisgl's panels.

    What a tied embedding looks its tokens up with once its LM head has packed the shared weight
    (ParallelLMHead), so the model holds the vocabulary matrix once. oneDNN's blocked layout is
    opaque, so a head packed that way keeps its plain weight beside it.
    """
    if weight.dim() == 2:
        return F.embedding(ids, weight)
    rows = torch.ops.minisgl_kernel.packed_weight_rows(weight, ids.reshape(-1).long())
    return rows.view(*ids.shape, rows.shape[-1])


# The dtypes oneDNN multiplies natively on this CPU (its bf16 and fp16 kernels need AVX-512): a constant,
# as _HAS_ONEDNN, so that apply_linear can read it inside a compiled forward.
_ONEDNN_DTYPES = frozenset(
    [torch.float32]
    + ([torch.bfloat16] if torch.ops.mkldnn._is_mkldnn_bf16_supported() else [])
    + ([torch.float16] if torch.ops.mkldnn._is_mkldnn_fp16_supported() else [])
)


@functools.cache
def _onednn_is_faster(dtype: torch.dtype) -> bool:
    """Whether oneDNN runs this dtype's GEMMs clearly (10%) faster than minisgl's, at 1 row and at 64.

    Decided by timing both (a few hundred ms, once per process and dtype), since it depends on the
    CPU: AMX, for one, makes oneDNN's bf16 the faster. A layout serves every batch size, so oneDNN
    must win at both ends: one row (a stream of the weights) and 64 (arithmetic). The weights are
    distinct and together twice the last-level cache, multiplied in turn, so each comes from
    memory as in a forward. With one weight timed again and again, as this probe first did, the
    weight sat in cache: on an AVX-512 EPYC that timing chose oneDNN's float32 in some processes
    and not in others, though over SmolLM2's weights streamed oneDNN took 1.6x minisgl's time at
    one row and 1.14x at 64.
    """
    if not (_HAS_ONEDNN and dtype in _ONEDNN_DTYPES):
        return False
    if not has_packed_gemm():
        return True
    w = torch.randn(2048, 1024).to(dtype)
    # At most 128 MiB a layout: both are held at once, beside the model being packed.
    count = max(2, min(2 * last_level_cache_bytes(), 128 << 20) // (w.numel() * w.element_size()))
    ours = [torch.ops.minisgl_kernel.convert_weight_packed(w) for _ in range(count)]
    theirs = [torch.ops.mkldnn._reorder_linear_weight(w, 64) for _ in range(count)]

    def elapsed(x: torch.Tensor, weights: list[torch.Tensor]) -> float:  # apply_linear reads either layout
        start = time.perf_counter()
        for weight in weights:
            apply_linear(x, weight)
        return time.perf_counter() - start

    for rows in (1, 64):
        x = torch.randn(rows, 1024).to(dtype)
        best_ours, best_theirs = float("inf"), float("inf")
        for _ in range(3):  # alternating, so that both see the same machine (another process may take the cores)
            best_ours = min(best_ours, elapsed(x, ours))
            best_theirs = min(best_theirs, elapsed(x, theirs))
        if best_theirs >= 0.9 * best_ours:
            return False
    return True


class LinearBase(nn.Module):
    """A linear layer whose weights and forward come from ``quant_method`` (SGLang's LinearBase).

    ``quant_config`` defaults to the one the model loader builds with (FROM_LOADER); None keeps
    the layer in float whatever the model's scheme (an MoE router, as SGLang's models do)."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool, quant_config=FROM_LOADER, output_sizes=None
    ) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.input_size_per_partition, self.output_partition_sizes = input_size, output_sizes or [output_size]
        quant_config = resolve_quant_config(quant_config)
        quant_method = quant_config.get_quant_method(self) if quant_config is not None else None
        if quant_method is None:
            # Imported here: unquant.py reads apply_linear and pack_linear_weight from this module.
            from minisgl.layers.quantization.unquant import UnquantizedLinearMethod

            quant_method = UnquantizedLinearMethod()
        self.set_quant_method(quant_method)
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def set_quant_method(self, quant_method) -> None:
        """Take `quant_method` and the weights it creates, dropping those of the method before: once
        at construction, and again, before any weight is read, for a layer the checkpoint keeps in
        float by name (the loader's ignore-list pass; base_config.QuantizationConfig.is_layer_skipped)."""
        for name in getattr(self, "_quant_params", ()):
            delattr(self, name)
        before = set(self._parameters)
        self.quant_method = quant_method
        quant_method.create_weights(
            self,
            self.input_size_per_partition,
            self.output_partition_sizes,
            torch.get_default_dtype(),
            weight_loader=self.weight_loader,
        )
        self._quant_params = set(self._parameters) - before

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        param.data.copy_(loaded_weight)

    def process_weights_after_loading(self) -> None:
        """Called once by the loader when every shard is in."""
        self.quant_method.process_weights_after_loading(self)


class ReplicatedLinear(LinearBase):
    """Every rank holds the whole weight (routers, small projections)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, quant_config=FROM_LOADER) -> None:
        super().__init__(input_size, output_size, bias, quant_config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ColumnParallelLinear(LinearBase):
    """Y = X A with A split by columns (output features) across ranks."""

    def __init__(
        self, input_size: int, output_size: int, bias: bool = False, gather_output: bool = False, output_sizes=None
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        assert output_size % tp_size == 0, f"output_size {output_size} not divisible by tp_size {tp_size}"
        local_sizes = [size // tp_size for size in output_sizes] if output_sizes else None
        super().__init__(input_size, output_size // tp_size, bias, output_sizes=local_sizes)
        self.gather_output = gather_output

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        shard = param.data.size(0)
        param.data.copy_(loaded_weight.narrow(0, self.tp_rank * shard, shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x, self.bias)
        return tensor_model_parallel_all_gather(y) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul, e.g. gate_proj and up_proj."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias, output_sizes=output_sizes)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id: int) -> None:
        shard_size = self.output_sizes[loaded_shard_id] // self.tp_size
        shard_offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
        local = loaded_weight.narrow(0, self.tp_rank * shard_size, shard_size)
        param.data.narrow(0, shard_offset, shard_size).copy_(local)


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections fused; heads split across ranks, KV heads replicated if too few."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = False,
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.head_size = head_size
        self.num_heads = total_num_heads // tp_size
        # With more ranks than KV heads each rank keeps one KV head, replicated.
        self.num_kv_heads = max(1, total_num_kv_heads // tp_size)
        self.num_kv_head_replicas = max(1, tp_size // total_num_kv_heads)
        sizes = [self.num_heads * head_size, self.num_kv_heads * head_size, self.num_kv_heads * head_size]
        super().__init__(hidden_size, sum(sizes) * tp_size, bias, output_sizes=[size * tp_size for size in sizes])

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id: str) -> None:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        if loaded_shard_id == "q":
            shard_offset, shard_size, shard_rank = 0, q_size, self.tp_rank
        else:
            shard_offset = q_size if loaded_shard_id == "k" else q_size + kv_size
            shard_size, shard_rank = kv_size, self.tp_rank // self.num_kv_head_replicas
        local = loaded_weight.narrow(0, shard_rank * shard_size, shard_size)
        param.data.narrow(0, shard_offset, shard_size).copy_(local)


class RowParallelLinear(LinearBase):
    """Y = X A with A split by rows (input features); partial sums are all-reduced."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        assert input_size % tp_size == 0, f"input_size {input_size} not divisible by tp_size {tp_size}"
        super().__init__(input_size // tp_size, output_size, bias)
        self.reduce_results = reduce_results

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        # The bias (added once, after the reduction) and per-output-row scales are not split.
        if param.dim() == 1 or loaded_weight.shape[1] == param.shape[1]:
            param.data.copy_(loaded_weight)
            return
        shard = param.data.size(1)
        param.data.copy_(loaded_weight.narrow(1, self.tp_rank * shard, shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x)
        if self.reduce_results:
            y = tensor_model_parallel_all_reduce(y)
        return y + self.bias if self.bias is not None else y
