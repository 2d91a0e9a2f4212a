"""Hypothesis property tests with performance limits (plugin layer, beside `plugin.py`).

Markers are normally judged after the test body. Under `@given` that is too late: Hypothesis shrinks
by re-running examples and needs each failing example to raise inside the body. So for a property test
`llmperf.run` judges the test's limits on the spot and raises `PerfLimitExceeded`, whose message holds
the violated limits with their measured values and the workload as a Python expression.

Noise: a violated limit on a deterministic paging metric (an offline workload) fails at once and
shrinks exactly. Any other violation is measured again `retries` times and fails only when every
measurement violates a limit, so timing noise never turns into Hypothesis `Flaky` errors.

Validity: an example whose client fell behind its arrival schedule, or whose engine saturated under its
open-loop load (validity.py), measured the client or the run's length, not the engine; it is measured again
up to `retries` times, and one that is never valid fails as `PerfExampleInvalid` (PERF-INVALID), never
passes as a valid one would.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import pytest

from . import assertions, remeasure
from .assertions import Limit
from .metrics import PerfResult
from .workload import Workload

PROFILE = "llmperf"
# and each registered engine's `<name>_engine` / `<name>_engine_factory` (engines.registry.fixture_names)
PLUGIN_FIXTURES = frozenset({"llmperf", "llm_engine"})


class PerfLimitExceeded(AssertionError):
    """A property-test example broke a performance limit (consistently, for noisy metrics)."""


class PerfExampleInvalid(AssertionError):
    """A property-test example was no valid measurement in any of its passes (validity.py)."""


def broke_a_limit(error: BaseException, kind: type[AssertionError] = PerfLimitExceeded) -> bool:
    """Whether a property test failed by its performance limits (`kind`: or by an example that was no valid
    measurement); Hypothesis raises the shrunk example's error, or a group of them when it found several
    distinct ones, or its Flaky error around one that did not fail again."""
    group = getattr(error, "exceptions", None)  # an exception group (the backport's on Python 3.10)
    if isinstance(group, tuple) and group:
        return all(broke_a_limit(e, kind) for e in group)
    return isinstance(error, kind)


def is_property_test(item: pytest.Item) -> bool:
    return bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False))


def register_profile() -> None:
    """Few examples (each one drives an engine), no deadline (inference is slow by nature), the health
    checks perf tests trip on purpose suppressed, derandomised under CI (a gate must be reproducible;
    Hypothesis then keeps no database), the example database otherwise (a failing workload is replayed
    first next time)."""
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        PROFILE,
        max_examples=10,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
        derandomize=os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"),  # CI=false: a local run
        print_blob=True,
    )


def apply_profile(items: Sequence[pytest.Item], config: pytest.Config) -> None:
    """The `llmperf` profile for the property tests among `items` (those that use the plugin), unless the test has its
    own `@settings` or the run chose a profile (`--hypothesis-profile`)."""
    if config.getoption("hypothesis_profile", None):
        return
    chosen = [i for i in items if is_property_test(i)]
    if not chosen:
        return
    from hypothesis import settings

    register_profile()
    profile = settings.get_profile(PROFILE)
    for item in chosen:
        fn = getattr(item.obj, "__func__", item.obj)
        if not getattr(fn, "_hypothesis_internal_settings_applied", False):
            fn._hypothesis_internal_use_settings = profile


def checker(limits: Sequence[Limit], retries: int) -> Callable[[PerfResult, Workload, Callable[[int], PerfResult]], None]:
    limits = assertions.with_default_error_limit(limits)

    def check(result: PerfResult, workload: Workload, again: Callable[[int], PerfResult]) -> None:
        passes = 1
        while result.invalid and passes <= retries:  # a stall of the host, or of the example itself
            result, passes = again(passes), passes + 1
        if result.invalid:
            raise PerfExampleInvalid(_invalid_message(result.invalid, workload, passes))
        first = assertions.check(limits, [result])
        # a violation that clears when measured again is noise, not a counterexample
        violations, measured = remeasure.violations_that_hold(limits, first, workload.is_offline,
                                                              lambda n: again(n + passes - 1), retries)
        if violations:
            raise PerfLimitExceeded(_message(violations, workload, measured))

    return check


def _invalid_message(why: str, workload: Workload, passes: int) -> str:
    head = f"llmperf: not a valid measurement in {'any of ' if passes > 1 else ''}{passes} pass{'es' if passes > 1 else ''}"
    return "\n".join([f"{head} of this workload: {why}", *_workload_lines(workload)])


def _message(violations: Sequence[assertions.Violation], workload: Workload, measured: int) -> str:
    lines = [assertions.format_violations(violations)]
    if measured > 1:
        lines.append(f"  violated in all {measured} measurements of this workload")
    return "\n".join([*lines, *_workload_lines(workload)])


def _workload_lines(workload: Workload) -> list[str]:
    """The example's workload request by request, and the expression that reproduces it as a plain test."""
    lines = [f"  workload ({workload.describe()}):"]
    lines.extend(f"    #{i}: prompt {r.prompt_len}, output {r.output_len}"
                 + (f", arrival {r.arrival_s:.3f}s" if r.arrival_s else "") + (f", n={r.n}" if r.n > 1 else "")
                 + (f", prefix {r.prefix_len} (group {r.prefix_group})" if r.prefix_len else "")
                 for i, r in enumerate(workload.requests[:20]))
    if len(workload) > 20:
        lines.append(f"    ... {len(workload) - 20} more")
    lines.append(f"  reproduce as a plain test: llmperf.run(engine, {workload!r})")
    return lines
