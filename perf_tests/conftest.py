"""Shared settings of the perf suite. Limits suit the embedded default (the tiny shape on a CPU);
on a GPU runner, pass a real shape (`--llmperf-model shape:llama-3.1-8b`) and per-hardware limits."""

import pytest

from pytest_llmperf.session import hardware_class

# vLLM's CPU attention takes block sizes in multiples of 32 only; GPUs take 16 and up
CPU_BLOCK_SIZES = (32, 64)
GPU_BLOCK_SIZES = (16, 32)
KV_SLOTS = 32_768  # tokens of KV cache each block size gets: a fixed budget, whatever the machine's memory


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "block_size" in metafunc.fixturenames:
        # by the class the session judges as, so that the test ids match that class's baselines
        sizes = CPU_BLOCK_SIZES if hardware_class(metafunc.config) == "cpu" else GPU_BLOCK_SIZES
        # each size's engine as a marker (not made inside the test): the session knows it before the tests
        # run, and on a GPU starts it beside the module's other engines (--llmperf-side-by-side)
        metafunc.parametrize("block_size", [
            pytest.param(size, id=str(size),
                         marks=pytest.mark.llmperf_engine(block_size=size, num_gpu_blocks_override=KV_SLOTS // size))
            for size in sizes])
