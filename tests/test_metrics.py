"""Metric definitions checked on hand-built traces with exact expected numbers."""

from dataclasses import replace

import pytest

from pytest_llmperf.metrics import roofline_fraction, summarize
from pytest_llmperf.trace import Chunk, KVSample, RunTrace, SequenceTrace


def seq(index, submit, times, tokens=None, prompt=10, error=None):
    tokens = tokens or [1] * len(times)
    return SequenceTrace(index, 0, prompt, sum(tokens), submit, tuple(Chunk(t, n) for t, n in zip(times, tokens)), error)


def test_ttft_tpot_e2e_itl_follow_vllm_bench_definitions():
    # request 0: submit 0, tokens at 0.100, 0.110, 0.130 -> TTFT 100, E2E 130, TPOT (130-100)/2 = 15
    # request 1: submit 0.050, one chunk of 1 token at 0.250 then a chunk of 3 at 0.290
    #            -> TTFT 200, E2E 240, TPOT (240-200)/(4-1) = 13.333, ITL gaps: 40
    trace = RunTrace("fake", (seq(0, 0.0, [0.100, 0.110, 0.130]), seq(1, 0.050, [0.250, 0.290], [1, 3])), 0.0, 0.3)
    r = summarize([trace], "h", 2)
    assert r.ttft.max == pytest.approx(200) and r.ttft.mean == pytest.approx(150)
    assert r.e2e.max == pytest.approx(240) and r.e2e.p50 == pytest.approx(185)
    assert sorted(s.tpot for s in r.sequences) == pytest.approx([40 / 3, 15])
    assert r.itl.count == 3 and r.itl.max == pytest.approx(40) and r.itl.p50 == pytest.approx(20)
    # throughput: 7 output tokens over last completion (0.290) - first submission (0.0)
    assert r.throughput.output_tokens_per_s == pytest.approx(7 / 0.29)
    assert r.throughput.total_tokens_per_s == pytest.approx(27 / 0.29)
    assert r.throughput.requests_per_s == pytest.approx(2 / 0.29)


def test_percentiles_interpolate_linearly_like_numpy():
    trace = RunTrace("fake", tuple(seq(i, 0.0, [(i + 1) / 1000, 1.0]) for i in range(100)), 0.0, 1.0)
    r = summarize([trace], "h", 100)
    assert r.ttft.p50 == pytest.approx(50.5) and r.ttft.p99 == pytest.approx(99.01) and r.ttft.max == pytest.approx(100)
    assert [s.index for s in r.worst("ttft")] == [99, 98, 97]


def test_single_token_outputs_have_no_tpot_and_failures_are_counted():
    trace = RunTrace("fake", (seq(0, 0.0, [0.01]), seq(1, 0.0, [], error="boom")), 0.0, 0.02)
    r = summarize([trace], "h", 2)
    assert r.tpot.count == 0 and r.tpot.p99 is None
    assert r.failed == 1 and r.error_rate == 0.5 and "boom" in r.errors[0]


def test_kv_fragmentation_max_and_slot_weighted_mean():
    kv = (
        KVSample(0.1, blocks_used=4, blocks_total=10, block_size=16, tokens_stored=48, running=2, waiting=0),
        KVSample(0.2, blocks_used=2, blocks_total=10, block_size=16, tokens_stored=16, running=1, waiting=0,
                 preemptions=3, prefix_queries=100, prefix_hits=25),
        KVSample(0.3, blocks_used=0, blocks_total=10, block_size=16, tokens_stored=0, running=0, waiting=0,
                 preemptions=3, prefix_queries=100, prefix_hits=25),
    )
    trace = RunTrace("fake", (seq(0, 0.0, [0.1, 0.2]),), 0.0, 0.3, kv,
                     kv_measures=frozenset({"fragmentation", "usage", "preemptions", "prefix_hit_rate"}))
    k = summarize([trace], "h", 1).kv
    assert k.fragmentation_max == pytest.approx(0.5)  # 16 of 32 slots
    assert k.fragmentation_mean == pytest.approx(1 - 64 / 96)  # empty steps carry no weight
    assert k.usage_peak == pytest.approx(0.4) and k.blocks_peak == 4
    assert k.preemptions == 3 and k.prefix_hit_rate == pytest.approx(0.25)
    assert len(k.timeline) == 3


def test_engine_that_cannot_measure_kv_reports_none_not_zero():
    trace = RunTrace("fake", (seq(0, 0.0, [0.1, 0.2]),), 0.0, 0.3)
    r = summarize([trace], "h", 1)
    assert r.kv.fragmentation_max is None and r.kv.preemptions is None and r.gpu.memory_peak_gib is None
    assert r.flat()["kv_fragmentation_max"] is None


def test_a_limit_on_a_metric_the_engine_missed_this_run_says_why():
    """An engine that measures KV usage but missed it in one pass (a server that answered no /metrics
    scrape in time) says why, and a limit on it fails with that reason, not a generic one."""
    from pytest_llmperf import assertions
    from pytest_llmperf.assertions import MarkerError

    why = "no /metrics scrape saw a request in flight"
    seen = RunTrace("fake", (seq(0, 0.0, [0.1, 0.2]),), 0.0, 0.3,
                    (KVSample(0.1, blocks_used=2, blocks_total=10, block_size=16, tokens_stored=20, running=1, waiting=0),),
                    kv_measures=frozenset({"usage"}))
    missed = RunTrace("fake", (seq(0, 0.0, [0.1, 0.2]),), 0.0, 0.3, (), unmeasured={"usage": why})
    r = summarize([seen, missed], "h", 1)
    assert r.unmeasured == {"kv_usage_peak": why, "kv_usage_mean": why, "kv_blocks_peak": why}
    # the pass that saw it does not stand for the one that missed it in a baseline comparison either
    assert r.flat()["kv_usage_peak"] is None and r.flat()["kv_blocks_peak"] is None
    assert summarize([missed], "h", 1).unmeasured == r.unmeasured and summarize([seen], "h", 1).unmeasured == {}
    assert r.to_dict()["unmeasured"] == r.unmeasured  # results.json keeps the reason
    limit = assertions.parse("max_kv_usage", (0.9,), {}, None)
    with pytest.raises(MarkerError, match=f"did not measure kv_usage_peak in this run: {why}"):
        assertions.check(limit, [summarize([missed], "h", 1)])
    # missed in one repeat of two: the repeat that missed it may be the busiest, so the other cannot pass it
    with pytest.raises(MarkerError, match=f"did not measure kv_usage_peak in every repeat of this run: {why}"):
        assertions.check(limit, [r])


def test_block_counts_from_scrapes_that_saw_no_request_are_not_a_peak_of_0():
    """A server answered its scrapes only after the run: usage is not measured, and the blocks in use those
    idle scrapes read (0) were the peak a baseline compared, as an improvement."""
    idle = (KVSample(1.2, 0, 1000, 16, 0, 0, 0), KVSample(1.3, 0, 1000, 16, 0, 0, 0))
    trace = RunTrace("openai", (seq(0, 0.0, [0.05, 0.06]),), 0.0, 1.0, idle, kv_measures=frozenset({"preemptions"}),
                     unmeasured={"usage": "no scrape saw a request"})
    r = summarize([trace], "h", 1)
    assert r.flat()["kv_blocks_peak"] is None and r.flat()["kv_preemptions"] == 0
    assert r.unmeasured["kv_blocks_peak"] == "no scrape saw a request"


def test_goodput_counts_a_single_token_answer_as_meeting_a_tpot_limit_as_vllm_bench_does():
    single = [seq(i, 0.0, [0.05]) for i in range(4)]  # one output token: no TPOT
    r = summarize([RunTrace("fake", (*single, seq(4, 0.0, [0.05, 0.06, 0.07]), seq(5, 0.0, [], error="x")),
                            0.0, 1.0)], "h", 6)
    assert r.goodput(ttft=100) == r.goodput(ttft=100, tpot=50) == 5.0  # the failed sequence meets neither
    assert r.goodput() == 5.0  # no limit: the completed sequences, not the failed one too


def test_a_capacity_limit_s_under_may_be_given_per_hardware_whole_or_per_metric():
    from pytest_llmperf import assertions
    from pytest_llmperf.assertions import MarkerError

    classes = ("cpu", "h200")
    whole = {"h200": {"p99_ttft_ms": 250}, "default": {"p99_ttft_ms": 2000}}
    per_metric = {"p99_ttft_ms": {"h200": 250, "default": 2000}}
    for under in (whole, per_metric):
        for hardware, bound in (("h200", 250.0), ("cpu", 2000.0)):
            (limit,) = assertions.parse("min_capacity", (), {"concurrency": 4, "under": under}, hardware, classes)
            assert limit.under == (("p99_ttft_ms", bound),)
    with pytest.raises(MarkerError, match="has no value for hardware class 'cpu' and no 'default' key"):
        assertions.parse("min_capacity", (), {"concurrency": 4, "under": {"h200": {"p99_ttft_ms": 250}}}, "cpu", classes)
    with pytest.raises(MarkerError, match="names hardware class 'h20o', which is none of the classes known here"):
        assertions.parse("min_capacity", (), {"concurrency": 4, "under": {"h20o": {"p99_ttft_ms": 250}}}, "cpu", classes)


def test_repeats_pool_percentiles_and_take_median_throughput():
    fast = RunTrace("fake", (seq(0, 0.0, [0.1, 0.2]),), 0.0, 0.2)
    slow = RunTrace("fake", (seq(0, 0.0, [0.3, 0.4]),), 0.0, 0.4)
    mid = RunTrace("fake", (seq(0, 0.0, [0.2, 0.3]),), 0.0, 0.3)
    r = summarize([fast, slow, mid], "h", 1)
    assert r.repeats == 3 and r.ttft.count == 3 and r.ttft.max == pytest.approx(300)
    assert r.throughput.output_tokens_per_s == pytest.approx(2 / 0.3)
    assert [p["p50_ttft_ms"] for p in r.per_repeat] == pytest.approx([100, 300, 200])


def test_goodput_counts_sequences_meeting_every_limit():
    trace = RunTrace("fake", (seq(0, 0.0, [0.1, 0.2]), seq(1, 0.0, [0.5, 0.6])), 0.0, 1.0)
    r = summarize([trace], "h", 2)
    assert r.goodput(ttft=200) == pytest.approx(1.0)
    assert r.goodput(ttft=600, e2e=550) == pytest.approx(1.0)
    assert r.goodput(ttft=1000) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="goodput takes"):
        r.goodput(itl=3)


def test_gpu_figures_from_nvml_samples():
    from pytest_llmperf.trace import GpuSample

    gib = 1024**3
    # three sequences, at most two in flight at once; memory 10 GiB idle -> 12 GiB peak on an 80 GiB card;
    # the energy counter advances 900 J (900,000 mJ) over the pass for 6 output tokens
    seqs = (seq(0, 0.0, [0.1, 0.2]), seq(1, 0.05, [0.15, 0.25]), seq(2, 0.3, [0.4, 0.5]))
    gpu = (GpuSample(0.0, 10 * gib, 50.0, 300.0, 1_000_000, 80 * gib), GpuSample(0.2, 12 * gib, 90.0, 500.0, 1_500_000, 80 * gib),
           GpuSample(0.5, 11 * gib, 70.0, 400.0, 1_900_000, 80 * gib))
    g = summarize([RunTrace("fake", seqs, 0.0, 0.5, gpu=gpu)], "h", 3).gpu
    assert g.memory_peak_gib == pytest.approx(12) and g.memory_idle_gib == pytest.approx(10)
    assert g.memory_peak_fraction == pytest.approx(12 / 80)
    assert g.memory_per_request_mib == pytest.approx(2 * 1024 / 2)
    assert g.energy_per_token_j == pytest.approx(900 / 6)
    assert g.utilization_mean_pct == pytest.approx(70) and g.power_mean_w == pytest.approx(400)



def test_roofline_fraction_is_the_bandwidth_floor_over_the_busy_time():
    from pytest_llmperf.trace import Roofline

    kv = (KVSample(10.0, 1, 10, 16, 100, running=2, waiting=0),  # floor (100 + 100) / 1000 = 0.2 s, took 1 s
          KVSample(11.0, 1, 10, 16, 200, running=1, waiting=0),  # floor 0.3 s, took 1 s
          KVSample(12.0, 0, 10, 16, 0, running=0, waiting=0))  # idle: not counted
    trace = RunTrace("fake", (seq(0, 10.0, [10.5, 11.5]),), 10.0, 13.0, kv, roofline=Roofline(100, 1, 1000.0))
    assert roofline_fraction(trace) == pytest.approx(0.5 / 2)
    # tensor parallel over 2 cards: each reads half the weights and KV at once, so the floor halves
    split = RunTrace("fake", (seq(0, 10.0, [10.5, 11.5]),), 10.0, 13.0, kv, roofline=Roofline(100, 1, 1000.0, 2))
    assert roofline_fraction(split) == pytest.approx(0.5 / 2 / 2)
    assert roofline_fraction(RunTrace("fake", (), 0.0, 1.0, kv)) is None  # no roofline known: not measured


def test_model_footprint_matches_the_parameters_transformers_builds():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pytest_llmperf.models import available_shapes, footprint, shape_config

    for name in available_shapes():
        config = shape_config(name)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
        params = sum(p.numel() for p in model.parameters())
        weights, _ = footprint(config, "bfloat16")
        assert weights == pytest.approx(2 * params, rel=0.01), name
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 dims, K and V, bf16: 128 KiB per token
    assert footprint(shape_config("llama-3.1-8b"), "bfloat16")[1] == 128 * 1024
    assert footprint({"hidden_size": 8}, "bfloat16") is None


def _stepped_trace(stalled: set[int], steps: int = 300, running: int = 32, jitter: float = 0.0) -> RunTrace:
    """`running` sequences decoding in lockstep: every step ends one gap of each at one instant (vLLM's
    token clock), 10 ms a step, 40 ms for the `stalled` steps."""
    ends, t = [], 0.0
    for step in range(steps):
        t += 0.040 if step in stalled else 0.010 + jitter * (step % 7)
        ends.append(t)
    return RunTrace("fake", tuple(seq(i, 0.0, ends) for i in range(running)), 0.0, t)


def test_a_p99_gap_set_by_a_few_stalled_steps_is_as_uncertain_as_those_steps():
    from pytest_llmperf.metrics import itl_gap_ends, itl_gaps_ms
    from pytest_llmperf.stats import percentile_noise

    trace = _stepped_trace(stalled={50, 150, 250, 280})  # 128 of 9,568 gaps: the p99 sits on four events
    result = summarize([trace], "h", 32)
    assert result.itl.p99 == pytest.approx(40.0)
    gaps = [g for s in trace.sequences for g in itl_gaps_ms(s)]
    one_by_one = percentile_noise(gaps, 99)
    assert len(set(itl_gap_ends([trace]))) == 299  # one event per step after the first
    # resampled gap by gap, 128 stalled gaps barely vary in count and the p99 looks certain; resampled
    # step by step, whether 2, 4 or 6 stalls are drawn moves it between 10 and 40 ms
    assert one_by_one < 0.05 and result.noise["p99_itl_ms"] > 0.3
    # the gate allows the two intervals together: one stall more or fewer is no regression
    fewer = summarize([_stepped_trace({50, 150, 250})], "h", 32)
    assert fewer.itl.p99 < 20 and result.noise["p99_itl_ms"] + fewer.noise["p99_itl_ms"] > 1 - fewer.itl.p99 / 40


def test_a_steps_lines_read_one_by_one_over_http_are_one_event():
    """A client reading a stream stamps each line as it reads it: one step's 32 lines arrive some 20 us apart.
    Counted as 32 events, the p99 gap of four stalled steps looked as certain as if 128 steps had stalled
    (measured on `vllm serve`: 992 events for 33 engine steps, benchmarks/itl_steps_http.py)."""
    from pytest_llmperf.metrics import STEP_WINDOW_S, itl_gap_ends

    def read_one_by_one(trace):  # line k of a step read k x 20 us after the step ended
        return replace(trace, sequences=tuple(replace(s, chunks=tuple(replace(c, t=c.t + s.index * 20e-6)
                                                                      for c in s.chunks)) for s in trace.sequences))

    stepped = _stepped_trace(stalled={50, 150, 250, 280})
    read = read_one_by_one(stepped)
    assert 32 * 20e-6 < STEP_WINDOW_S < 0.010  # a step's lines within the window, steps 10 ms apart beyond it
    assert len(set(itl_gap_ends([read]))) == len(set(itl_gap_ends([stepped]))) == 299
    over_http, in_process = summarize([read], "h", 32), summarize([stepped], "h", 32)
    assert over_http.samples["itl"] == in_process.samples["itl"] == 299
    assert over_http.noise["p99_itl_ms"] == pytest.approx(in_process.noise["p99_itl_ms"], rel=0.05)
    assert over_http.noise["p99_itl_ms"] > 0.3
    # a stream that never pauses for the window is not one event for the whole run: steps 0.9 ms apart in-process
    fast = RunTrace("fake", tuple(seq(i, 0.0, [0.0009 * (k + 1) for k in range(400)]) for i in range(4)), 0.0, 0.4)
    assert 150 <= len(set(itl_gap_ends([fast]))) <= 399  # about one event a millisecond, never fewer


def test_gaps_of_their_own_are_resampled_one_by_one():
    from pytest_llmperf.stats import percentile_noise

    values = [float(v) for v in range(1, 200)]
    assert percentile_noise(values, 99, events=list(range(199))) == percentile_noise(values, 99)
    with pytest.raises(ValueError, match="one event per value"):
        percentile_noise(values, 99, events=[0])
    # a median of many steps stays tight whatever the grouping
    trace = _stepped_trace(stalled={50, 150, 250}, jitter=0.001)
    assert summarize([trace], "h", 32).noise["p50_itl_ms"] < 0.2


def test_a_percentile_limit_on_too_few_samples_fails_only_beyond_chance_and_says_so():
    """A p99 of 16 requests is their largest: one slow request must not fail max_p99_ms, several must,
    and a pass on so few samples is reported as proving little, never silently."""
    from pytest_llmperf import assertions

    def result(ttfts_ms):
        return summarize([RunTrace("fake", tuple(seq(i, 0.0, [t / 1000, 1.0]) for i, t in enumerate(ttfts_ms)),
                                   0.0, 1.0)], "h", len(ttfts_ms))

    limit = assertions.parse("max_p99_ms", (), {"ttft": 250}, None)
    one_slow, many_slow, fast = result([100] * 15 + [400]), result([100] * 12 + [400] * 4), result([100] * 16)
    assert one_slow.samples["ttft"] == 16 and one_slow.ttft.p99 > 250
    assert assertions.check(limit, [one_slow]) == []
    assert [v.limit.metric for v in assertions.check(limit, [many_slow])] == ["p99_ttft_ms"]
    notes = assertions.sample_notes(limit, [one_slow, fast])
    assert "> limit 250 ms" in notes[0] and "not gated: 16 samples, a p99 needs about 368" in notes[0]
    assert "the lower end of its 95% interval is within the limit" in notes[0]
    # five samples give a median no lower end at all: the limit fails when every sample is over it (it could not
    # fail at all before: a median limit on 1-5 requests passed with 5 s against 250 ms), and says so otherwise
    median = assertions.parse("max_p50_ms", (), {"ttft": 250}, None)
    all_slow, most_slow = result([5000] * 5), result([5000] * 4 + [100])
    assert [v.measured for v in assertions.check(median, [all_slow])] == [5000]
    assert [v.measured for v in assertions.check(median, [result([5000])])] == [5000]
    assert assertions.check(median, [most_slow]) == []
    assert ("5 samples give no lower end of a 95% interval: it fails only when every sample is over the limit"
            in assertions.sample_notes(median, [most_slow])[0])
    assert "holds in this sample, but proves little: not gated: 16 samples" in notes[1]
    # enough samples: the point estimate is judged as it always was
    plenty = result([100] * 395 + [400] * 5)
    assert plenty.samples["ttft"] == 400 and assertions.check(limit, [plenty])
    assert assertions.sample_notes(limit, [plenty]) == []


def test_throughput_per_gib_margins_follow_the_curve_its_test_is_judged_on():
    """With a sweep recorded, min_throughput_per_gib is judged on the sweep's best point: its margin row is
    that point's, not a plain run's beside it, per GiB of all its cards as the flat metric is (stand-in
    results of two cards: no GPU memory is measured on this CPU)."""
    from types import SimpleNamespace as NS

    from pytest_llmperf import assertions

    (limit,) = assertions.parse("min_throughput_per_gib", (), {"tokens_per_s": 10}, "h100")
    best = NS(gpu=NS(memory_peak_gib=1.0, memory_peak_all_gib=2.0), throughput=NS(output_tokens_per_s=100.0))
    sweep = NS(points=[NS(result=best)], label="sw", kind="concurrency", under={})
    plain = NS(label="plain", flat=lambda: {"output_tokens_per_s_per_gib": 5.0})
    (row,) = assertions.margins([limit], [plain], [sweep])
    assert (row["result"], row["measured"]) == ("sw", 50.0) and row["margin"] > 0
    assert assertions.check_sweeps([limit], [sweep]) == []
    (alone,) = assertions.margins([limit], [plain])  # no sweep: the plain run is what is judged
    assert (alone["result"], alone["measured"]) == ("plain", 5.0) and alone["margin"] < 0
