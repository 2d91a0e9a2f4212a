"""The CPU a run names in its baseline's environment, and a vLLM CPU engine's dtype (pure: /proc/cpuinfo texts)."""

from pytest_llmperf import cpu
from pytest_llmperf.engines.vllm import cpu_env

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma

processor\t: 1
model name\t: something else
flags\t\t: avx512f avx512_bf16
"""
XEON = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_the_cpu_is_named_by_its_first_processor_and_widest_vector_extension():
    assert cpu.parse_cpuinfo(EPYC) == ("AMD EPYC", frozenset({"fpu", "sse2", "avx", "avx2", "fma"}))
    assert cpu.describe(*cpu.parse_cpuinfo(EPYC)) == "AMD EPYC (AVX2)"
    assert cpu.describe(*cpu.parse_cpuinfo(XEON)) == "Intel(R) Xeon(R) Platinum 8480+ (AMX)"
    assert cpu.describe("Neoverse", frozenset({"asimd"})) == "Neoverse"
    assert cpu.cpu_name()  # this machine's, whatever it is


def test_a_vllm_cpu_engine_computes_in_bf16_only_where_the_cpu_does(monkeypatch):
    for text, native in ((EPYC, False), (XEON, True), ("processor\t: 0\nFeatures\t: fp asimd bf16\n", True)):
        monkeypatch.setattr(cpu, "_cpuinfo", lambda text=text: cpu.parse_cpuinfo(text))
        assert cpu.native_bf16() is native
    # float32 takes twice the bytes per value: twice the KV space, the same number of blocks
    assert int(cpu_env("float32")["VLLM_CPU_KVCACHE_SPACE"]) == 2 * int(cpu_env("bfloat16")["VLLM_CPU_KVCACHE_SPACE"])
