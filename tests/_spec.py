"""What the speculative tests share: logprobs compared with a plain run's."""

import pytest

KEYS = ("input_token_logprobs", "output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


def assert_logprobs_close(ours: dict, theirs: dict, atol: float = 1e-4) -> None:
    """Same tokens at every position, logprobs equal up to float32 rounding: a verify scores a
    round's positions in one forward, where plain decoding takes one step each."""
    for key in KEYS:
        assert len(ours[key]) == len(theirs[key]), key
        for a, b in zip(ours[key], theirs[key]):
            a, b = (a,) if isinstance(a, tuple) else a, (b,) if isinstance(b, tuple) else b
            assert [t for _, t, _ in a] == [t for _, t, _ in b], key
            assert [lp for lp, _, _ in a] == pytest.approx([lp for lp, _, _ in b], abs=atol), key
