"""Attention over the paged KV pool with minisgl's C++ CPU kernels: the CPU default.

Mirrors python/sglang/srt/layers/attention/intel_amx_backend.py (IntelAMXAttnBackend), the
backend SGLang picks on CPU (ServerArgs._handle_cpu_backends). The name is SGLang's: its
kernels use Intel AMX tiles where the CPU has them. minisgl's kernels
(minisgl/kernels/cpu/decode.cpp, extend.cpp) are plain C++ that the compiler vectorizes for
whatever CPU builds them, and run on any x86 or Arm machine with a C++ compiler.

Unlike torch_native, neither mode copies K/V out of the pool: the kernels read each request's
slots in place through ``req_to_token`` and parallelize over (request, KV head) pairs, so a
decode step costs one pass over the live KV, not a gather into a padded batch plus an SDPA.
As in SGLang, the kernels also store the new tokens' K/V in the pool (the other backends call
``set_kv_buffer`` first). SGLang's kernels also split long sequences across threads and use
AMX tiles; omitted.

An EAGLE tree's custom mask (speculative/eagle_utils.py) goes to the C++ extend kernel too, which
narrows its causal mask with it; sgl-kernel's CPU kernel takes no mask. MLA models (DeepSeek) run
through the inherited torch_native path:
the kernels keep one head's row in registers up to kMaxHeadDim = 256 values, and MLA's
absorbed key is kv_lora_rank + qk_rope_head_dim wide (576 on DeepSeek-V3), its value a
view into the same row; and the kernels store K and V rows of their own shape, where the
MLA pool stores one latent row. SGLang's CPU backend has dedicated MLA kernels; omitted.
"""

from __future__ import annotations

import torch

from minisgl.kernels.cpu import is_available
from minisgl.layers.attention.torch_native_backend import TorchNativeAttnBackend


class IntelAMXAttnBackend(TorchNativeAttnBackend):
    def __init__(self, model_runner) -> None:
        self.use_mla = model_runner.use_mla_backend
        if self.use_mla:  # see the module docstring
            super().__init__(model_runner)
            return
        if not is_available():
            raise RuntimeError(
                "attention_backend 'intel_amx' needs minisgl's CPU kernels, which could not be built here "
                "(see the warning above); use attention_backend='torch_native'"
            )
        head_dim = model_runner.model_config.head_dim
        if head_dim % 16 or head_dim > 256:
            # The kernels work on whole vectors of a head (attention.h: kMaxHeadDim, Vec::size()).
            raise ValueError(
                f"attention_backend 'intel_amx' needs a head_dim that is a multiple of 16 up to 256, "
                f"not {head_dim}; use attention_backend='torch_native'"
            )
        self.req_to_token = model_runner.req_to_token_pool.req_to_token

    def init_forward_metadata(self, forward_batch) -> None:
        """Nothing to precompute: the kernels take the batch's own index tensors."""
        if self.use_mla:
            super().init_forward_metadata(forward_batch)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        if self.use_mla:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        q, o, k_buf, v_buf, k, v = self._prepare(q, k, v, layer, forward_batch, save_kv_cache)
        torch.ops.minisgl_kernel.extend_attention_cpu(
            q,
            o,
            k_buf,
            v_buf,
            k,
            v,
            forward_batch.out_cache_loc,
            self.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            forward_batch.extend_seq_lens,
            forward_batch.extend_start_loc,
            layer.scaling,
            getattr(forward_batch.spec_info, "custom_mask", None),
        )
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True) -> torch.Tensor:
        if self.use_mla:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        q, o, k_buf, v_buf, k, v = self._prepare(q, k, v, layer, forward_batch, save_kv_cache)
        torch.ops.minisgl_kernel.decode_attention_cpu(
            q,
            o,
            k_buf,
            v_buf,
            k,
            v,
            forward_batch.out_cache_loc,
            self.req_to_token,
            forward_batch.req_pool_indices,
            forward_batch.seq_lens,
            layer.scaling,
        )
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    @staticmethod
    def _prepare(q, k, v, layer, forward_batch, save_kv_cache):
        """Shape q, k, v as [tokens, heads, head_dim], make the output, and fetch this layer's pool.

        The kernels always store the new tokens' K/V themselves; when the caller already saved
        them (save_kv_cache=False), they get what the pool holds and write it back unchanged (in
        the model's dtype, as the kernels take new K/V: widening a bfloat16 pool's rows is exact).
        """
        assert not layer.logit_cap, "the CPU kernels do not implement logit capping"
        k_buf, v_buf = forward_batch.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        if save_kv_cache:
            k = k.view(-1, layer.tp_k_head_num, layer.qk_head_dim)
            v = v.view(-1, layer.tp_v_head_num, layer.v_head_dim)
        else:
            k, v = k_buf[forward_batch.out_cache_loc].to(q.dtype), v_buf[forward_batch.out_cache_loc].to(q.dtype)
        q = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        return q, q.new_empty(q.shape[0], layer.tp_q_head_num, layer.v_head_dim), k_buf, v_buf, k, v
