"""Engine: the offline entry point, ``Engine(model_path=...).generate(...)``.

Mirrors python/sglang/srt/entrypoints/engine.py (Engine.__init__, generate,
async_generate, flush_cache, get_server_info, the expert-distribution methods,
shutdown). As in SGLang, the Engine is a thin wrapper: ``generate`` builds a
GenerateReqInput and drains ``TokenizerManager.generate_request``, the same
coroutine the HTTP server awaits, so the two front ends cannot disagree. SGLang
runs that coroutine on an asyncio loop; minisgl's Engine steps the scheduler
inline (InlineDriver, scheduler_driver.py), so the coroutine never waits on anything
outside its own thread and ``run_inline`` can drive it without a loop, which
also works inside a notebook whose loop is already running. On a node other
than node 0 the Engine only runs that node's tensor-parallel ranks.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Iterator, Optional, Union

from minisgl import tracing
from minisgl.managers.io_struct import GenerateReqInput
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs


class Engine:
    """The offline engine (SGLang's Engine); see the module docstring."""

    def __init__(self, **kwargs: Any) -> None:
        if "server_args" in kwargs:  # as SGLang's Engine: a ServerArgs already built (python -m minisgl.generate)
            if len(kwargs) > 1:
                raise ValueError(f"Engine takes server_args or its fields, not both: {sorted(kwargs)}")
            server_args = kwargs["server_args"]
            if not isinstance(server_args, ServerArgs):
                raise ValueError(f"server_args must be a ServerArgs, got {type(server_args).__name__}")
        else:
            try:
                server_args = ServerArgs(**kwargs)
            except TypeError as e:
                raise ValueError(f"unknown engine argument: {e}") from None
        self.tokenizer_manager: Optional[TokenizerManager] = None
        if server_args.node_rank >= 1:
            from minisgl.managers.scheduler_client import run_nonzero_rank_node

            # As SGLang's Engine on a non-zero node: run this node's ranks until node 0 shuts down.
            self.server_args = server_args
            run_nonzero_rank_node(server_args)
            return
        self.tokenizer_manager = TokenizerManager(server_args)
        self.server_args = self.tokenizer_manager.server_args

    def _tokenizer_manager(self) -> TokenizerManager:
        if self.tokenizer_manager is None:
            raise RuntimeError("this Engine has been shut down (or runs only a non-zero node's ranks)")
        return self.tokenizer_manager

    @property
    def scheduler(self):
        """The scheduler handle (the Scheduler itself with one rank), for readers who step it."""
        return self._tokenizer_manager().scheduler

    @property
    def tokenizer(self):
        return self._tokenizer_manager().tokenizer

    # generate and async_generate take exactly GenerateReqInput's fields (``text`` as ``prompt``),
    # as SGLang's Engine.generate says of its own; tests/test_sglang_fields.py keeps them equal.
    @tracing.traced
    def generate(
        self,
        prompt: Optional[Union[str, list[str]]] = None,
        sampling_params: Optional[Union[dict, list[dict]]] = None,
        input_ids: Optional[Union[list[int], list[list[int]]]] = None,
        rid: Optional[Union[str, list[str]]] = None,
        return_logprob: Optional[Union[bool, list[bool]]] = None,
        logprob_start_len: Optional[Union[int, list[int]]] = None,
        top_logprobs_num: Optional[Union[int, list[int]]] = None,
        token_ids_logprob: Optional[Union[list[int], list[list[int]]]] = None,
        stream: bool = False,
        return_hidden_states: Union[bool, list[bool]] = False,
        return_routed_experts: Union[bool, list[bool]] = False,
        return_text_in_logprobs: bool = False,
        custom_logit_processor: Optional[Union[str, list[Optional[str]]]] = None,
    ) -> Union[dict, list[dict], Iterator[dict]]:
        """One prompt gives one dict, a batch (or n > 1) a list, in order; with ``stream`` an
        iterator of chunks whose ``text`` and ``output_ids`` are everything so far, as SGLang's
        (the ids alone are deltas with ``stream_output=True``; a batch's chunks carry ``index``).
        Bad input raises ValueError before anything runs."""
        fields = {k: v for k, v in locals().items() if k not in ("self", "prompt")}
        chunks = self._tokenizer_manager().generate_request(GenerateReqInput(text=prompt, **fields))
        if stream:
            return _iterate_inline(chunks)
        return run_inline(_only(chunks))

    async def async_generate(
        self,
        prompt: Optional[Union[str, list[str]]] = None,
        sampling_params: Optional[Union[dict, list[dict]]] = None,
        input_ids: Optional[Union[list[int], list[list[int]]]] = None,
        rid: Optional[Union[str, list[str]]] = None,
        return_logprob: Optional[Union[bool, list[bool]]] = None,
        logprob_start_len: Optional[Union[int, list[int]]] = None,
        top_logprobs_num: Optional[Union[int, list[int]]] = None,
        token_ids_logprob: Optional[Union[list[int], list[list[int]]]] = None,
        stream: bool = False,
        return_hidden_states: Union[bool, list[bool]] = False,
        return_routed_experts: Union[bool, list[bool]] = False,
        return_text_in_logprobs: bool = False,
        custom_logit_processor: Optional[Union[str, list[Optional[str]]]] = None,
    ) -> Union[dict, list[dict], AsyncIterator[dict]]:
        """generate, as a coroutine: concurrent calls share the scheduler's batches."""
        fields = {k: v for k, v in locals().items() if k not in ("self", "prompt")}
        chunks = self._tokenizer_manager().generate_request(GenerateReqInput(text=prompt, **fields))
        if stream:
            return chunks
        return await _only(chunks)

    def encode(self, prompt: Union[str, list[str], list[int], list[list[int]]]) -> Union[dict, list[dict]]:
        """Embeddings (the Engine started with ``is_embedding=True``): ``{"embedding", "meta_info"}``
        for one prompt, a list for several; a prompt is a string or token ids (SGLang's Engine.encode)."""
        from minisgl.managers.embedding import encode

        results = run_inline(encode(self._tokenizer_manager(), prompt))
        single = isinstance(prompt, str) or (bool(prompt) and isinstance(prompt[0], int))
        return results[0] if single else results

    def flush_cache(self) -> bool:
        return run_inline(self._tokenizer_manager().flush_cache())

    def get_server_info(self) -> dict:
        return run_inline(self._tokenizer_manager().get_server_info())

    # ---- expert distribution recorder (SGLang's Engine method names) ---------------------

    def start_expert_distribution_record(self) -> None:
        run_inline(self._tokenizer_manager().start_expert_distribution_record())

    def stop_expert_distribution_record(self) -> None:
        run_inline(self._tokenizer_manager().stop_expert_distribution_record())

    def dump_expert_distribution_record(self, output_path: Optional[str] = None) -> dict:
        return run_inline(self._tokenizer_manager().dump_expert_distribution_record(output_path))

    # ---- profiling (SGLang's Engine.start_profile / stop_profile) ---------------------------

    def start_profile(self, output_dir: Optional[str] = None, activities: Optional[list[str]] = None) -> None:
        """Run the torch profiler, with minisgl's spans as ranges, until stop_profile."""
        run_inline(self._tokenizer_manager().start_profile(output_dir, activities))

    def stop_profile(self) -> str:
        """Stop the profiler; the path of the Chrome trace it wrote (open it in Perfetto)."""
        return run_inline(self._tokenizer_manager().stop_profile())

    def shutdown(self) -> None:
        if self.tokenizer_manager is not None:
            self.tokenizer_manager.shutdown()
        self.tokenizer_manager = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def run_inline(awaitable: Awaitable):
    """Run a coroutine of the inline TokenizerManager to its end, without an event loop.

    Its only suspension points are ``asyncio.sleep(0)``, a bare yield that an event loop
    would answer by resuming it at once; so does this loop. Anything else it awaited would
    need a real loop, which the inline front end never asks for."""
    coro = awaitable.__await__()
    while True:
        try:
            yielded = coro.send(None)
        except StopIteration as done:
            return done.value
        if yielded is not None:
            raise RuntimeError(f"an inline engine call waited on {yielded!r}, which needs an event loop")


async def _only(chunks: AsyncIterator[dict]) -> Union[dict, list[dict]]:
    """A non-streaming call's one result, run to the generator's end (its span closes there)."""
    (result,) = [chunk async for chunk in chunks]
    return result


def _iterate_inline(chunks: AsyncIterator[dict]) -> Iterator[dict]:
    try:
        while True:
            try:
                yield run_inline(anext(chunks))
            except StopAsyncIteration:
                return
    finally:
        run_inline(chunks.aclose())  # a consumer that stops early aborts what is left
