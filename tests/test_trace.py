"""Trace replay (`Workload.from_trace`): reading Mooncake and generic traces, windows and scaling,
prefix sharing rebuilt from `hash_ids`, requests too long for the engine, errors; and the shipped slice
of the Mooncake conversation trace replayed through real vLLM with its prefix cache."""

import importlib.util
import json
from pathlib import Path

import pytest

from pytest_llmperf import Request, Workload
from pytest_llmperf.trace_replay import predicted_prefix_hit_rate

SHIPPED = Path(__file__).resolve().parents[1] / "perf_tests" / "data" / "mooncake_conversation_head400.jsonl"


def mooncake(tmp_path, *rows, name="trace.jsonl"):
    """A Mooncake trace of (timestamp ms, input_length, output_length, hash_ids) rows."""
    path = tmp_path / name
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                            for t, i, o, h in rows))
    return path


THREE = ((0, 1500, 20, [1, 2, 3]), (1000, 1100, 5, [1, 2, 9]), (2500, 600, 7, [1, 4]))


def test_a_mooncake_trace_becomes_arrivals_lengths_and_blocks(tmp_path):
    w = Workload.from_trace(mooncake(tmp_path, *THREE))
    assert [r.arrival_s for r in w.requests] == [0.0, 1.0, 2.5]  # ms on the trace's clock, seconds here
    assert [(r.prompt_len, r.output_len) for r in w.requests] == [(1500, 20), (1100, 5), (600, 7)]
    assert w.requests[1].blocks == (1, 2, 9) and w.requests[1].block_len == 512
    assert w.kind == "trace" and w.trace.file == "trace.jsonl" and (w.trace.clipped, w.trace.skipped) == (0, 0)
    assert "trace trace.jsonl: 0 clipped, 0 skipped" in w.describe()


def test_requests_sharing_leading_block_ids_share_exactly_those_tokens(tmp_path):
    w = Workload.from_trace(mooncake(tmp_path, *THREE))
    a, b, c = (w.token_ids(i, 32000) for i in range(3))
    assert len(a) == 1500 and len(b) == 1100 and len(c) == 600  # 512-token blocks, the last one partial
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert common == 2 * 512  # [1, 2, 3] and [1, 2, 9]: two blocks
    assert a[:512] == c[:512] and a[512:600] != c[512:600]  # [1, 4]: one
    # the same block ids give the same tokens in another workload too; another salt changes them all
    again = Workload.from_trace(mooncake(tmp_path, *THREE[:1], name="other.jsonl"))
    assert again.token_ids(0, 32000) == a and w.token_ids(0, 32000, salt=1)[:512] != a[:512]


def test_a_partial_block_is_the_start_of_the_full_one():
    w = Workload((Request(40, 1, blocks=(7,), block_len=64), Request(64, 1, blocks=(7,), block_len=64)))
    assert w.token_ids(1, 32000)[:40] == w.token_ids(0, 32000)


def test_window_limit_and_time_scale(tmp_path):
    path = mooncake(tmp_path, *((t * 1000, 500, 4, [t]) for t in range(10)))
    w = Workload.from_trace(path, start=3, duration_s=4)
    assert [r.blocks for r in w.requests] == [(3,), (4,), (5,), (6,)]  # [3 s, 7 s), re-based to 0
    assert [r.arrival_s for r in w.requests] == [0.0, 1.0, 2.0, 3.0]
    fast = Workload.from_trace(path, start=3, limit=3, time_scale=0.5)  # half the gaps: twice as fast
    assert [r.arrival_s for r in fast.requests] == [0.0, 0.5, 1.0]
    offline = Workload.from_trace(path, time_scale=0)
    assert offline.is_offline and len(offline) == 10


def test_length_scale_shrinks_blocks_and_keeps_which_are_shared(tmp_path):
    w = Workload.from_trace(mooncake(tmp_path, *THREE), length_scale=1 / 16)
    # 512-token blocks become 32 tokens; each prompt keeps its blocks, its partial last one scaled too
    assert [r.block_len for r in w.requests] == [32, 32, 32]
    assert [r.prompt_len for r in w.requests] == [2 * 32 + round(476 / 16), 2 * 32 + 5, 32 + 6]
    assert [r.output_len for r in w.requests] == [1, 1, 1]  # 20/16, 5/16 and 7/16 round to at least 1
    a, b = w.token_ids(0, 32000), w.token_ids(1, 32000)
    assert a[:64] == b[:64] and a[64] != b[64]


def test_the_predicted_hit_rate_counts_leading_runs_seen_before(tmp_path):
    w = Workload.from_trace(mooncake(tmp_path, *THREE), time_scale=0)
    # the second finds blocks 1, 2 (1024 tokens); the third block 1 (512); the first finds nothing
    assert predicted_prefix_hit_rate(w, 16) == pytest.approx((1024 + 512) / (1500 + 1100 + 600))
    # at most the prompt less one token, in whole engine blocks
    same = Workload((Request(100, 1, blocks=(5,), block_len=512), Request(100, 1, blocks=(5,), block_len=512)))
    assert predicted_prefix_hit_rate(same, 32) == pytest.approx(96 / 200)


@pytest.mark.parametrize("mode, lengths, counts", [
    ("skip", [(1100, 5), (600, 7)], (0, 1)),
    ("clip", [(1180, 20), (1100, 5), (600, 7)], (1, 0)),
])
def test_too_long_requests_are_clipped_or_skipped_and_counted(tmp_path, mode, lengths, counts):
    w = Workload.from_trace(mooncake(tmp_path, *THREE), max_total_len=1200, too_long=mode)
    assert [(r.prompt_len, r.output_len) for r in w.requests] == lengths
    assert (w.trace.clipped, w.trace.skipped) == counts
    if mode == "clip":  # the prompt loses its trailing block, keeps the shared leading ones
        assert w.requests[0].blocks == (1, 2, 3) and Workload.from_trace(
            mooncake(tmp_path, *THREE), max_total_len=600, too_long="clip").requests[0].blocks == (1, 2)
    assert f"{counts[0]} clipped, {counts[1]} skipped" in w.describe()


def test_too_long_error_names_the_request_and_what_to_pass(tmp_path):
    with pytest.raises(ValueError, match=r"trace.jsonl line 1: prompt 1500 \+ output 20 = 1520 tokens is more than "
                                         r"max_total_len=1200: pass too_long='clip'.*too_long='skip'"):
        Workload.from_trace(mooncake(tmp_path, *THREE), max_total_len=1200)


def test_inside_an_engine_test_the_limit_is_the_engines_max_model_len(tmp_path):
    from pytest_llmperf import engine_limits

    with engine_limits.published(1200, 32):
        assert len(Workload.from_trace(mooncake(tmp_path, *THREE), too_long="skip")) == 2
    assert len(Workload.from_trace(mooncake(tmp_path, *THREE))) == 3


def test_a_csv_log_with_its_own_column_names(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens\n5,gpt,120,30\n7.5,gpt,80,12\n")
    cols = {"timestamp": "Timestamp", "input_length": "Request tokens", "output_length": "Response tokens"}
    w = Workload.from_trace(path, "csv", columns=cols)
    assert [(r.arrival_s, r.prompt_len, r.output_len, r.blocks) for r in w.requests] == [(0.0, 120, 30, ()),
                                                                                       (2.5, 80, 12, ())]
    assert Workload.from_trace(path, "csv", columns=cols, length_scale=0.5).requests[0].prompt_len == 60
    # a generic JSONL log with block ids in a column of its own name
    lines = tmp_path / "log.jsonl"
    lines.write_text('{"t": 1000, "in": 40, "out": 3, "ids": [4, 5]}\n')
    j = Workload.from_trace(lines, "jsonl", columns={"timestamp": "t", "input_length": "in", "output_length": "out",
                                                     "hash_ids": "ids"}, block_size=32, timestamp_unit="ms")
    assert j.requests[0].blocks == (4, 5) and j.requests[0].block_len == 32


def test_the_hash_is_stable_and_the_workload_round_trips(tmp_path):
    w = Workload.from_trace(mooncake(tmp_path, *THREE), max_total_len=1200, too_long="clip")
    assert w.hash == Workload.from_trace(mooncake(tmp_path, *THREE, name="copy.jsonl"), max_total_len=1200,
                                         too_long="clip").hash
    # a changed hash makes stored baselines stale: this value must only change on purpose
    assert w.hash == "341867bb1225aa29"
    again = Workload.from_dict(json.loads(json.dumps(w.to_dict())))
    assert again == w and again.hash == w.hash and again.trace == w.trace
    assert eval(repr(w), {"Workload": Workload}) == w
    assert w.as_offline().requests[1].blocks == (1, 2, 9)
    assert Workload.offline(4, 16, 8, seed=0).hash == "09617bb4ade6268d"  # workloads without blocks: unchanged


@pytest.mark.parametrize("text, kwargs, message", [
    (None, {}, "does not exist"),
    ('{"timestamp": 0}\n', {"format": "parquet"}, "format='parquet' is unknown: choose one of mooncake, jsonl, csv"),
    ('{"timestamp": 0, "input_length": 5}\n', {}, "line 1: no column 'output_length'"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\nnot json\n', {},
     "line 2: not valid JSON"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n', {},
     "fills 2 blocks of 512 tokens but hash_ids has 1: pass the trace's own block size"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]}\n', {}, "output_length 0 must be"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-1]}\n', {}, "hash_ids must be a list"),
    ('{"t": 0}\n', {"format": "jsonl"}, "needs columns= naming"),
    # a misspelled key dropped every block id (and the replay's prefix sharing) without a word
    ('{"t": 0}\n', {"format": "jsonl", "block_size": 16, "columns": {
        "timestamp": "t", "input_length": "i", "output_length": "o", "hash_id": "h"}},
     "columns= key 'hash_id' is none of timestamp, input_length, output_length, hash_ids (did you mean 'hash_ids'"),
    ('{"t": 0}\n', {"format": "csv", "block_size": 16, "columns": {"timestamp": "t", "input_length": "i",
                                                                   "output_length": "o"}},
     "block_size= sizes the blocks of a hash_ids column, and columns= names none"),
    ('{"timestamp": 0}\n', {"too_long": "truncate"}, "too_long='truncate' is unknown"),
    ('{"timestamp": 0}\n', {"time_scale": -1}, "time_scale must be >= 0"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n', {"start": 10},
     "no request of the trace is left"),
])
def test_bad_input_is_a_clear_error_before_anything_runs(tmp_path, text, kwargs, message):
    path = tmp_path / "t.jsonl"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Workload.from_trace(path, **kwargs)


def test_a_csv_row_with_missing_cells_is_named(tmp_path):
    path = tmp_path / "short.csv"
    path.write_text("ts,in,out\n1,10,2\n2,10\n")
    with pytest.raises(ValueError, match="line 3: 2 cells where the header has 3"):
        Workload.from_trace(path, "csv", columns={"timestamp": "ts", "input_length": "in", "output_length": "out"})


def test_the_shipped_slice_of_the_mooncake_trace():
    w = Workload.from_trace(SHIPPED)
    assert len(w) == 400 and w.requests[-1].arrival_s > 120
    # every request starts with block 0 (the service's system prompt); later turns of a conversation
    # repeat the earlier turns' blocks: request 394 shares 235 blocks with request 97
    assert all(r.blocks[0] == 0 for r in w.requests)
    assert w.requests[394].blocks[:235] == w.requests[97].blocks[:235]
    assert 0.1 < predicted_prefix_hit_rate(w, 32) < 0.2
    assert (SHIPPED.parent / "README.md").read_text().count("Apache-2.0") >= 1


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
@pytest.mark.llmperf_engine(enable_prefix_caching=True, num_gpu_blocks_override=8192)
def test_vllm_prefix_cache_serves_what_the_trace_hash_ids_predict(vllm_engine, llmperf):
    # two minutes of the production trace at 1/64 of its lengths (8-token blocks), handed over at once; the
    # KV pool (8,192 blocks of 32 tokens, 3x the window's tokens) holds every block, as the prediction assumes
    w = Workload.from_trace(SHIPPED, start=0, duration_s=120, length_scale=1 / 64, time_scale=0)
    expected = predicted_prefix_hit_rate(w, vllm_engine.config["block_size"])
    measured = llmperf.run(vllm_engine, w).kv.prefix_hit_rate
    print(f"prefix hit rate: measured {measured:.4f}, predicted from hash_ids {expected:.4f}")
    assert measured > 0 and expected > 0.05
    assert measured == pytest.approx(expected, rel=0.2)


def test_reports_show_how_many_trace_requests_were_clipped_or_skipped(tmp_path):
    from pytest_llmperf.report import result_name

    clipped = Workload.from_trace(mooncake(tmp_path, *THREE), max_total_len=1200, too_long="clip")
    assert result_name({"label": "replay", "workload": clipped.to_dict()}) == "replay (trace: 1 clipped)"
    whole = Workload.from_trace(mooncake(tmp_path, *THREE))
    assert result_name({"label": "replay", "workload": whole.to_dict()}) == "replay"
