"""The workload model: determinism, hashing, distributions and bad input."""

import pytest

from pytest_llmperf import Empirical, LogNormal, Request, Workload
from pytest_llmperf import strategies as lst


def test_same_seed_same_workload_and_tokens():
    a = Workload.poisson(qps=5, n=50, prompt_len=(8, 300), output_len=LogNormal(mean=64, sigma=0.5), seed=3)
    b = Workload.poisson(qps=5, n=50, prompt_len=(8, 300), output_len=LogNormal(mean=64, sigma=0.5), seed=3)
    assert a == b and a.hash == b.hash
    assert a.token_ids(7, 32000) == b.token_ids(7, 32000)
    c = Workload.poisson(qps=5, n=50, prompt_len=(8, 300), output_len=LogNormal(mean=64, sigma=0.5), seed=4)
    assert c.hash != a.hash


def test_hash_is_stable_across_releases():
    # a changed hash silently makes every stored baseline stale: this value must only change on purpose
    assert Workload.offline(4, 16, 8, seed=0).hash == "09617bb4ade6268d"


def test_uniform_range_is_inclusive_and_poisson_arrivals_increase():
    w = Workload.poisson(qps=10, n=400, prompt_len=(5, 7), output_len=3, seed=1)
    assert {r.prompt_len for r in w.requests} == {5, 6, 7}
    arrivals = [r.arrival_s for r in w.requests]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals)
    # mean gap 1/qps within sampling error
    assert 0.08 < arrivals[-1] / 399 < 0.12


def test_burstiness_changes_spread_not_rate():
    smooth = Workload.poisson(qps=10, n=2000, prompt_len=8, output_len=8, seed=1, burstiness=8.0)
    bursty = Workload.poisson(qps=10, n=2000, prompt_len=8, output_len=8, seed=1, burstiness=0.25)

    def gaps(w):
        a = [r.arrival_s for r in w.requests]
        return [y - x for x, y in zip(a[1:], a[2:])]

    import numpy as np

    assert np.std(gaps(bursty)) > 3 * np.std(gaps(smooth))
    assert abs(np.mean(gaps(bursty)) - np.mean(gaps(smooth))) < 0.02


def test_lognormal_mean_and_empirical_histogram():
    import numpy as np

    w = Workload.offline(4000, LogNormal(mean=200, sigma=0.6), 8, seed=2)
    assert abs(np.mean([r.prompt_len for r in w.requests]) - 200) < 10
    e = Workload.offline(1000, Empirical(values=(32, 512), weights=(3, 1)), 8, seed=2)
    share = sum(r.prompt_len == 32 for r in e.requests) / 1000
    assert 0.7 < share < 0.8 and {r.prompt_len for r in e.requests} == {32, 512}
    assert Empirical.from_samples([5, 5, 9]) == Empirical((5, 9), (2.0, 1.0))


def test_shared_prefix_tokens_are_shared_within_a_group_only():
    w = Workload.shared_prefix(n=6, prefix_len=64, suffix_len=(4, 12), output_len=8, groups=2, seed=5)
    t = [w.token_ids(i, 32000) for i in range(6)]
    assert t[0][:64] == t[2][:64] == t[4][:64]
    assert t[0][:64] != t[1][:64]
    assert t[0][64:] != t[2][64:]
    # another salt (warm-up, repeats) shares nothing with the measured pass
    assert w.token_ids(0, 32000, salt=1)[:64] != t[0][:64]


def test_a_session_turn_carries_the_conversation_so_far_and_its_own_new_message():
    w = Workload.sessions(3, turns=3, message_len=(8, 16), output_len=(4, 8), think_s=0.5, qps=2,
                          system_prompt_len=32, seed=1)
    assert w.turns == (0, 1, 2) * 3 and not w.is_offline and w.kind == "sessions"
    ids = [w.token_ids(i, 32000) for i in range(len(w))]
    assert [len(t) for t in ids] == [r.prompt_len for r in w.requests]
    for i, r in enumerate(w.requests):
        before = w.previous_turn(i)
        if r.turn == 0:
            assert before is None and r.think_s == 0 and ids[i][:32] == ids[0][:32]  # the shared system prompt
        else:  # the previous prompt, its answer's stand-in, then a new message
            assert before == i - 1 and r.think_s == 0.5 and r.arrival_s == 0
            assert ids[i][:len(ids[before])] == ids[before]
            assert r.prompt_len > w.requests[before].total_len
    starts = [r.arrival_s for r in w.requests if r.turn == 0]
    assert starts[0] == 0 and starts == sorted(starts) and starts[-1] > 0
    again = Workload.from_dict(w.to_dict())
    assert again == w and again.hash == w.hash
    assert eval(repr(w), {"Workload": Workload}) == w
    # sessions dropped (for the warm-up's offline gate): every prompt keeps its length
    flat = w.as_offline()
    assert flat.is_offline and flat.turns == () and [r.prompt_len for r in flat.requests] == [r.prompt_len for r in w.requests]


def test_closed_loop_and_round_trip():
    w = Workload.closed_loop(concurrency=4, n=10, prompt_len=(10, 20), output_len=(1, 5), seed=9)
    assert w.concurrency == 4 and not w.is_offline
    again = Workload.from_dict(w.to_dict())
    assert again == w and again.hash == w.hash
    assert eval(repr(w), {"Workload": Workload}) == w


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Workload(()), "at least one request"),
        (lambda: Request(prompt_len=-3, output_len=4), "prompt_len=-3"),
        (lambda: Request(prompt_len=3, output_len=0), "output_len=0"),
        (lambda: Request(prompt_len=3, output_len=2, n=0), "n=0"),
        (lambda: Workload.offline(0, 8, 8), "n >= 1"),
        (lambda: Workload.offline(3, (9, 2), 8), "empty"),
        (lambda: Workload.offline(3, "long", 8), "not a length"),
        (lambda: Workload.poisson(qps=0, n=3, prompt_len=8, output_len=8), "qps > 0"),
        (lambda: Workload.sessions(0, 3, 8, 4), "n_sessions >= 1"),
        (lambda: Request(8, 4, turn=1), "turn and think_s need a session"),
        (lambda: Request(8, 4, session=0, n=2), "n=1"),
        (lambda: Request(40, 4, session=0, turn=1, arrival_s=1.0), "leave arrival_s"),
        (lambda: Workload((Request(8, 4, session=0), Request(20, 4, session=0, turn=2))), "follows turn 0"),
        (lambda: Workload((Request(8, 4, session=0), Request(12, 4, session=0, turn=1))),
         "history alone .turn 0's prompt and answer. is 12 tokens"),
        (lambda: Workload((Request(8, 4, session=0),), concurrency=2), "closed loop"),
        # NaN and infinity passed the comparisons and drew `lo` for every request; a float range was truncated
        (lambda: Workload.offline(3, LogNormal(mean=float("nan"), sigma=0.5), 8), "finite mean"),
        (lambda: Workload.offline(3, LogNormal(mean=200, sigma=float("inf")), 8), "finite mean"),
        (lambda: Workload.offline(3, LogNormal(mean=200, sigma=0.5, lo=50, hi=10), 8), "1 <= lo <= hi"),
        (lambda: Workload.offline(3, (1.9, 3.9), 8), "two whole numbers"),
        (lambda: Workload.closed_loop(2.5, 4, 8, 8), "whole number of requests in flight"),
        (lambda: Workload.closed_loop(True, 4, 8, 8), "whole number of requests in flight"),
        (lambda: lst.lengths(1, 100, block_sizes=(0,)), "block sizes of 1 token or more"),
        (lambda: lst.requests(max_total_len=1).example(), "a request needs 2 or more"),
        # Hypothesis's own errors named min_value and max_value, which the caller never gave
        (lambda: lst.workloads(arrivals=()).example(), "workloads needs arrivals: one kind, or a tuple of kinds"),
        (lambda: lst.workloads(arrivals="closed_loop", max_concurrency=0).example(), "whole max_concurrency >= 1"),
        (lambda: lst.workloads(arrivals="closed_loop", max_concurrency=True).example(), "whole max_concurrency >= 1"),
        (lambda: lst.workloads(arrivals="poisson", max_qps=0).example(), "finite max_qps > 0"),
        # infinity was a due time: the run waited forever before sending it; NaN named neither qps nor burstiness
        (lambda: Request(8, 4, arrival_s=float("inf")), "arrival_s=inf must be a finite number"),
        (lambda: Workload.sessions(2, 2, 8, 4, think_s=float("inf")), "think_s=inf must be a finite number"),
        (lambda: Workload.poisson(qps=float("nan"), n=3, prompt_len=8, output_len=8), "finite qps > 0"),
        (lambda: Workload.poisson(qps=2, n=3, prompt_len=8, output_len=8, burstiness=float("inf")), "finite qps > 0"),
        (lambda: Workload.sessions(2, 2, 8, 4, qps=float("inf")), "finite qps > 0"),
        # numpy's own error named no seed
        (lambda: Workload.offline(3, 8, 8, seed=-1), "seed=-1 must be a whole number >= 0"),
        (lambda: Workload((Request(8, 4),), seed=1.5), "seed=1.5 must be a whole number"),
    ],
)
def test_bad_input_is_a_clear_error(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_a_slow_engines_max_qps_below_a_half_is_taken_and_numpy_values_too():
    import numpy as np

    w = lst.workloads(arrivals="poisson", min_requests=3, max_requests=3, max_qps=0.2).example()
    assert w.kind == "poisson" and len(w) == 3
    assert lst.workloads(arrivals="poisson", min_requests=1, max_requests=2, max_qps=np.int64(8)).example().kind == "poisson"
    loop = lst.workloads(arrivals="closed_loop", max_requests=2, max_concurrency=np.int64(4)).example()
    assert 1 <= loop.concurrency <= 4


def test_whole_numbers_given_as_floats_or_numpy_values_are_the_same_workload():
    import numpy as np

    # a numpy seed (`parametrize("seed", np.arange(3))`) built and ran, then the hash failed after the measured pass
    assert Workload.offline(3, 8, 8, seed=np.int64(2)).hash == Workload.offline(3, 8, 8, seed=2).hash

    plain = Workload.closed_loop(4, 8, (16, 32), 8, seed=3)
    for concurrency, prompt in ((4.0, (16.0, 32)), (np.int64(4), (np.int64(16), 32)), (4, (np.float64(16), 32.0))):
        again = Workload.closed_loop(concurrency, 8, prompt, 8, seed=3)
        assert again.concurrency == 4 and type(again.concurrency) is int and again.hash == plain.hash
