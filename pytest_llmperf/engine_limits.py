"""The limits of the engine a test is using (max model length, block size), published for the
duration of the test so that Hypothesis strategies drawn inside it ask the engine instead of guessing.
Kept free of Hypothesis so that the plugin imports it at no cost."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

DEFAULT_MAX_TOTAL_LEN = 4096
DEFAULT_BLOCK_SIZES = (16, 32)


@dataclass(frozen=True)
class EngineLimits:
    max_model_len: int
    block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES


_LIMITS: ContextVar[EngineLimits | None] = ContextVar("llmperf_engine_limits", default=None)


@contextlib.contextmanager
def published(max_model_len: int, block_size: int | None) -> Iterator[None]:
    """Publish an engine's limits while the block runs (one test)."""
    token = _LIMITS.set(EngineLimits(max_model_len, (block_size,) if block_size else DEFAULT_BLOCK_SIZES))
    try:
        yield
    finally:
        _LIMITS.reset(token)


def current(max_total_len: int | None = None) -> EngineLimits:
    limits = _LIMITS.get()
    if max_total_len is not None:
        return EngineLimits(max_total_len, limits.block_sizes if limits else DEFAULT_BLOCK_SIZES)
    return limits or EngineLimits(DEFAULT_MAX_TOTAL_LEN)


def published_max_model_len() -> int | None:
    """The max model length of the engine the current test uses; None outside such a test."""
    limits = _LIMITS.get()
    return limits.max_model_len if limits else None
