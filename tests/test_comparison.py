"""`side_by_side`: the comparison table of engines measured on one workload. Hand-built traces of a
named fake engine (table mechanics only; the real vLLM-beside-llama.cpp run is perf_tests/test_servers.py)."""

import pytest

from pytest_llmperf import side_by_side
from pytest_llmperf.metrics import summarize
from pytest_llmperf.trace import Chunk, RunTrace, SequenceTrace


def _result(ttft_s: float, gap_s: float):
    seqs = tuple(SequenceTrace(i, 0, 10, 3, 0.0, tuple(Chunk(ttft_s + k * gap_s, 1) for k in range(3)))
                 for i in range(4))
    return summarize([RunTrace("fake", seqs, 0.0, ttft_s + 3 * gap_s)], "h", 1)


def test_one_column_per_engine_and_a_dash_where_a_figure_is_not_measured():
    table = side_by_side({"fast": _result(0.010, 0.002), "slow": _result(0.040, 0.008)}).splitlines()
    assert table[0] == "| figure | fast | slow |"
    rows = {line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")[1:] for line in table[2:]}
    assert rows["TTFT p50 ms"] == ["10.0", "40.0"] and rows["TPOT p50 ms"] == ["2.0", "8.0"]
    assert rows["failed requests"] == ["0", "0"]
    # the fake engine reports no KV figures: "-", never a 0 that reads as measured
    assert rows["KV usage peak"] == ["-", "-"] and rows["preemptions"] == ["-", "-"]


def test_no_results_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one result"):
        side_by_side({})


def test_results_of_different_workloads_are_refused():
    """The table claims one workload; results of two read as an engine comparison and were not one."""
    from dataclasses import replace

    with pytest.raises(ValueError, match=r"different ones \(workload hashes \{'a': 'h', 'b': 'other'\}\)"):
        side_by_side({"a": _result(0.010, 0.002), "b": replace(_result(0.010, 0.002), workload_hash="other")})
