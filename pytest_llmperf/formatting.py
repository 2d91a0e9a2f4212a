"""How a number is written, everywhere the plugin writes one: failure messages, limit margins,
baseline tables and the report's cells. One module, so the terminal, summary.md and a failure text
never show one value three ways."""

from __future__ import annotations

from typing import Any


def number(x: float) -> str:
    """A metric value in a sentence: whole numbers as integers, large ones without decimals, the rest to
    four significant digits (`1025`, `936.9`, `0.04934`)."""
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def pair(old: float, new: float) -> str:
    """`old -> new` with enough digits that two different values never print alike."""
    a, b = number(old), number(new)
    if a == b and old != new:
        a, b = f"{old:.6g}", f"{new:.6g}"
    return f"{a} -> {b}"


def cell(value: Any) -> str:
    """A metric value in a table (the terminal summary and summary.md alike)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1 else f"{value:.1f}"
    return str(value)
