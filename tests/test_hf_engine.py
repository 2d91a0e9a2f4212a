"""The transformers adapter against real transformers (the tiny shape on the CPU): what a static batch may
hold, and the options it refuses before any weights load."""

import pytest

from pytest_llmperf import Request, Workload
from pytest_llmperf.engines.base import EngineError, EngineOptionError


def test_a_static_batch_never_runs_past_max_model_len(hf_engine_factory):
    """Every row of a static batch runs to the longest prompt plus the longest output: two requests that each
    fit (60 + 2, 2 + 60 of 64) ran together to 120 positions, past the model's table of learned positions
    (an IndexError on OPT) and past what the test said the engine holds."""
    engine = hf_engine_factory(max_model_len=64)
    trace = engine.run(Workload((Request(60, 2), Request(2, 60)), seed=1))
    first, second = sorted(trace.sequences, key=lambda s: s.index)
    assert not first.error and not second.error
    assert second.chunks[0].t >= first.chunks[-1].t  # the second request waited for the next batch


@pytest.mark.parametrize("options, said", [
    ({"max_batch_size": 0}, "max_batch_size=0: give a whole number of sequences, 1 or more"),
    ({"max_batch_size": "8"}, "max_batch_size='8'"),
    ({"max_model_len": 100_000}, "max_model_len=100000 is more than 'shape:tiny-llama' has positions for"),
])
def test_options_it_cannot_run_with_are_refused_at_start(hf_engine_factory, options, said):
    with pytest.raises(EngineOptionError, match=said.replace("(", r"\(").replace(")", r"\)")):
        hf_engine_factory(**options)


def test_an_engine_run_after_its_shutdown_says_so(hf_engine_factory):
    engine = hf_engine_factory(max_batch_size=3)
    engine.shutdown()
    with pytest.raises(EngineError, match="this hf engine was shut down"):
        engine.run(Workload.offline(2, 8, 3))
