"""C12: a draft worker is a TpModelWorker(is_draft_worker=True) sharing the target's pools through
get_memory_pool(); speculation adds a layer to the shell (draft, TARGET_VERIFY, DRAFT_EXTEND), not a
sampler tweak. Greedy output is token-for-token the non-speculative output, sampled output follows
the target's distribution, and every slot a round takes comes back. Checked against
traces/speculative_decoding.jsonl."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from minisgl.entrypoints.engine import Engine
from minisgl.kernels.cpu import can_build
from minisgl.managers.tp_worker import TpModelWorker
from minisgl.server_args import ServerArgs
from minisgl.speculative.standalone_worker import StandaloneWorker
from minisgl.tools.make_draft_model import make_truncated_model
from tests._models import tiny_model_dir
from tests._spec import assert_logprobs_close
from tests._traces import children, fresh_and_golden

KW = dict(max_total_tokens=512, max_running_requests=8, device="cpu", attention_backend="torch_native")
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]]
GREEDY = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, str]:
    """Each tiny target cut to its first layer: a cheap draft that is often wrong."""
    root = tmp_path_factory.mktemp("drafts")
    return {
        arch: str(make_truncated_model(tiny_model_dir(arch), root / arch, 1))
        for arch in ("llama", "qwen3", "qwen3_moe")
    }


def _spec(target: str, draft: str, steps: int = 3, **kwargs) -> Engine:
    return Engine(
        model_path=target,
        speculative_algorithm="STANDALONE",
        speculative_draft_model_path=draft,
        speculative_num_steps=steps,
        **{**KW, **kwargs},
    )


def _ids(results: list[dict]) -> list[list[int]]:
    return [r["output_ids"] for r in results]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_c12_greedy_is_token_for_token_the_target(arch, drafts):
    target = tiny_model_dir(arch)
    expected = _ids(Engine(model_path=target, **KW).generate(input_ids=PROMPTS, sampling_params=GREEDY))
    # A poor draft (mostly rejected), a perfect one (always accepted), one step and several.
    for draft, steps in ((drafts[arch], 3), (target, 3), (drafts[arch], 1)):
        results = _spec(target, draft, steps).generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert _ids(results) == expected, (draft, steps)
        meta = results[0]["meta_info"]
        assert meta["spec_draft_token_num"] == meta["spec_verify_ct"] * steps
        assert meta["spec_accept_rate"] == meta["spec_accept_token_num"] / meta["spec_draft_token_num"]
        if draft == target:
            assert meta["spec_accept_rate"] == 1.0 and meta["spec_accept_length"] > steps


@pytest.mark.slow
@pytest.mark.skipif(not can_build(), reason="CPUGraphRunner needs minisgl's C++ CPU kernels")
def test_c12_standalone_draft_decodes_compiled(drafts):
    """The draft's steps are plain decodes, which CPUGraphRunner compiles, and the target compiles its
    verify (as SGLang's CudaGraphRunner captures TARGET_VERIFY); the output is still the target's."""
    target, amx = tiny_model_dir("llama"), dict(attention_backend="intel_amx")
    expected = _ids(Engine(model_path=target, **{**KW, **amx}).generate(input_ids=PROMPTS, sampling_params=GREEDY))
    engine = _spec(target, drafts["llama"], **amx, enable_torch_compile=True, torch_compile_max_bs=4)
    assert _ids(engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)) == expected
    assert engine.scheduler.draft_worker.model_runner.graph_runner.compile_seconds  # the draft's decode steps
    verify = engine.scheduler.tp_worker.model_runner.graph_runner  # and the target's verify
    assert verify.capture_forward_mode.is_target_verify() and verify.compile_seconds


def test_c12_a_foreign_draft_only_costs_speed(drafts):
    # Any model with the target's vocabulary may draft; the output is still the target's.
    target = tiny_model_dir("llama")
    expected = _ids(Engine(model_path=target, **KW).generate(input_ids=PROMPTS, sampling_params=GREEDY))
    got = _spec(target, tiny_model_dir("qwen3"), 4).generate(input_ids=PROMPTS, sampling_params=GREEDY)
    assert _ids(got) == expected


def test_c12_logprobs_are_the_targets():
    # With the target as its own draft every round emits 4 tokens; each gets the logprobs of a
    # plain decode step, read off the verify's logits at the position that predicted it.
    target = tiny_model_dir("llama")
    params = {**GREEDY, "max_new_tokens": 9}
    side = dict(return_logprob=True, top_logprobs_num=2, token_ids_logprob=[[7]] * len(PROMPTS))
    plain = Engine(model_path=target, **KW).generate(input_ids=PROMPTS, sampling_params=params, **side)
    got = _spec(target, target, 3).generate(input_ids=PROMPTS, sampling_params=params, **side)
    assert _ids(got) == _ids(plain) and got[0]["meta_info"]["spec_accept_length"] > 3
    for ours, theirs in zip(got, plain):
        assert_logprobs_close(ours["meta_info"], theirs["meta_info"])


def test_c12_stops_inside_an_accepted_run():
    # With the target as its own draft every round accepts 4 tokens; stops fall inside runs.
    target = tiny_model_dir("llama")
    plain = Engine(model_path=target, disable_radix_cache=True, **KW)
    spec = _spec(target, target, 3, disable_radix_cache=True)
    first = plain.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)["output_ids"]
    for params in (
        {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True},
        {"temperature": 0, "max_new_tokens": 20, "stop_token_ids": [first[6]]},
    ):
        expected = plain.generate(input_ids=PROMPTS, sampling_params=params)
        got = spec.generate(input_ids=PROMPTS, sampling_params=params)
        assert _ids(got) == _ids(expected)
        assert [g["meta_info"]["finish_reason"] for g in got] == [e["meta_info"]["finish_reason"] for e in expected]
        # Without a radix cache nothing outlives a request: the pool is whole again.
        allocator = spec.scheduler.token_to_kv_pool_allocator
        assert allocator.available_size() == spec.scheduler.worker_info.max_total_num_tokens


def test_c12_min_new_tokens_at_batch_two_and_more(drafts):
    # min_new_tokens masks each row's stop tokens until it has that many; a verify round checks
    # k + 1 positions per row, so the mask is per position: a row one token short may stop at its
    # second position. The output is the target's, token for token.
    target = tiny_model_dir("llama")
    plain = Engine(model_path=target, **KW)
    free = {**GREEDY, "max_new_tokens": 12, "min_new_tokens": 4}  # the mask holds back EOS too
    first = _ids(plain.generate(input_ids=PROMPTS, sampling_params=free))
    # Row 1's fifth token (the first position the mask leaves free) and row 2's second become
    # stop tokens: row 1 stops right at the boundary, row 2 is held past its stop.
    params = {**free, "stop_token_ids": [first[1][4], first[2][1]]}
    expected = plain.generate(input_ids=PROMPTS, sampling_params=params)
    assert all(len(r["output_ids"]) >= 4 for r in expected)
    assert expected[1]["meta_info"]["finish_reason"]["type"] == "stop"
    for draft in (drafts["llama"], target):
        got = _spec(target, draft, 3).generate(input_ids=PROMPTS, sampling_params=params)
        assert _ids(got) == _ids(expected), draft


def test_c12_verify_applies_logit_bias(drafts):
    # A greedy batch that edits no logits takes the verify's argmax without repeat_rows
    # (SamplingBatchInfo.edits_logits); one with a logit_bias must still have it at every
    # position, or the round would emit the unbiased target's tokens.
    target = tiny_model_dir("llama")
    plain = Engine(model_path=target, **KW)
    free = _ids(plain.generate(input_ids=PROMPTS, sampling_params=GREEDY))
    params = {**GREEDY, "logit_bias": {str(free[0][2]): -100.0}}
    expected = _ids(plain.generate(input_ids=PROMPTS, sampling_params=params))
    assert expected != free  # the bias changes the target's own greedy tokens
    for draft in (drafts["llama"], target):
        assert _ids(_spec(target, draft, 3).generate(input_ids=PROMPTS, sampling_params=params)) == expected, draft


def test_c12_kv_pool_is_free_after_every_request(drafts):
    target = tiny_model_dir("llama")
    spec = _spec(target, drafts["llama"], 3)
    scheduler = spec.scheduler
    allocator, cache = scheduler.token_to_kv_pool_allocator, scheduler.tree_cache
    for prompt in PROMPTS:
        spec.generate(input_ids=prompt, sampling_params=GREEDY)
        # Every slot is free or held by the radix cache (the finished request's KV, both models').
        assert allocator.available_size() + cache.total_size() == 512
    assert scheduler.flush_cache() and allocator.available_size() == 512


def test_c12_retraction_under_speculation(drafts):
    # A pool too small for all requests' drafts: decode retracts and re-prefills both models.
    target = tiny_model_dir("llama")
    prompts = [list(range(5 + i, 25 + i)) for i in range(6)]
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    expected = _ids(Engine(model_path=target, **KW).generate(input_ids=prompts, sampling_params=params))
    spec = _spec(target, drafts["llama"], 3, max_total_tokens=160, disable_radix_cache=True)
    assert _ids(spec.generate(input_ids=prompts, sampling_params=params)) == expected
    assert spec.scheduler.num_retracted_reqs > 0
    assert spec.scheduler.token_to_kv_pool_allocator.available_size() == 160


def test_c12_draft_worker_is_a_tp_model_worker_on_the_targets_pools(drafts):
    spec = _spec(tiny_model_dir("llama"), drafts["llama"])
    draft, target = spec.scheduler.draft_worker, spec.scheduler.tp_worker
    assert isinstance(draft, StandaloneWorker) and isinstance(draft, TpModelWorker)
    assert draft.is_draft_worker and not target.is_draft_worker and draft.target_worker is target
    assert draft.get_memory_pool() == target.get_memory_pool()
    assert draft.model_config.num_hidden_layers == 1 and draft.model_config.is_draft_model
    # Each model keeps its own KV, indexed by the same slots.
    assert draft.model_runner.token_to_kv_pool is not target.model_runner.token_to_kv_pool
    assert draft.model_runner.token_to_kv_pool.size == target.model_runner.token_to_kv_pool.size


def test_c12_golden_trace_matches():
    fresh, golden = fresh_and_golden("speculative_decoding")
    assert fresh == golden, (
        "speculative trace changed: review, then python -m minisgl.tools.refresh_traces speculative_decoding"
    )


def test_c12_draft_is_built_after_the_target_and_each_round_drafts_then_verifies():
    events = fresh_and_golden("speculative_decoding")[0]
    workers = [e for e in events if e["event"] == "TpModelWorker.__init__" and e["phase"] == "begin"]
    assert [w["is_draft_worker"] for w in workers] == [False, True]
    (draft_init,) = children(events, "StandaloneWorker.__init__")
    runner = next(e for e in draft_init if e["event"] == "ModelRunner.__init__")
    assert runner["is_draft_worker"] and runner["shares_pools"]
    modes = [e["forward_mode"] for e in events if e["event"] == "ModelRunner.forward" and e["phase"] == "begin"]
    steps = 2
    # Prefill: target, then draft over the same tokens. A round: k draft decodes, one verify.
    assert modes[:2] == ["EXTEND", "DRAFT_EXTEND"]
    assert modes[2 : 2 + steps + 1] == ["DECODE"] * steps + ["TARGET_VERIFY"]
    for verify in children(events, "StandaloneWorker.verify"):
        assert [e["event"] for e in verify if e["phase"] != "end"][:2] == [
            "TpModelWorker.forward_batch_generation",
            "ForwardBatch.init_new",
        ]


def test_c12_refuses_what_it_cannot_do_exactly(drafts):
    target = tiny_model_dir("llama")
    spec = _spec(target, drafts["llama"], enable_return_hidden_states=True)
    # Refused at the front door, before anything is queued.
    with pytest.raises(ValueError, match="hidden states"):
        spec.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, return_hidden_states=True)
    with pytest.raises(ValueError, match="penalties"):
        spec.generate(input_ids=PROMPTS[0], sampling_params={**GREEDY, "frequency_penalty": 0.5})
    assert spec.generate(input_ids=PROMPTS[0], sampling_params=GREEDY)["meta_info"]["completion_tokens"] > 0
    with pytest.raises(ValueError, match="page_size 1"):
        ServerArgs(
            model_path=target, speculative_algorithm="STANDALONE", speculative_draft_model_path=target, page_size=4
        )
    with pytest.raises(ValueError, match="speculative_num_steps \\+ 1"):
        ServerArgs(
            model_path=target,
            speculative_algorithm="STANDALONE",
            speculative_draft_model_path=target,
            speculative_num_steps=2,
            speculative_num_draft_tokens=5,
        )


@pytest.mark.slow  # two ranks, target and draft, ~9 s; single-process speculation stays in the default suite
def test_c12_tensor_parallel_speculation(drafts):
    # Both workers shard over the same TP group; every rank drafts and verifies alike.
    target = tiny_model_dir("qwen3")
    expected = _ids(Engine(model_path=target, **KW).generate(input_ids=PROMPTS, sampling_params=GREEDY))
    with _spec(target, drafts["qwen3"], 3, tp_size=2) as engine:
        got = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert engine.flush_cache()
        assert engine.get_server_info()["available_kv_tokens"] == 512
    assert _ids(got) == expected


# ---- temperature > 0: the output follows the target's distribution ---------------------------

TEMPERATURE, TOP_K, NUM_TOKENS, NUM_SAMPLES = 1.0, 3, 3, 800


def _perturbed_copy(src: str, dst, std: float) -> str:
    """The target with Gaussian noise on every weight: a draft that is right about half the time."""
    shutil.copytree(src, dst)
    generator = torch.Generator().manual_seed(0)
    weights = load_file(f"{src}/model.safetensors")
    noisy = {k: v + std * torch.randn(v.shape, generator=generator) for k, v in weights.items()}
    save_file(noisy, f"{dst}/model.safetensors", metadata={"format": "pt"})
    return str(dst)


@torch.no_grad()
def _filtered_probs(model, ids: list[int]) -> torch.Tensor:
    """The sampling distribution after ids: softmax(logits / T), kept to the top k."""
    logits = model(torch.tensor([ids])).logits[0, -1].double() / TEMPERATURE
    probs = torch.softmax(logits, dim=-1)
    top = probs.topk(TOP_K)
    return torch.zeros_like(probs).scatter_(0, top.indices, top.values / top.values.sum())


def _joint(models: list, prompt: list[int]) -> dict[tuple, float]:
    """P(t1, t2, t3 | prompt), token i drawn from models[i], over the sequences it allows."""
    joint = {(): 1.0}
    for model in models:
        grown = {}
        for seq, mass in joint.items():
            probs = _filtered_probs(model, prompt + list(seq))
            for t in probs.nonzero().flatten().tolist():
                grown[seq + (t,)] = mass * float(probs[t])
        joint = grown
    return joint


def _chi_square(counts: dict, expected: dict, n: int) -> tuple[float, int, float]:
    """Pearson's test, sparse cells (expected < 5) pooled into one: (statistic, dof, p-value)."""
    stat, cells, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for seq, p in expected.items():
        obs, exp = counts.get(seq, 0), n * p
        if exp < 5:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
            continue
        stat, cells = stat + (obs - exp) ** 2 / exp, cells + 1
    if pooled_exp > 0:
        stat, cells = stat + (pooled_obs - pooled_exp) ** 2 / pooled_exp, cells + 1
    dof = cells - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))
    return stat, dof, p_value


def test_c12_sampling_follows_the_target_distribution(tmp_path):
    """800 seeded requests, 3 tokens each (1 from the prefill, 2 from a speculative round of
    2 drafts, about half of them accepted), against the target's exact joint distribution of
    the 3 tokens (top-3 of softmax(logits / T), from HF transformers). Greedy requests in the
    same batch still get the target's greedy tokens."""
    target = tiny_model_dir("llama")
    draft = _perturbed_copy(target, tmp_path / "draft", std=0.05)
    prompt = [5, 6, 7, 8]
    spec = _spec(target, draft, 2, max_total_tokens=8192, max_running_requests=512, disable_radix_cache=True)
    sampled = {"temperature": TEMPERATURE, "top_k": TOP_K, "max_new_tokens": NUM_TOKENS, "ignore_eos": True}
    params = [{**sampled, "seed": s} for s in range(NUM_SAMPLES)] + [GREEDY] * 2
    results = spec.generate(input_ids=[prompt] * (NUM_SAMPLES + 2), sampling_params=params)
    greedy = Engine(model_path=target, **KW).generate(input_ids=prompt, sampling_params=GREEDY)
    assert _ids(results[NUM_SAMPLES:]) == [greedy["output_ids"]] * 2
    results = results[:NUM_SAMPLES]
    accepted = sum(r["meta_info"]["spec_accept_token_num"] for r in results)
    assert 0.2 < accepted / sum(r["meta_info"]["spec_draft_token_num"] for r in results) < 0.8
    assert spec.scheduler.token_to_kv_pool_allocator.available_size() == 8192

    counts: dict[tuple, int] = {}
    for r in results:
        counts[tuple(r["output_ids"])] = counts.get(tuple(r["output_ids"]), 0) + 1
    p_model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    q_model = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval()
    p_joint = _joint([p_model] * NUM_TOKENS, prompt)
    assert set(counts) <= set(p_joint), "a sequence the target's top-k never allows"
    stat, dof, p_value = _chi_square(counts, p_joint, NUM_SAMPLES)
    assert p_value > 1e-3, (stat, dof, p_value)
    # Power: had every draft been kept, tokens 2-3 would follow the draft, and the test would
    # expect a statistic of about N * chi2(alternative || target), far above the null's range.
    alt_joint = _joint([p_model] + [q_model] * (NUM_TOKENS - 1), prompt)
    expected_alt_stat = NUM_SAMPLES * sum((alt_joint.get(s, 0.0) - p) ** 2 / p for s, p in p_joint.items())
    assert expected_alt_stat > 5 * (dof + 3 * (2 * dof) ** 0.5), expected_alt_stat


@pytest.mark.slow
def test_c12_smollm2_with_a_truncated_draft(smollm2, tmp_path):
    # The benchmark's setting: the real model drafting for itself with 25 of its 30 layers.
    draft = str(make_truncated_model(smollm2, tmp_path / "draft", 25))
    plain = Engine(model_path=smollm2, **KW)
    prompts = [
        plain.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in ("What is the capital of France?", "Name three colors.")
    ]
    params = {"temperature": 0, "max_new_tokens": 24}
    expected = plain.generate(prompts, params)
    got = _spec(smollm2, draft, 3).generate(prompts, params)
    assert _ids(got) == _ids(expected)
    assert all(g["meta_info"]["spec_verify_ct"] > 0 for g in got)
    assert sum(g["meta_info"]["spec_accept_token_num"] for g in got) > 0
