"""TokenizerManager in-process: streaming equals non-streaming, n expansion, validation,
abort on close, stop strings the scheduler misses, and a clean shutdown of the scheduler thread."""

import asyncio

import pytest

from minisgl.managers.io_struct import MAX_N, GenerateReqInput
from minisgl.managers.scheduler import Scheduler
from minisgl.managers.tokenizer_manager import TokenizerManager
from minisgl.server_args import ServerArgs

MAX_TOTAL_TOKENS = 2048
GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tm(tiny_llama):
    manager = TokenizerManager(ServerArgs(model_path=tiny_llama, max_total_tokens=MAX_TOTAL_TOKENS), threaded=True)
    yield manager
    manager.shutdown()


def generate(tm, **kwargs):
    async def run():
        return await anext(tm.generate_request(GenerateReqInput(**kwargs)))

    return asyncio.run(run())


def stream(tm, **kwargs) -> list[dict]:
    async def run():
        # Deltas (the server's --stream-output), so that the chunks add up to the whole.
        chunks = tm.generate_request(GenerateReqInput(stream=True, **kwargs), stream_deltas=True)
        return [chunk async for chunk in chunks]

    return asyncio.run(run())


async def pool_after_flush(tm) -> dict:
    """Wait for the scheduler to go idle, empty the radix cache, return the accounting."""
    for _ in range(200):
        if (await tm.get_internal_state())["is_idle"]:
            break
        await asyncio.sleep(0.01)
    assert await tm.flush_cache(), "the scheduler never went idle"
    return await tm.get_internal_state()


def test_streamed_chunks_add_up_to_the_non_streamed_result(tm):
    whole = generate(tm, text="The river rose", sampling_params=GREEDY)
    chunks = stream(tm, text="The river rose", sampling_params=GREEDY)
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert sum((c["output_ids"] for c in chunks), []) == whole["output_ids"]
    assert [c["meta_info"]["finish_reason"] for c in chunks][-1] == {"type": "length", "length": 24}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert whole["meta_info"]["completion_tokens"] == 24


def test_batch_and_n_expand_into_indexed_requests(tm):
    params = {**GREEDY, "temperature": 1.0, "seed": 7, "n": 3}
    results = generate(tm, text=["The river", "A serving engine"], sampling_params=params)
    assert [r["index"] for r in results] == list(range(6))
    assert len({r["meta_info"]["id"] for r in results}) == 6
    assert len({tuple(r["output_ids"]) for r in results[:3]}) > 1, "n samples of one prompt should differ"
    # Seeded sampling repeats, streamed or not: choice i of the stream is choice i above.
    chunks = stream(tm, text=["The river", "A serving engine"], sampling_params=params)
    for i, result in enumerate(results):
        assert "".join(c["text"] for c in chunks if c["index"] == i) == result["text"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(text=""), "empty"),
        (dict(text="hi", input_ids=[1]), "exactly one"),
        (dict(input_ids=[5] * 1100), "context length"),
        (dict(input_ids=[1, 100000]), "input_ids must be token ids"),
        (dict(text="hi", sampling_params={"n": MAX_N + 1}), "n must be"),
        (dict(text="hi", sampling_params={"temperature": -1}), "temperature"),
        (dict(text="hi", sampling_params={"top_p": "high"}), "sampling_params"),
        (dict(text="hi", sampling_params={"max_new_tokens": 5000}), "maximum context length"),
        (dict(text="hi", sampling_params={"stop": ""}), "stop"),
        (dict(text="hi", sampling_params={"unknown": 1}), "unexpected keyword"),
        (dict(text="hi", return_hidden_states=True), "enable-return-hidden-states"),
    ],
)
def test_bad_requests_raise_value_error_before_anything_runs(tm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(tm, **kwargs)


def test_closing_a_stream_aborts_the_request_and_frees_its_kv(tm):
    async def run():
        before = tm.num_aborted_reqs
        params = {"max_new_tokens": 1000, "ignore_eos": True}
        chunks = tm.generate_request(GenerateReqInput(text="Hello", sampling_params=params, stream=True))
        await anext(chunks)
        await chunks.aclose()
        state = await pool_after_flush(tm)
        assert tm.num_aborted_reqs == before + 1
        assert state["available_kv_tokens"] == MAX_TOTAL_TOKENS

    asyncio.run(run())


def test_stop_string_the_scheduler_misses_still_ends_the_request(tm, monkeypatch):
    whole = generate(tm, text="The river rose", sampling_params={**GREEDY, "max_new_tokens": 48})["text"]
    stop = next(whole[i : i + 3] for i in range(4, len(whole)) if "\ufffd" not in whole[i : i + 3])
    # Blind the scheduler's own stop-string check: the front end must catch the stop alone.
    monkeypatch.setattr(Scheduler, "_tail_text", lambda self, req: None)
    params = {**GREEDY, "max_new_tokens": 48, "stop": stop}
    chunks = stream(tm, text="The river rose", sampling_params=params)
    assert "".join(c["text"] for c in chunks) == whole[: whole.index(stop)]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    result = generate(tm, text="The river rose", sampling_params=params)
    assert result["text"] == whole[: whole.index(stop)]

    assert asyncio.run(pool_after_flush(tm))["available_kv_tokens"] == MAX_TOTAL_TOKENS


def test_shutdown_stops_the_thread_and_fails_waiting_requests(tiny_llama):
    manager = TokenizerManager(ServerArgs(model_path=tiny_llama, max_total_tokens=MAX_TOTAL_TOKENS), threaded=True)

    async def run():
        chunks = manager.generate_request(
            GenerateReqInput(text="Hello", sampling_params={"max_new_tokens": 1000, "ignore_eos": True}, stream=True)
        )
        await anext(chunks)
        manager.shutdown()
        with pytest.raises(RuntimeError, match="stopped"):
            async for _ in chunks:
                pass

    asyncio.run(run())
    assert not manager.driver.thread.is_alive() and not manager.is_healthy()
    with pytest.raises(RuntimeError, match="stopped"):
        generate(manager, text="Hello")


def test_the_scheduler_thread_builds_the_scheduler_it_runs(tiny_llama, monkeypatch):
    """With the server's thread, the model is built (weights packed, kernels probed) in that
    thread, not the caller's: OpenMP gives each thread that runs parallel ops its own workers,
    and more workers than cores made every op of the forward wait for a wake-up."""
    import threading

    from minisgl.managers import scheduler_driver

    built_in, make = [], scheduler_driver.make_scheduler

    def recording_make(server_args):
        built_in.append(threading.current_thread().name)
        return make(server_args)

    monkeypatch.setattr(scheduler_driver, "make_scheduler", recording_make)
    manager = TokenizerManager(ServerArgs(model_path=tiny_llama, max_total_tokens=MAX_TOTAL_TOKENS), threaded=True)
    try:
        assert built_in == [manager.driver.thread.name] != [threading.current_thread().name]
        assert generate(manager, text="Hello", sampling_params=GREEDY)["meta_info"]["completion_tokens"] == 24
    finally:
        manager.shutdown()


def test_a_model_the_thread_cannot_build_fails_the_constructor(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"], "model_type": "llama"}')
    with pytest.raises(Exception, match="NoSuchForCausalLM"):
        TokenizerManager(ServerArgs(model_path=str(tmp_path)), threaded=True)


def test_only_the_inline_driver_shares_the_schedulers_tokenizer(tiny_llama, tm):
    """Inline, the scheduler runs on the caller's thread and one tokenizer serves both; the server's
    scheduler thread keeps its own, since a fast tokenizer used from two threads at once fails."""
    inline = TokenizerManager(ServerArgs(model_path=tiny_llama, max_total_tokens=MAX_TOTAL_TOKENS))
    try:
        assert inline.tokenizer is inline.scheduler.tokenizer
        assert generate(inline, text="Hello", sampling_params=GREEDY)["meta_info"]["completion_tokens"] == 24
    finally:
        inline.shutdown()
    assert tm.tokenizer is not tm.scheduler.tokenizer
