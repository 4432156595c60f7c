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

An EAGLE head captures its draft steps (``draft_lanes``, SGLang's EAGLEDraftCudaGraphRunner):
a step is one token on each of a request's topk lanes, which reads a feature row (the
previous step's output) from a static buffer and, in a tree, sees the prefix and its own
ancestors through the same kind of mask buffer. SGLang captures the step as DECODE with a
multi-step attention backend; minisgl keeps the DRAFT_EXTEND batch its eager path runs.

EAGLEWorker also holds a second runner for the head, for the draft extend after verify
(``extend_features``, SGLang's EAGLEDraftExtendCudaGraphRunner): a request brings the 1 to
k + 1 tokens verify accepted, so each is given k + 1 rows, its tokens first; the static
extend_seq_lens hold the real counts, which the attention kernel and the logits' last-row
index read, so a row past them computes nothing anyone reads and writes its KV to slot 0.
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
        self,
        model_runner: "ModelRunner",
        max_bs: int,
        num_tokens_per_bs: int = 1,
        tree_mask: bool = False,
        draft_lanes: int = 0,
        extend_features: int = 0,
    ) -> None:
        """num_tokens_per_bs > 1 captures a target's verify of that many tokens a request, with
        a custom mask if tree_mask (an EAGLE tree; a chain's mask is the causal one).
        draft_lanes > 0 captures an EAGLE head's draft step instead: that many one-token lanes a
        request (the topk), each a row of the graph's batch, with a feature buffer.
        extend_features > 0 captures an EAGLE head's draft extend after verify: up to
        num_tokens_per_bs tokens a request, each with a feature that wide (the target's)."""
        self.model_runner = model_runner
        self.device = model_runner.device
        lanes = max(draft_lanes, 1)
        self.capture_bs = get_batch_sizes_to_capture(min(max_bs, model_runner.req_to_token_pool.size) * lanes)
        self.max_bs = self.capture_bs[-1]
        self.num_tokens_per_bs = n = num_tokens_per_bs
        self.extend_features = extend_features
        if draft_lanes or extend_features:
            self.capture_forward_mode = ForwardMode.DRAFT_EXTEND
        else:
            self.capture_forward_mode = ForwardMode.DECODE if n == 1 else ForwardMode.TARGET_VERIFY
        tokens = self.max_bs * n
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=self.device)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.full((self.max_bs,), n, dtype=torch.int64, device=self.device)
        self.out_cache_loc = torch.zeros(tokens, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=self.device)
        self.extend_seq_lens = self.extend_start_loc = self.custom_mask = self.hidden_states = None
        if self.capture_forward_mode.is_extend():
            self.extend_seq_lens = torch.full((self.max_bs,), n, dtype=torch.int64, device=self.device)
            self.extend_start_loc = torch.arange(self.max_bs, dtype=torch.int64, device=self.device) * n
        if tree_mask:  # [n, seq_len] a request: room for every request at the longest context
            max_context = model_runner.req_to_token_pool.req_to_token.shape[1]
            self.custom_mask = torch.zeros(tokens * max_context, dtype=torch.bool, device=self.device)
            # A padding row's n tokens have no prefix and see each other causally.
            self._padding_mask = torch.ones(n, n, dtype=torch.bool, device=self.device).tril().flatten()
        if draft_lanes:  # each lane's feature: the previous step's output row
            hidden = model_runner.model_config.hidden_size
            self.hidden_states = torch.zeros(self.max_bs, hidden, dtype=model_runner.dtype, device=self.device)
        if extend_features:  # each token's feature: the target's, from verify
            self.hidden_states = torch.zeros(tokens, extend_features, dtype=model_runner.dtype, device=self.device)

    def static_buffers(self) -> list[torch.Tensor]:
        """Every tensor a replay writes its batch into."""
        buffers = [self.input_ids, self.req_pool_indices, self.seq_lens, self.out_cache_loc, self.positions]
        optional = (self.extend_seq_lens, self.extend_start_loc, self.custom_mask, self.hidden_states)
        return buffers + [t for t in optional if t is not None]

    def can_run(self, forward_batch: ForwardBatch) -> bool:
        if forward_batch.forward_mode != self.capture_forward_mode or forward_batch.batch_size > self.max_bs:
            return False
        if self.extend_features:
            # A draft extend: up to n tokens a request, no mask (a verified path is a chain), the
            # target's features as wide as the buffer (EAGLE3's three layers).
            spec_info = forward_batch.spec_info
            return (
                max(forward_batch.extend_seq_lens_cpu) <= self.num_tokens_per_bs
                and spec_info.custom_mask is None
                and spec_info.hidden_states.shape[-1] == self.extend_features
            )
        if self.hidden_states is not None:
            # A draft step: one token a lane, a mask exactly when the graph has one (a tree), and a
            # feature as wide as the head's output. A draft extend whose requests each bring one
            # token is the same computation and runs here too; EAGLE3's first one reads the
            # target's three layers (3H wide) and runs eagerly.
            spec_info = forward_batch.spec_info
            return (
                forward_batch.extend_num_tokens == forward_batch.batch_size
                and (spec_info.custom_mask is None) == (self.custom_mask is None)
                and spec_info.hidden_states.shape[-1] == self.hidden_states.shape[-1]
            )
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

        A padding row is n new tokens with no prefix (n = 1 in decode), all at position 0, in
        the dummy slot 0."""
        raw_bs, n = forward_batch.batch_size, self.num_tokens_per_bs
        bs = self.padded_batch_size(raw_bs)
        if self.extend_features:
            return self._load_draft_extend(forward_batch, bs)
        self.input_ids[: raw_bs * n].copy_(forward_batch.input_ids)
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.out_cache_loc[: raw_bs * n].copy_(forward_batch.out_cache_loc)
        self.positions[: raw_bs * n].copy_(forward_batch.positions)  # a tree's: its nodes' depths
        if self.custom_mask is not None:  # each request's [n, seq_len] back to back, then the padding's
            mask = forward_batch.spec_info.custom_mask
            self.custom_mask[: mask.numel()].copy_(mask)
        if self.hidden_states is not None:  # padding lanes keep stale rows: their outputs are dropped
            self.hidden_states[:raw_bs].copy_(forward_batch.spec_info.hidden_states)
        if bs > raw_bs:  # each small copy costs a dispatch: only a padded batch writes its padding
            self.seq_lens[raw_bs:bs].fill_(n)
            self.out_cache_loc[raw_bs * n : bs * n].zero_()
            self.req_pool_indices[raw_bs:bs].zero_()
            self.positions[raw_bs * n : bs * n].zero_()
            if self.custom_mask is not None:
                self.custom_mask[mask.numel() : mask.numel() + (bs - raw_bs) * n * n].copy_(
                    self._padding_mask.repeat(bs - raw_bs)
                )
        return bs

    def _load_draft_extend(self, forward_batch: ForwardBatch, bs: int) -> int:
        """A draft extend's tokens, request b's at rows b * n onwards. The other rows are zeroed
        each time: token 0 at position 0 in the dummy slot 0, so that none writes a real slot."""
        raw_bs, n = forward_batch.batch_size, self.num_tokens_per_bs
        rows = torch.tensor(
            [b * n + j for b, length in enumerate(forward_batch.extend_seq_lens_cpu) for j in range(length)],
            device=self.device,
        )
        for buffer, values in (
            (self.input_ids, forward_batch.input_ids),
            (self.out_cache_loc, forward_batch.out_cache_loc),
            (self.positions, forward_batch.positions),
        ):
            buffer[: bs * n].zero_()
            buffer.index_copy_(0, rows, values)
        # Rows past a request's tokens keep stale features: finite, and their outputs are dropped.
        self.hidden_states.index_copy_(0, rows, forward_batch.spec_info.hidden_states.to(self.hidden_states.dtype))
        self.req_pool_indices[:raw_bs].copy_(forward_batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(forward_batch.seq_lens)
        self.extend_seq_lens[:raw_bs].copy_(forward_batch.extend_seq_lens)
        if bs > raw_bs:  # a padding request: n tokens with no prefix, as in a verify
            self.req_pool_indices[raw_bs:bs].zero_()
            self.seq_lens[raw_bs:bs].fill_(n)
            self.extend_seq_lens[raw_bs:bs].fill_(n)
        return bs

    def static_batch(self, bs: int) -> ForwardBatch:
        """A ForwardBatch of the captured mode over the first bs rows of the static buffers."""
        runner, n = self.model_runner, self.num_tokens_per_bs
        extend, capture = {}, CaptureHiddenMode.NULL
        if self.capture_forward_mode.is_extend():  # what the backend reads; the mask is the whole buffer
            rows = bs * n if self.extend_features else bs  # a feature per token, or per lane
            hidden = None if self.hidden_states is None else self.hidden_states[:rows]
            extend = dict(
                extend_seq_lens=self.extend_seq_lens[:bs],
                extend_start_loc=self.extend_start_loc[:bs],
                extend_seq_lens_cpu=[n] * bs,
                extend_num_tokens=bs * n,
                spec_info=types.SimpleNamespace(custom_mask=self.custom_mask, hidden_states=hidden),
            )
            # A verify keeps every row's state for the draft extend; a draft step or extend each
            # request's last row (LogitsProcessor finds it from extend_start_loc and the lengths).
            capture = CaptureHiddenMode.FULL if hidden is None else CaptureHiddenMode.LAST
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
            capture_hidden_mode=capture,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            **extend,
        )
