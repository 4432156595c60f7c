"""The data train_eagle.py distils a head from: prompts, the target's greedy answers, and the
features the serving draft reads (see train_eagle.py's docstring for the recipe).

Every function returns or fills one dict per dataset, right-padded over sequences:
tokens [S, L], lengths [S] (positions with a feature), prompt_lengths [S], greedy [S, L]
(the target's token after each position), final [S, L, H] (the target's final hidden state),
first_feature (what a chain's first draft step reads: final for EAGLE, three layers' inputs
[S, L, 3H] for EAGLE3), the target's embedding and LM head, its config, and aux_layers.
"""

from __future__ import annotations

import pathlib
import re

import torch

from minisgl.tools import without_code_blocks

REPO = pathlib.Path(__file__).resolve().parents[2]
INSTRUCTIONS = (
    "Explain this to a beginner: {}",
    "Summarize this in a few sentences: {}",
    "Write a short answer to a question about this: {}",
    "What does this mean, and why does it matter? {}",
)


def repo_prompts(num_prompts: int, seed: int) -> list[str]:
    """User messages built from the repository's English prose, shuffled deterministically."""
    files = [
        REPO / "README.md",
        *sorted((REPO / "docs").rglob("*.md")),
        *sorted((REPO / "benchmarks/data").glob("*.txt")),
    ]
    prompts = []
    for path in files:
        if path.name.endswith(".zh.md") or not path.is_file():
            continue
        text = without_code_blocks(path.read_text(encoding="utf-8"))
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "")  # links -> their text
        for block in re.split(r"\n\s*\n", text):
            block = " ".join(block.split())
            if block.startswith("#"):
                prompts.append(f"What is {block.lstrip('# ')}?")
            elif len(block) >= 80 and block[0].isalpha():  # prose; tables, lists and HTML start otherwise
                excerpt = block[:240].rsplit(" ", 1)[0] if len(block) > 240 else block  # short, as chat questions are
                prompts.append(INSTRUCTIONS[len(prompts) % len(INSTRUCTIONS)].format(excerpt))
    if not prompts:
        raise FileNotFoundError(f"no prose found under {REPO}: the tool reads the repository's docs/")
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed))
    return [prompts[i] for i in order[:num_prompts]]


# General subjects for topic_prompts. None is a subject of bench_speculative.py's questions (no
# climate, sea, plants, planets, weather, fairy tales, vaccines...), so the benchmark stays unseen.
TOPICS = """the moon; volcanoes; earthquakes; the human heart; sleep; coffee; tea; bread baking; chess; football;
basketball; the Olympic Games; the Roman Empire; ancient Egypt; the pyramids; the printing press; the Industrial
Revolution; electricity; magnets; gravity; black holes; the sun; stars; comets; rainbows; thunderstorms; hurricanes;
deserts; rainforests; coral reefs; whales; dolphins; bees; ants; butterflies; dinosaurs; evolution; DNA; cells;
bacteria; the brain; memory; exercise; healthy eating; vitamins; meditation; stress; time management; public
speaking; writing an essay; job interviews; saving money; budgeting; investing; inflation; taxes; banks; credit
cards; the stock market; supply and demand; democracy; elections; the United Nations; human rights; recycling;
solar power; wind energy; electric cars; airplanes; trains; rockets; the internet; email; smartphones; passwords;
computer viruses; databases; programming in Python; recursion; sorting algorithms; binary numbers; encryption;
cloud computing; video games; photography; painting; music theory; the guitar; the piano; jazz; poetry;
Shakespeare; Greek mythology; dragons; friendship; kindness; happiness; gardening; tomatoes; cooking pasta; making
soup; pizza; chocolate; cats; dogs; horses; birds; penguins; mountains; rivers; the Amazon river; Mount Everest;
Japan; Italy; Egypt; Canada; Australia; libraries; museums; schools; teachers; homework; fractions; geometry;
triangles; probability; algebra; calculus; statistics; maps; compasses; clocks; calendars; the seasons; winter;
summer; birthdays; holidays; travel; camping; hiking; swimming; running a marathon; yoga; first aid; fire safety;
bridges; skyscrapers; cars; engines; batteries; light; sound; color; mirrors; telescopes; microscopes; the
periodic table; water; salt; sugar; plastic; glass; paper; trees; forests; flowers; mushrooms; islands; glaciers"""
TOPIC_TEMPLATES = (
    "Tell me about {}.",
    "Explain {} in simple terms.",
    "Tell me three facts about {}.",
    "Write a short poem about {}.",
    "Explain the basics of {}.",
    "What is interesting about {}?",
    "Give me some tips about {}.",
    "Describe {} to a child.",
    "Write a short story about {}.",
    "What are the pros and cons of {}?",
    "Summarize the history of {}.",
    "List five things to know about {}.",
    "Can you explain {} in two sentences?",
    "What should I know about {}?",
)


def topic_prompts(num_prompts: int, seed: int) -> list[str]:
    """Short general chat questions: a subject from TOPICS in one of TOPIC_TEMPLATES' phrasings (none
    conjugates a verb with the subject, which may be plural), the kind of message chat corpora hold
    and the benchmark asks. More self-written questions did not raise the head's acceptance on the
    benchmark's questions; 1,500 of these did, by a few hundredths at 300 steps (the tp-worker
    chapter, "Questions on a list of subjects")."""
    topics = [t.strip() for t in " ".join(TOPICS.split()).split(";")]
    pairs = [template.format(topic) for topic in topics for template in TOPIC_TEMPLATES]
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))
    return [pairs[i] for i in order[:num_prompts]]


def self_prompts(engine, num_prompts: int, seed: int) -> list[str]:
    """User messages the model writes itself: the chat template up to the user's turn, sampled (Magpie).

    Only the messages that end on their own (EOS, not the length limit) and say something
    (16 characters or more) are kept, so a few fewer than num_prompts come back.
    """
    marker = "\x00"  # a character no template emits: everything before it is the pre-query prefix
    chat = engine.tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    prefix = chat[: chat.index(marker)]
    params = [
        {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": 64, "seed": seed * 1_000_003 + i}
        for i in range(num_prompts)
    ]
    outputs = engine.generate([prefix] * num_prompts, params)
    texts = [o["text"].strip() for o in outputs if o["meta_info"]["finish_reason"]["type"] == "stop"]
    return [t for t in dict.fromkeys(texts) if len(t) >= 16]  # dict.fromkeys: duplicates dropped, order kept


def generate(model_path: str, prompts: list[str], num_self_prompts: int, seed: int, max_new_tokens: int, log=None):
    """Sequences (prompt + greedy answer token ids, prompt length) and, per sequence, the target's
    final hidden state at every position but the last (bf16) [len - 1, H], from minisgl's Engine.

    The model's own questions (self_prompts) join the given prompts, shuffled together so
    that the held-out rows sample both. Answers come back in chunks of 128 requests, which
    bounds the hidden states held as Python lists at once.
    """
    from minisgl.entrypoints.engine import Engine

    engine = Engine(model_path=model_path, dtype="bfloat16", disable_radix_cache=True, enable_return_hidden_states=True)
    try:
        own = self_prompts(engine, num_self_prompts, seed) if num_self_prompts else []
        if log:
            log(f"{len(own)} of {num_self_prompts} self-written questions kept, e.g. {own[:2]}")
        prompts = prompts + own
        order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed))
        prompts = [prompts[i] for i in order]
        tokenizer = engine.tokenizer
        chats = [[{"role": "user", "content": p}] for p in prompts]
        ids = [
            tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=True)["input_ids"] for c in chats
        ]
        params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
        sequences, features = [], []
        for start in range(0, len(ids), 128):
            chunk = ids[start : start + 128]
            outputs = engine.generate(input_ids=chunk, sampling_params=params, return_hidden_states=True)
            for prompt, out in zip(chunk, outputs):
                sequences.append((prompt + out["output_ids"], len(prompt)))
                # The last answer token is never fed back, so it has no hidden state.
                features.append(torch.tensor(out["meta_info"]["hidden_states"], dtype=torch.bfloat16))
    finally:
        engine.shutdown()
    return sequences, features


def eagle3_layers(num_layers: int) -> list[int]:
    """SGLang's default [2, n // 2, n - 3] (set_eagle3_layers_to_capture), clamped for tiny models."""
    return [min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)]


def bf16_autocast():
    """bf16 autocast where the CPU multiplies bf16 natively, else a no-op (float32 throughout)."""
    from minisgl.kernels.cpu.features import cpu_features

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled="avx512_bf16" in cpu_features())


def pack_sequences(sequences, config, embed, lm_head) -> dict:
    """Right-padded token ids, lengths and greedy tokens of the sequences, and the target's weights.

    A sequence of L tokens has features at positions 0..L-2 (its ``lengths`` entry is L - 1);
    the greedy token at position j is token j + 1, which for an answer is what the target chose.
    """
    tokens = torch.zeros(len(sequences), max(len(s) for s, _ in sequences), dtype=torch.long)
    for row, (seq, _) in enumerate(sequences):
        tokens[row, : len(seq)] = torch.tensor(seq)
    return {
        "tokens": tokens,
        "lengths": torch.tensor([len(s) - 1 for s, _ in sequences]),
        "prompt_lengths": torch.tensor([p for _, p in sequences]),
        "greedy": tokens.roll(-1, dims=1),
        "embed": embed,
        "lm_head": lm_head,
        "config": config,
    }


def engine_features(model_path: str, sequences, features) -> dict:
    """EAGLE's training data from the Engine's answers: its final hidden states are the features."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)  # only its embedding, LM head
    data = pack_sequences(
        sequences, model.config, model.get_input_embeddings().weight, model.get_output_embeddings().weight
    )
    final = torch.zeros(*data["tokens"].shape, model.config.hidden_size)
    for row, feature in enumerate(features):
        final[row, : len(feature)] = feature.float()
    return data | {"final": final, "first_feature": final, "aux_layers": []}


@torch.no_grad()
def target_features(model_path: str, sequences, eagle3: bool) -> dict:
    """Run the HF target over each sequence (teacher forcing): its final hidden states, its greedy
    tokens and, for EAGLE3, the inputs of the captured layers, right-padded (bf16 autocast where
    the CPU multiplies bf16 natively)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    n = model.config.num_hidden_layers
    data = pack_sequences(
        sequences, model.config, model.get_input_embeddings().weight, model.get_output_embeddings().weight
    )
    # The target's own argmax, not the next token: these sequences need not be its greedy answers.
    tokens, lengths, greedy = data["tokens"], data["lengths"] + 1, data["greedy"]
    captured = {}
    layers = eagle3_layers(n) if eagle3 else []
    hooks = [
        model.model.layers[i].register_forward_pre_hook(lambda _m, args, i=i: captured.__setitem__(i, args[0]))
        for i in layers
    ]
    final = torch.zeros(*tokens.shape, model.config.hidden_size)
    aux = torch.zeros(*tokens.shape, 3 * model.config.hidden_size) if eagle3 else None
    for start in range(0, len(sequences), 8):
        rows = slice(start, start + 8)
        width = int(lengths[rows].max())  # right padding to the chunk's longest: causal attention keeps it exact
        with bf16_autocast():
            final[rows, :width] = model.model(input_ids=tokens[rows, :width]).last_hidden_state.float()
        greedy[rows, :width] = model.lm_head(final[rows, :width]).argmax(-1)
        if eagle3:
            aux[rows, :width] = torch.cat([captured[i] for i in layers], dim=-1).float()
    for hook in hooks:
        hook.remove()
    return data | {"final": final, "first_feature": aux if eagle3 else final, "aux_layers": layers}
