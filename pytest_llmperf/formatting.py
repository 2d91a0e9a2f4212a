"""How a number is written, everywhere the plugin writes one: failure messages, limit margins,
baseline tables and the report's cells. One module, so the terminal, summary.md and a failure text
never show one value three ways."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable
from typing import Any


def number(x: float) -> str:
    """A metric value in a sentence: whole numbers as integers, large ones without decimals, the rest to
    four significant digits (`1025`, `936.9`, `0.04934`)."""
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def apart(old: Any, new: Any, write: Callable[[Any], str] = number) -> tuple[str, str]:
    """Two values as `write` writes them, with more digits where it would print two different values alike
    (an exact paging metric that moved in its fifth digit); a value not measured (None) as "-"."""
    a, b = (write(v) if v is not None else "-" for v in (old, new))
    if a == b and old != new and isinstance(old, float | int) and isinstance(new, float | int):
        digits = next((d for d in range(6, 18) if f"{old:.{d}g}" != f"{new:.{d}g}"), 17)  # 17 tell two floats apart
        a, b = f"{old:.{digits}g}", f"{new:.{digits}g}"
    return a, b


def pair(old: float, new: float) -> str:
    """`old -> new` with enough digits that two different values never print alike."""
    a, b = apart(old, new)
    return f"{a} -> {b}"


def closest(given: Iterable[str], taken: Collection[str]) -> list[tuple[str, str]]:
    """(name, the taken name it most resembles) for each given name not taken that is close to one: the guess
    an error about a typo offers."""
    out = []
    for name in given:
        if name not in taken and (match := difflib.get_close_matches(name, list(taken), n=1)):
            out.append((name, match[0]))
    return out


def change(fraction: float | None) -> str:
    """A relative change (`+12.3%`); one under a twentieth of a percent with the digits that show it is not 0;
    none (a value not measured) as "-"."""
    if fraction is None:
        return "-"
    text = f"{fraction:+.1%}"
    if fraction != 0 and float(text[:-1]) == 0:
        text = f"{fraction * 100:+.2g}%"
    return text


def cell(value: Any) -> str:
    """A metric value in a table (the terminal summary and summary.md alike)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1 else f"{value:.1f}"
    return str(value)
