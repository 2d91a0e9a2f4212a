"""pytest-llmperf: performance assertions for LLM inference that gate pull requests like unit tests."""

from .comparison import side_by_side
from .metrics import PerfResult
from .workload import Empirical, Fixed, LogNormal, Request, Uniform, Workload

__all__ = ["Empirical", "Fixed", "LogNormal", "PerfResult", "Request", "Uniform", "Workload", "side_by_side"]
__version__ = "0.1.0"
