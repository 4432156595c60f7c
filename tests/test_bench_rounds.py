"""bench_offline.py --rounds: how the rounds of each engine become one row and one ratio."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_offline import median_round, round_ratios  # noqa: E402


def run(tok_s: float, rss: float = 1.0) -> dict:
    return {"tok_s": tok_s, "startup_s": 1.0, "peak_rss_mb": rss, "outputs": []}


def test_the_row_is_the_median_round_with_every_rounds_range():
    row = median_round([run(120, rss=3), None, run(150, rss=1), run(100, rss=2)])  # a failed round is dropped
    assert row["tok_s"] == 120 and row["peak_rss_mb"] == 3  # one real run's numbers, not a mix
    assert row["tok_s_range"] == (100, 150) and row["rounds"] == 3
    assert median_round([None, None]) is None


def test_the_ratio_pairs_each_round_with_its_own_peer_run():
    ours = [run(150), run(100), None, run(130)]
    peer = [run(100), run(100), run(90), None]
    # Rounds where either failed give no ratio; the others are each round's own.
    assert round_ratios(ours, peer) == [1.5, 1.0]
