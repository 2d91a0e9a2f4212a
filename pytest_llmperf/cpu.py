"""The CPU a run measured on: its name in a baseline's environment (timing measured on one CPU says nothing of
another's), and whether it computes in bf16 natively (a vLLM CPU engine's dtype)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# the vector extensions that set a CPU engine's speed, widest first: /proc/cpuinfo's flag, the name shown
ISA = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512"), ("avx2", "AVX2"))
NATIVE_BF16 = frozenset({"amx_bf16", "avx512_bf16"})


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first processor /proc/cpuinfo lists; ("", {}) where there is none."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return "", frozenset()
    return parse_cpuinfo(text)


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields.get("model name", ""), frozenset(fields.get("flags", "").split())


def describe(name: str, flags: frozenset[str]) -> str:
    """`AMD EPYC (AVX2)`: the name and the widest vector extension the flags name."""
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    isa = next((shown for flag, shown in ISA if flag in flags), "")
    return f"{name} ({isa})" if isa else name


def cpu_name() -> str:
    """This machine's CPU as a baseline's environment names it."""
    return describe(*_cpuinfo())


def native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively. An x86 CPU without AVX512-BF16 or AMX emulates it (here a
    matrix product ran 75 times slower in bf16 than in float32 on an AVX2 EPYC); other CPUs are taken at
    their word (vLLM's ARM build uses bf16 where the CPU has it)."""
    flags = _cpuinfo()[1]
    if "avx2" not in flags:  # not an x86 CPU whose flags we read
        return True
    return bool(flags & NATIVE_BF16)
