"""Incremental detokenization (DecodeStatus): UTF-8 across token boundaries, stop strings across tokens.

The tiny tokenizer is byte-level BPE: any Unicode round-trips, and a CJK character or an
emoji spans several tokens, which is exactly where decoding token by token would show
U+FFFD. Stop strings are checked against a reference that applies OpenAI's rule at the same
granularity the scheduler delivers tokens: generation ends as soon as the text holds a stop
string, and the text is cut where it begins.
"""

import random

import pytest

from minisgl.hf_transformers_utils import get_tokenizer
from minisgl.managers.detokenizer_manager import DecodeStatus

TEXT = "Hello 世界! An emoji 😀, café, naïve — the end. 你好吗?"
LENGTH = {"type": "length", "length": 0}


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return get_tokenizer(tiny_llama)


def byte_ids(tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte: the byte-level alphabet has a token for each of the 256 bytes."""
    pre = tokenizer.backend_tokenizer.pre_tokenizer
    return tokenizer.convert_tokens_to_ids(list("".join(piece for piece, _ in pre.pre_tokenize_str(text))))


def feed(status: DecodeStatus, ids: list[int], group: int = 1, finish_reason=LENGTH) -> list[str]:
    """Deliver ids as the scheduler does, ``group`` at a time, the last group with the finish
    reason; stop early once a stop string ends the text, as the TokenizerManager does."""
    chunks = []
    for start in range(0, len(ids), group):
        last = start + group >= len(ids)
        chunks.append(status.update(ids[start : start + group], finish_reason if last else None))
        if status.matched_stop is not None:
            break
    return chunks


def reference(tokenizer, ids: list[int], stops: list[str], group: int = 1) -> str:
    for end in list(range(group, len(ids), group)) + [len(ids)]:
        text = tokenizer.decode(ids[:end])
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return text[: min(hits)]
    return tokenizer.decode(ids)


@pytest.mark.parametrize("split", ["bpe", "bytes"])
def test_multibyte_characters_are_never_split(tokenizer, split):
    ids = tokenizer.encode(TEXT) if split == "bpe" else byte_ids(tokenizer, TEXT)
    assert tokenizer.decode(ids) == TEXT
    chunks = feed(DecodeStatus(tokenizer), ids)
    assert "".join(chunks) == TEXT
    assert not any("\ufffd" in c for c in chunks)
    if split == "bytes":
        # 😀 is four byte-tokens: three empty chunks, then the whole character.
        emoji = TEXT.index("😀")
        before = len(byte_ids(tokenizer, TEXT[:emoji]))
        assert chunks[before : before + 4] == ["", "", "", "😀"]


@pytest.mark.parametrize("group", [1, 2, 3, 7, 1000])
def test_streamed_text_equals_text_decoded_at_once(tokenizer, group):
    ids = byte_ids(tokenizer, TEXT)
    streamed = "".join(feed(DecodeStatus(tokenizer), ids, group))
    at_once = DecodeStatus(tokenizer).update(ids, LENGTH)
    assert streamed == at_once == TEXT


def test_incomplete_character_at_the_end_is_flushed_on_finish(tokenizer):
    ids = byte_ids(tokenizer, "ok 😀")[:-1]  # the emoji loses its last byte
    chunks = feed(DecodeStatus(tokenizer), ids)
    assert "".join(chunks) == tokenizer.decode(ids)
    assert chunks[-1].endswith("\ufffd") and not any("\ufffd" in c for c in chunks[:-1])


@pytest.mark.parametrize("stop", ["世界!", "😀,", "the end."])
def test_stop_string_spanning_tokens_is_cut_out(tokenizer, stop):
    ids = byte_ids(tokenizer, TEXT)
    status = DecodeStatus(tokenizer, [stop])
    chunks = feed(status, ids)
    assert status.matched_stop == stop
    assert "".join(chunks) == TEXT[: TEXT.index(stop)]


def test_stop_prefix_is_held_back_until_it_resolves(tokenizer):
    text = "the end is near; the end."
    status = DecodeStatus(tokenizer, ["the end."])
    sent = ""
    for i, token_id in enumerate(byte_ids(tokenizer, text)):
        sent += status.update([token_id])
        seen = text[: i + 1]
        # What could still become the stop string is withheld; everything before it is out.
        if seen.endswith("the end"):
            assert sent == seen[: -len("the end")]
        if status.matched_stop:
            break
    assert status.matched_stop == "the end." and sent == "the end is near; "


def test_matched_stop_token_is_not_part_of_the_text(tokenizer):
    ids = tokenizer.encode("abc def")
    chunks = feed(DecodeStatus(tokenizer), ids, finish_reason={"type": "stop", "matched": ids[-1]})
    assert "".join(chunks) == tokenizer.decode(ids[:-1])


def test_random_texts_stops_and_groupings_match_the_reference(tokenizer):
    rng = random.Random(0)
    alphabet = list("abc xyz.,!\n") + ["é", "世", "界", "😀", "—", "你"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        ids = byte_ids(tokenizer, text) if rng.random() < 0.5 else tokenizer.encode(text)
        stops = []
        for _ in range(rng.randint(0, 3)):
            start = rng.randrange(len(text))
            stops.append(text[start : start + rng.randint(1, 4)] if rng.random() < 0.7 else rng.choice(alphabet) * 2)
        group = rng.choice([1, 1, 2, 3, 5])
        status = DecodeStatus(tokenizer, stops)
        chunks = feed(status, ids, group)
        streamed = "".join(chunks)
        assert streamed == reference(tokenizer, ids, stops, group), (text, stops, group)
        assert not any(s in streamed for s in stops)
        assert not any("\ufffd" in c for c in chunks)
