"""Shared settings of the perf suite. Limits suit the embedded default (the tiny shape on a CPU);
on a GPU runner, pass a real shape (`--llmperf-model shape:llama-3.1-8b`) and per-hardware limits."""

import pytest

# vLLM's CPU attention takes block sizes in multiples of 32 only; GPUs take 16 and up
CPU_BLOCK_SIZES = (32, 64)
GPU_BLOCK_SIZES = (16, 32)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "block_size" in metafunc.fixturenames:
        from pytest_llmperf.gpu import detect

        sizes = GPU_BLOCK_SIZES if detect() is not None else CPU_BLOCK_SIZES
        metafunc.parametrize("block_size", sizes)
