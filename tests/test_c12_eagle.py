"""C12 for EAGLE / EAGLE3: a draft head on the target's hidden states drafts a chain or a tree;
the target verifies it in one TARGET_VERIFY forward with the tree's mask, and greedy output is
token for token the target's, on every architecture, with every slot a round takes given back.

A random head (minisgl.tools.make_eagle_head) drafts badly, so most tests also plant the
target's true continuation along one branch of each tree (minisgl.tools.eagle_oracle): verify
then accepts several tokens per round through non-contiguous nodes, and everything downstream
(the accept walk, moving the accepted slots, freeing the rest, the draft extend) runs on real
acceptances. The target's own verification is untouched, so the output must still be the
target's."""

import json
import shutil

import pytest
import torch

from minisgl import tracing
from minisgl.entrypoints.engine import Engine
from minisgl.kernels.cpu import can_build
from minisgl.layers.attention.intel_amx_backend import IntelAMXAttnBackend
from minisgl.layers.attention.torch_native_backend import TorchNativeAttnBackend
from minisgl.model_executor.forward_batch_info import ForwardMode
from minisgl.server_args import ServerArgs
from minisgl.speculative.eagle_utils import accept_walk, build_tree_kernel_efficient
from minisgl.speculative.eagle_worker import EAGLEWorker
from minisgl.speculative.multi_layer_eagle_worker import MultiLayerEagleWorker
from minisgl.tools.eagle_oracle import plant_oracle
from minisgl.tools.make_eagle_head import make_eagle_head
from minisgl.tools.make_tiny_model import ARCHS
from tests._models import tiny_model_dir
from tests._spec import assert_logprobs_close
from tests._traces import children, fresh_and_golden

KW = dict(max_total_tokens=512, max_running_requests=8, device="cpu", attention_backend="torch_native")
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]]
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
CHAIN = dict(speculative_num_steps=3, speculative_eagle_topk=1)
TREE = dict(speculative_num_steps=3, speculative_eagle_topk=3, speculative_num_draft_tokens=6)

_heads: dict = {}


def _head(arch: str, algorithm: str, tmp_path_factory) -> str:
    if (arch, algorithm) not in _heads:
        out = tmp_path_factory.mktemp(f"{arch}-{algorithm}")
        # EAGLE3's own vocabulary: a random half of the target's (d2t maps it back).
        _heads[arch, algorithm] = str(make_eagle_head(tiny_model_dir(arch), out, algorithm, draft_vocab_size=256))
    return _heads[arch, algorithm]


def _ids(results) -> list[list[int]]:
    return [r["output_ids"] for r in results]


def _plain(arch: str, prompts=PROMPTS, params=GREEDY, **kwargs) -> list[list[int]]:
    return _ids(
        Engine(model_path=tiny_model_dir(arch), **{**KW, **kwargs}).generate(input_ids=prompts, sampling_params=params)
    )


def _eagle(arch, algorithm, head, shape, **kwargs) -> Engine:
    return Engine(
        model_path=tiny_model_dir(arch),
        speculative_algorithm=algorithm,
        speculative_draft_model_path=head,
        **{**KW, **shape, **kwargs},
    )


def _with_oracle(engine: Engine, expected: dict[tuple, list[int]], depth: int = 2) -> dict:
    """plant_oracle, and the allocator checked after every round: with no radix cache, the used
    slots are exactly the requests' KV (every rejected node's slot was given back)."""
    worker, scheduler = engine.scheduler.draft_worker, engine.scheduler
    plant_oracle(worker, expected, depth)
    verify, rounds = worker.verify, {"n": 0}
    total = scheduler.worker_info.max_total_num_tokens

    def checked_verify(batch, model_worker_batch, spec_info):
        result = verify(batch, model_worker_batch, spec_info)
        if scheduler.server_args.disable_radix_cache:
            assert worker.token_to_kv_pool_allocator.available_size() == total - sum(r.kv_len for r in batch.reqs)
        rounds["n"] += 1
        return result

    worker.verify = checked_verify
    return rounds


def _check(arch, algorithm, shape, tmp_path_factory, prompts=PROMPTS, params=GREEDY, depth=2, **kwargs):
    expected = _plain(arch, prompts, params)
    engine = _eagle(arch, algorithm, _head(arch, algorithm, tmp_path_factory), shape, **kwargs)
    rounds = _with_oracle(engine, {tuple(p): e for p, e in zip(prompts, expected)}, depth)
    results = engine.generate(input_ids=prompts, sampling_params=params)
    assert _ids(results) == expected
    assert rounds["n"] > 0 and sum(r["meta_info"]["spec_accept_token_num"] for r in results) > 0
    scheduler = engine.scheduler
    assert scheduler.flush_cache()
    assert scheduler.token_to_kv_pool_allocator.available_size() == scheduler.worker_info.max_total_num_tokens
    return engine, results


# ---- the tree in plain torch ----------------------------------------------------------------


def test_eagle_tree_mask_positions_and_accept_walk():
    # topk 2, 2 steps: candidates 0, 1 (step 0) and 2..5 (step 1: children of the kept lanes,
    # lane 0 = candidate 0, lane 1 = candidate 1). Choose 0, 1, 3, 4: 3 hangs from 0, 4 from 1.
    kept = torch.tensor([[-1, 0, 1]])
    tree = build_tree_kernel_efficient(
        torch.tensor([7]), kept, torch.tensor([[0, 1, 3, 4]]), torch.tensor([[10, 11, 12, 13]]), [5], 2, 5
    )
    assert tree["parents"].tolist() == [[-1, 0, 0, 1, 2]]
    assert tree["positions"].tolist() == [5, 6, 6, 7, 7]
    mask = tree["custom_mask"].view(5, 10)
    assert mask[:, :5].all()  # the prefix
    assert mask[:, 5:].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 0, 1, 0, 1],
    ]
    # The target says 11 after 7, then 13 after 11 (node 2, whose child 4 holds 13), then 99.
    target_next = torch.tensor([[11, 0, 13, 0, 99]])
    assert accept_walk(tree["parents"], tree["draft_token"], target_next) == [[0, 2, 4]]
    assert accept_walk(tree["parents"], tree["draft_token"], torch.tensor([[12, 0, 0, 0, 0]])) == [[0]]


# ---- greedy output is the target's ------------------------------------------------------------


def test_eagle_greedy_is_the_target(tmp_path_factory):
    # The default suite's one engine run: EAGLE3 (three layers' features, its own vocabulary)
    # drafting a tree; every architecture, both heads and both shapes run in the slow set.
    params = {**GREEDY, "max_new_tokens": 8}
    _check("llama", "EAGLE3", TREE, tmp_path_factory, params=params, disable_radix_cache=True)


def test_eagle_logprobs_are_the_targets(tmp_path_factory):
    # Each token of a round gets the logprobs a plain decode step reports, read off the verify's
    # logits at the node that predicted it; the oracle makes runs, so a round emits several.
    params = {**GREEDY, "max_new_tokens": 8}
    side = dict(return_logprob=True, top_logprobs_num=3, token_ids_logprob=[[5, 6]] * len(PROMPTS))
    plain = Engine(model_path=tiny_model_dir("llama"), **KW).generate(input_ids=PROMPTS, sampling_params=params, **side)
    engine = _eagle("llama", "EAGLE", _head("llama", "EAGLE", tmp_path_factory), TREE, disable_radix_cache=True)
    _with_oracle(engine, {tuple(p): r["output_ids"] for p, r in zip(PROMPTS, plain)}, depth=3)
    got = engine.generate(input_ids=PROMPTS, sampling_params=params, **side)
    assert _ids(got) == _ids(plain) and sum(r["meta_info"]["spec_accept_token_num"] for r in got) > 0
    for ours, theirs in zip(got, plain):
        assert_logprobs_close(ours["meta_info"], theirs["meta_info"])


def test_eagle_verify_applies_logit_bias(tmp_path_factory):
    # A greedy batch that edits no logits takes the verify's argmax without repeat_rows
    # (SamplingBatchInfo.edits_logits); one with a logit_bias must still have it at every node,
    # or the round would emit the unbiased target's tokens.
    free = _plain("llama", params={**GREEDY, "max_new_tokens": 8})
    params = {**GREEDY, "max_new_tokens": 8, "logit_bias": {str(free[0][2]): -100.0}}
    assert _plain("llama", params=params) != free  # the bias changes the target's own greedy tokens
    _check("llama", "EAGLE", TREE, tmp_path_factory, params=params, disable_radix_cache=True)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
def test_eagle_greedy_on_every_architecture(arch, algorithm, shape, tmp_path_factory):
    _check(arch, algorithm, shape, tmp_path_factory, disable_radix_cache=True)


def test_eagle_chain_on_the_cpu_kernels_backend_at_batch_three(tmp_path_factory):
    # The default backend on a CPU. A chain's draft step writes one column of the round's
    # [bs, slots] block, a strided view the C++ kernels refuse; a batch of one hid it.
    arch, head = "llama", _head("llama", "EAGLE", tmp_path_factory)
    engine = _eagle(arch, "EAGLE", head, CHAIN, attention_backend="intel_amx")
    assert _ids(engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)) == _plain(arch)


@pytest.mark.parametrize("arch,algorithm", [("llama", "EAGLE"), ("qwen3", "EAGLE3")])
def test_eagle_tree_on_the_cpu_kernels_backend(arch, algorithm, tmp_path_factory, monkeypatch):
    # The tree's mask goes to the C++ extend kernel, in verify and in every draft step after the
    # first; the plain-torch path intel_amx once fell back to is made to fail here. The oracle
    # makes the head draft the target's tokens, so verify accepts paths below the root.
    native_extend = TorchNativeAttnBackend.forward_extend

    def no_fallback(self, *args, **kwargs):
        assert not isinstance(self, IntelAMXAttnBackend), "intel_amx ran an extend in plain torch"
        return native_extend(self, *args, **kwargs)

    monkeypatch.setattr(TorchNativeAttnBackend, "forward_extend", no_fallback)
    _check(arch, algorithm, TREE, tmp_path_factory, disable_radix_cache=True, attention_backend="intel_amx")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", [CHAIN, TREE], ids=["chain", "tree"])
def test_eagle_on_a_gpu(shape, tmp_path_factory):
    """The draft's own tensors (lane paths, positions, tree masks, the hot-token map) are made on
    the device: a host tensor there once failed the first draft step."""
    # float32: under "auto" a GPU serves bfloat16, where verify (an extend over the drafted
    # tokens) and plain decode reduce in different orders and a tiny model's near-ties flip.
    gpu = dict(device="cuda", dtype="float32", attention_backend="torch_native")
    expected = _plain("llama", **gpu)
    engine = _eagle("llama", "EAGLE", _head("llama", "EAGLE", tmp_path_factory), shape, **gpu)
    rounds = _with_oracle(engine, {tuple(p): e for p, e in zip(PROMPTS, expected)})
    assert _ids(engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)) == expected
    assert rounds["n"] > 0


@pytest.mark.slow
def test_eagle_radix_cache_chunked_prefill_and_stops(tmp_path_factory):
    # Shared prefixes come from the radix cache; 8-token chunks split the prompts; stop tokens
    # and max_new_tokens fall inside accepted runs (the oracle makes runs of 3).
    prompts = [list(range(3, 23)), list(range(3, 23)) + [40, 41], [9, 10]]
    first = _plain("llama", prompts)
    # Request 2's second token stops it only once min_new_tokens allows: a tree node's mask is its depth's.
    params = {"temperature": 0, "max_new_tokens": 14, "min_new_tokens": 3, "stop_token_ids": [first[0][5], first[2][1]]}
    engine, results = _check("llama", "EAGLE", TREE, tmp_path_factory, prompts, params, depth=3, chunked_prefill_size=8)
    assert results[0]["meta_info"]["finish_reason"]["type"] == "stop"
    assert engine.scheduler.num_cached_tokens > 0


@pytest.mark.slow
def test_eagle_retraction(tmp_path_factory):
    # A pool too small for every request's round: decode retracts, and the re-prefill redrafts.
    prompts = [list(range(5 + i, 25 + i)) for i in range(6)]
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    engine, _ = _check(
        "llama", "EAGLE3", CHAIN, tmp_path_factory, prompts, params, max_total_tokens=160, disable_radix_cache=True
    )
    assert engine.scheduler.num_retracted_reqs > 0


@pytest.mark.slow
def test_eagle_hot_token_map(tmp_path_factory, tmp_path):
    # --speculative-token-map: the shared LM head keeps these rows; drafted index i is hot[i].
    hot = torch.arange(0, 400, 2)
    torch.save(hot, tmp_path / "hot.pt")
    engine, _ = _check(
        "qwen2",
        "EAGLE",
        TREE,
        tmp_path_factory,
        disable_radix_cache=True,
        speculative_token_map=str(tmp_path / "hot.pt"),
    )
    worker = engine.scheduler.draft_worker
    assert torch.equal(worker.hot_token_id, hot) and worker.model_runner.model.lm_head.org_vocab_size == 200


@pytest.mark.slow
def test_eagle_multi_layer_runner_list(tmp_path_factory):
    engine, _ = _check(
        "llama", "EAGLE", CHAIN, tmp_path_factory, enable_multi_layer_eagle=True, disable_radix_cache=True
    )
    worker = engine.scheduler.draft_worker
    assert isinstance(worker, MultiLayerEagleWorker) and len(worker.model_runner_list) == 3
    runners = worker.model_runner_list
    assert [r.draft_model_idx for r in runners] == [0, 0, 0]  # a one-layer head serves every step
    assert len({id(r.token_to_kv_pool) for r in runners}) == 3  # each step its own KV ...
    assert all(r.req_to_token_pool is runners[0].req_to_token_pool for r in runners)  # ... in one set of slots
    assert all(
        r.token_to_kv_pool_allocator is worker.target_worker.model_runner.token_to_kv_pool_allocator for r in runners
    )


def test_eagle_draft_shares_the_targets_embedding_and_head(tmp_path_factory):
    engine = _eagle("llama", "EAGLE", _head("llama", "EAGLE", tmp_path_factory), CHAIN)
    worker = engine.scheduler.draft_worker
    assert isinstance(worker, EAGLEWorker) and worker.is_draft_worker
    target, draft = worker.target_worker.model_runner.model, worker.model_runner.model
    assert draft.model.embed_tokens is target.model.embed_tokens and draft.lm_head is target.lm_head
    assert worker.get_memory_pool() == worker.target_worker.get_memory_pool()
    engine3 = _eagle("llama", "EAGLE3", _head("llama", "EAGLE3", tmp_path_factory), CHAIN)
    target3 = engine3.scheduler.tp_worker.model_runner.model
    assert target3.model.layers_to_capture == [1, 1, 0]  # SGLang's [2, n // 2, n - 3], clamped to 2 layers


def test_eagle_refuses_a_head_that_does_not_fit(tmp_path_factory, tmp_path):
    head = _head("llama", "EAGLE", tmp_path_factory)
    with pytest.raises(ValueError, match="LlamaForCausalLMEagle3 head"):
        _eagle("llama", "EAGLE3", head, CHAIN)
    for field, value, message in (("hidden_size", 32, "hidden size"), ("vocab_size", 100, "vocab_size")):
        wrong = tmp_path / field
        shutil.copytree(head, wrong)
        config = json.loads((wrong / "config.json").read_text())
        (wrong / "config.json").write_text(json.dumps({**config, field: value}))
        with pytest.raises(ValueError, match=message):
            _eagle("llama", "EAGLE", str(wrong), CHAIN)
    engine = _eagle("llama", "EAGLE", head, CHAIN, enable_return_hidden_states=True)
    with pytest.raises(ValueError, match="hidden states"):
        engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, return_hidden_states=True)
    with pytest.raises(ValueError, match="speculative_num_draft_tokens must be in"):
        ServerArgs(model_path=tiny_model_dir("llama"), speculative_algorithm="EAGLE", speculative_draft_model_path=head,
                   speculative_num_steps=2, speculative_eagle_topk=2, speculative_num_draft_tokens=9)  # fmt: skip
    with pytest.raises(ValueError, match="custom attention mask"):
        ServerArgs(model_path=tiny_model_dir("llama"), speculative_algorithm="EAGLE", speculative_draft_model_path=head,
                   speculative_eagle_topk=2, attention_backend="triton")  # fmt: skip
    args = ServerArgs(
        model_path=tiny_model_dir("llama"), speculative_algorithm="eagle", speculative_draft_model_path=head
    )
    # SGLang's auto_choose_speculative_params for a Llama target.
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (5, 4, 8)


@pytest.mark.slow
@pytest.mark.skipif(not can_build(), reason="CPUGraphRunner needs minisgl's C++ CPU kernels")
@pytest.mark.parametrize("arch,algorithm,shape", [("llama", "EAGLE", TREE), ("qwen3", "EAGLE3", CHAIN)])
def test_eagle_compiled_verify_is_the_target(arch, algorithm, shape, tmp_path_factory):
    """enable_torch_compile: the target's verify runs compiled (CPUGraphRunner in TARGET_VERIFY,
    graph_runner.py), three requests padded to a bucket of four, the tree's mask in its static
    buffer, and so do the head's draft steps (DRAFT_EXTEND, one token on each of a request's
    lanes, their features in a static buffer), and so does the draft extend after verify (its own
    runner: each request's 1 to k + 1 tokens in k + 1 rows); the oracle's runs are accepted, the
    output is the target's, every slot comes back."""
    compile_ = dict(enable_torch_compile=True, torch_compile_max_bs=4)
    engine, _ = _check(
        arch, algorithm, shape, tmp_path_factory, disable_radix_cache=True, attention_backend="intel_amx", **compile_
    )
    runner = engine.scheduler.tp_worker.model_runner.graph_runner
    assert runner.capture_forward_mode == ForwardMode.TARGET_VERIFY and 4 in runner.compile_seconds
    assert (runner.custom_mask is not None) == (shape is TREE)
    draft = engine.scheduler.draft_worker.model_runner.graph_runner
    assert draft.capture_forward_mode == ForwardMode.DRAFT_EXTEND and draft.compile_seconds
    assert (draft.custom_mask is not None) == (shape is TREE)
    extend = engine.scheduler.draft_worker.draft_extend_graph_runner
    assert extend.capture_forward_mode == ForwardMode.DRAFT_EXTEND and extend.custom_mask is None
    assert extend.num_tokens_per_bs == shape["speculative_num_steps"] + 1
    # The trace names each forward's path: every verify and every draft step replays a graph,
    # and every draft extend over what verify accepted replays the extend's; a prompt's draft
    # extend, longer than k + 1 tokens, runs eagerly.
    with tracing.record() as events:
        engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    modes = [e["forward_mode"] for e in events if e["event"] == "ModelRunner.forward" and e["phase"] == "begin"]
    branches = [e["branch"] for e in events if e["event"] == "ModelRunner.forward.dispatch"]
    assert {(m, b) for m, b in zip(modes, branches) if m != "EXTEND"} == {
        ("TARGET_VERIFY", "graph_replay"),
        ("DRAFT_EXTEND", "graph_replay"),
        ("DRAFT_EXTEND", "extend"),
    }
    steps = [e for span in children(events, "EAGLEWorker.draft") for e in span]
    step_branches = [e["branch"] for e in steps if e["event"] == "ModelRunner.forward.dispatch"]
    assert step_branches and set(step_branches) == {"graph_replay"}
    rounds = len(children(events, "EAGLEWorker.verify"))
    replays = [e for e in events if e["event"] == "EAGLEWorker.run_draft_extend.dispatch"]
    assert rounds and len(replays) >= rounds and 4 in extend.compile_seconds


def test_eagle_golden_trace_matches():
    fresh, golden = fresh_and_golden("eagle_decoding")
    assert fresh == golden, "EAGLE trace changed: review, then python -m minisgl.tools.refresh_traces eagle_decoding"


def test_eagle_round_is_draft_verify_draft_extend():
    events = fresh_and_golden("eagle_decoding")[0]
    modes = [e["forward_mode"] for e in events if e["event"] == "ModelRunner.forward" and e["phase"] == "begin"]
    # Prefill: target, then the draft over the same positions. A round: steps - 1 = 2 draft
    # forwards, one verify, one draft extend over what was accepted.
    assert modes[:2] == ["EXTEND", "DRAFT_EXTEND"]
    assert modes[2:6] == ["DRAFT_EXTEND", "DRAFT_EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND"]
    for verify in children(events, "EAGLEWorker.verify"):
        tree = next(e for e in verify if e["event"] == "EAGLEWorker.verify.tree")
        accepted = next(e for e in verify if e["event"] == "EAGLEWorker.verify.accepted")
        (path,) = accepted["accepted_nodes"]
        parents = tree["parents"][0]
        assert path[0] == 0 and all(parents[child] == parent for parent, child in zip(path, path[1:]))
        assert accepted["freed_slots"] == 4 - len(path)  # 4 slots a round: t0 and 3 nodes
    assert any(len(e["accepted_nodes"][0]) > 1 for e in events if e["event"] == "EAGLEWorker.verify.accepted")


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra", [{}, dict(attention_backend="intel_amx", enable_torch_compile=True)], ids=["eager", "compiled-verify"]
)
def test_eagle_tensor_parallel(extra, tmp_path_factory):
    if extra and not can_build():
        pytest.skip("CPUGraphRunner needs minisgl's C++ CPU kernels")
    arch, head = "qwen3", _head("qwen3", "EAGLE3", tmp_path_factory)
    expected = _plain(arch)
    with _eagle(arch, "EAGLE3", head, TREE, tp_size=2, **extra) as engine:
        got = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert engine.flush_cache()
        assert engine.get_server_info()["available_kv_tokens"] == 512
    assert _ids(got) == expected


@pytest.mark.slow
def test_eagle_sampled_requests_run_and_free_their_kv(tmp_path_factory):
    # Sampled rows walk the tree with tokens drawn from the target's distribution; seeded, the
    # output repeats, and greedy rows in the same batch stay the target's.
    engine = _eagle("llama", "EAGLE", _head("llama", "EAGLE", tmp_path_factory), TREE, disable_radix_cache=True)
    sampled = {"temperature": 1.0, "top_k": 5, "max_new_tokens": 12, "ignore_eos": True, "seed": 3}
    params = [sampled, sampled, GREEDY]
    first = engine.generate(input_ids=PROMPTS, sampling_params=params)
    again = engine.generate(input_ids=PROMPTS, sampling_params=params)
    assert _ids(first) == _ids(again) and _ids(first)[2] == _plain("llama", [PROMPTS[2]])[0]
    assert engine.scheduler.token_to_kv_pool_allocator.available_size() == 512
