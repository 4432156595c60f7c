"""GraphRunner: what ModelRunner asks of a decode-graph runner, on any device.

SGLang's CudaGraphRunner and CPUGraphRunner (model_executor/cuda_graph_runner.py,
cpu_graph_runner.py) share one informal interface, which ModelRunner relies on:
``capture()`` prepares the graphs, ``can_run(batch)`` says whether a batch may use
one, ``replay(batch)`` runs it. minisgl writes that interface down once here, with
the part both runners share: static input buffers, padded up to a captured batch
size, and a ForwardBatch view of them. Padding rows read and write only the pool's
dummy slot 0.

As in SGLang's CudaGraphRunner, a speculating target (EAGLE, EAGLE3, STANDALONE) captures
its verify instead of decode (``capture_forward_mode`` TARGET_VERIFY, ``num_tokens_per_bs``
the draft tokens): a speculative round never runs a plain decode of the target. A verify
graph also returns every row's hidden state, which EAGLE's draft extend reads, and a tree's
mask goes in a static buffer sized for the longest rows, of which the kernel reads each
round's part (SGLang's triton backend keeps ``cuda_graph_custom_mask`` the same way).
"""

from __future__ import annotations

import abc
import bisect
import types
from typing import TYPE_CHECKING

import torch

from minisgl.layers.logits_processor import LogitsProcessorOutput
from minisgl.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from minisgl.model_executor.model_runner import ModelRunner


def get_batch_sizes_to_capture(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_bs + 1, 8))
    return sorted({bs for bs in sizes if bs <= max_bs} | {max_bs})


class GraphRunner(abc.ABC):
    """Static buffers for the largest captured batch; subclasses capture and replay."""

    def __init__(
        self, model_runner: "ModelRunner", max_bs: int, num_tokens_per_bs: int = 1, tree_mask: bool = False
    ) -> None:
        """num_tokens_per_bs > 1 captures a target's verify of that many tokens a request, with
        a custom mask if tree_mask (an EAGLE tree; a chain's mask is the causal one)."""
        self.model_runner = model_runner
        self.device = model_runner.device
        self.capture_bs = get_batch_sizes_to_capture(min(max_bs, model_runner.req_to_token_pool.size))
        self.max_bs = self.capture_bs[-1]
        self.num_tokens_per_bs = n = num_tokens_per_bs
        self.capture_forward_mode = ForwardMode.DECODE if n == 1 else ForwardMode.TARGET_VERIFY
        tokens = self.max_bs * n
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.full((self.max_bs,), n, dtype=torch.int64, device=self.device)
        self.out_cache_loc = torch.zeros(tokens, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=self.device)
        self.extend_seq_lens = self.extend_start_loc = self.custom_mask = None
        if n > 1:
            self.extend_seq_lens = torch.full((self.max_bs,), n, dtype=torch.int64, device=self.device)
            self.extend_start_loc = torch.arange(self.max_bs, dtype=torch.int64, device=self.device) * n
        if tree_mask:  # [n, seq_len] a request: room for every request at the longest context
            max_context = model_runner.req_to_token_pool.req_to_token.shape[1]
            self.custom_mask = torch.zeros(tokens * max_context, dtype=torch.bool, device=self.device)
            # A padding row's n tokens have no prefix and see each other causally.
            self._padding_mask = torch.ones(n, n, dtype=torch.bool, device=self.device).tril().flatten()

    def static_buffers(self) -> list[torch.Tensor]:
        """Every tensor a replay writes its batch into."""
        buffers = [self.input_ids, self.req_pool_indices, self.seq_lens, self.out_cache_loc, self.positions]
        return buffers + [t for t in (self.extend_seq_lens, self.extend_start_loc, self.custom_mask) if t is not None]

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        if forward_batch.forward_mode != self.capture_forward_mode or forward_batch.batch_size > self.max_bs:
            return False
        if self.num_tokens_per_bs == 1:
            return not forward_batch.capture_hidden_mode.need_capture()
        # A verify graph takes n tokens from every request, and returns every row's logits and
        # hidden state, not the prompt logprobs that LogitsProcessor computes in Python: a batch
        # that asks for them runs eagerly.
        n = self.num_tokens_per_bs
        return forward_batch.extend_num_tokens == forward_batch.batch_size * n and not forward_batch.return_logprob

    @abc.abstractmethod
    def capture(self) -> None: ...

    @abc.abstractmethod
    def replay(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput: ...

    def padded_batch_size(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def load_inputs(self, forward_batch: ForwardBatch) -> int:
        """Copy the batch into the static buffers, padded; return the padded batch size.

        A padding row is n new tokens with no prefix (n = 1 in decode) in the dummy slot 0."""
        raw_bs, n = forward_batch.batch_size, self.num_tokens_per_bs
        bs = self.padded_batch_size(raw_bs)
        self.seq_lens[raw_bs:bs].fill_(n)
        self.out_cache_loc[raw_bs * n : bs * n].zero_()
        self.req_pool_indices[raw_bs:bs].zero_()
        self.input_ids[: raw_bs * n].copy_(forward_batch.input_ids)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[: raw_bs * n].copy_(forward_batch.out_cache_loc)
        if n == 1:
            self.positions[:bs].copy_(self.seq_lens[:bs] - 1)
        else:  # the tree's depths, from the batch; a padding row's tokens sit at 0
            self.positions[: raw_bs * n].copy_(forward_batch.positions)
            self.positions[raw_bs * n : bs * n].zero_()
        if self.custom_mask is not None:  # each request's [n, seq_len] back to back, then the padding's
            mask = forward_batch.spec_info.custom_mask
            self.custom_mask[: mask.numel()].copy_(mask)
            if bs > raw_bs:
                self.custom_mask[mask.numel() : mask.numel() + (bs - raw_bs) * n * n].copy_(
                    self._padding_mask.repeat(bs - raw_bs)
                )
        return bs

    def static_batch(self, bs: int) -> ForwardBatch:
        """A ForwardBatch of the captured mode over the first bs rows of the static buffers."""
        runner, n = self.model_runner, self.num_tokens_per_bs
        verify = {}
        if n > 1:  # what the attention backend reads of a verify; the mask is the whole buffer
            verify = dict(
                extend_seq_lens=self.extend_seq_lens[:bs],
                extend_start_loc=self.extend_start_loc[:bs],
                extend_seq_lens_cpu=[n] * bs,
                extend_num_tokens=bs * n,
                spec_info=types.SimpleNamespace(custom_mask=self.custom_mask),
            )
        return ForwardBatch(
            forward_mode=self.capture_forward_mode,
            batch_size=bs,
            input_ids=self.input_ids[: bs * n],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[: bs * n],
            positions=self.positions[: bs * n],
            req_pool_indices_cpu=[0] * bs,
            seq_lens_cpu=[n] * bs,
            capture_hidden_mode=CaptureHiddenMode.NULL if n == 1 else CaptureHiddenMode.FULL,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            **verify,
        )
