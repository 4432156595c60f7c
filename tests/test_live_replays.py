"""Issue 33's attacks replayed against a real server (benchmarks/live_replays.py), asserted.

A JSON schema of 2,000 string properties is a 400 naming MAX_JSON_SCHEMA_NODES; the largest
of that shape under the limit compiles (or is aborted naming --grammar-compile-timeout) and
requests without it are answered while it compiles. A 24 MB /tokenize is a 400 naming the
context, /health answers meanwhile, and the server's RSS is back within 10% afterwards.
Nothing here times anything: the benchmark prints the latencies.
"""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

from live_replays import replay_grammar, replay_tokenize, running_server  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_llama):
    with running_server(tiny_llama, "--grammar-compile-timeout", "60") as url_pid:
        yield url_pid


def _served(row: dict) -> list[int]:
    return [status for probes in row["during"].values() for _, _, status in probes]


def test_a_2000_property_schema_is_bounded_and_others_are_served(server):
    url, _ = server
    refused, largest = replay_grammar(url, [2000, 998])
    assert refused["status"] == 400 and "the limit is MAX_JSON_SCHEMA_NODES = 1000" in refused["body"]
    assert largest["status"] == 200 or "--grammar-compile-timeout" in largest["body"], largest["body"]
    served = _served(largest)
    assert served and all(s == 200 for s in served), "requests without a grammar wait for the compilation"
    assert all(s == 200 for s in _served(refused))


def test_a_24_mb_tokenize_is_refused_and_memory_comes_back(server):
    url, pid = server
    huge, longest = replay_tokenize(url, pid, 24)
    assert huge["status"] == 400 and "context can hold" in huge["body"]
    health = huge["during"]["/health"]
    assert health and all(status == 200 for _, _, status in health), "/health stalled behind /tokenize"
    before, _, after = huge["rss"]
    assert after <= 1.1 * before
    assert longest["status"] == 200 and longest["body"].startswith('{"tokens":[')
