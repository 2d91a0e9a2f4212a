"""Replaying a recorded request trace as a workload (`Workload.from_trace`).

Formats:

- `"mooncake"`: the Mooncake trace release's JSONL (`timestamp` in ms, `input_length`, `output_length`,
  `hash_ids`: one id per 512-token block of the prompt, the last block partial).
- `"jsonl"` / `"csv"`: any log with one request per line or row; `columns=` names the fields, as
  {"timestamp": ..., "input_length": ..., "output_length": ...} plus "hash_ids" where the log has block
  ids (then `block_size=` is its block size). BurstGPT: {"timestamp": "Timestamp", "input_length":
  "Request tokens", "output_length": "Response tokens"}. `timestamp_unit` is "s" (the default for these),
  "ms" or "us". A CSV cell of block ids is a JSON list or ids separated by spaces.

What the options do, in this order:

1. The window: requests with `start <= timestamp < start + duration_s` (seconds on the trace's clock,
   before `time_scale`), in arrival order (a stable sort).
2. `length_scale` shrinks (or grows) every request and keeps its prefix structure: each trace block
   becomes `round(block_size * length_scale)` tokens (at least 1); a request keeps its number of blocks
   and their ids, its last partial block is scaled the same way (at least 1 token), and its output is
   `round(output_length * length_scale)` (at least 1). 0.0625 turns Mooncake's 512-token blocks into
   32-token blocks: one vLLM block each on a CPU, whose block size is 32.
3. `max_total_len` (default: the `max_model_len` of the engine the test uses, when built inside such a
   test; otherwise no limit) and `too_long`: "error" names the first request that does not fit; "clip"
   shortens its prompt (dropping trailing blocks, keeping the shared leading ones) down to 1 token, then
   its output; "skip" leaves it out. The counts are kept in `workload.trace` and shown in reports.
4. `limit`: at most that many requests (after skipping).
5. Arrival times are re-based so the first request arrives at 0 and multiplied by `time_scale`: 0.5
   replays twice as fast, 2.0 at half speed, 0 hands the whole window over at once (offline, where
   paging is deterministic).

Every problem with the file or the options is a ValueError raised here, before any engine runs.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .engine_limits import published_max_model_len
from .workload import Request, Workload

FORMATS = ("mooncake", "jsonl", "csv")
TOO_LONG = ("error", "clip", "skip")
FIELDS = ("timestamp", "input_length", "output_length")
MOONCAKE_COLUMNS = {"timestamp": "timestamp", "input_length": "input_length", "output_length": "output_length",
                    "hash_ids": "hash_ids"}
MOONCAKE_BLOCK_SIZE = 512
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(frozen=True)
class TraceInfo:
    """Where a replayed workload came from (the file's name, not its path: the same trace read from
    another checkout is the same workload) and how many requests were changed to fit."""

    file: str
    clipped: int = 0
    skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def note(self) -> str:
        return f"trace {self.file}: {self.clipped} clipped, {self.skipped} skipped"


@dataclass(frozen=True)
class Replay:
    """The options of `Workload.from_trace`, checked when made."""

    format: str = "mooncake"
    limit: int | None = None
    start: float | None = None
    duration_s: float | None = None
    time_scale: float = 1.0
    length_scale: float = 1.0
    max_total_len: int | None = None
    too_long: str = "error"
    columns: Mapping[str, str] | None = None
    block_size: int | None = None
    timestamp_unit: str | None = None

    def __post_init__(self) -> None:
        problems = [p for p in (*_choice_problems(self), *_number_problems(self)) if p]
        if problems:
            raise ValueError("Workload.from_trace: " + "; ".join(problems))

    @property
    def fields(self) -> dict[str, str]:
        """Our field name -> the trace's column name."""
        return dict(MOONCAKE_COLUMNS if self.format == "mooncake" else self.columns or {})

    @property
    def seconds_per_unit(self) -> float:
        return UNITS[self.timestamp_unit or ("ms" if self.format == "mooncake" else "s")]

    @property
    def trace_block_size(self) -> int | None:
        if self.block_size is not None:
            return self.block_size
        return MOONCAKE_BLOCK_SIZE if self.format == "mooncake" else None

    @property
    def block_len(self) -> int:
        """Tokens per trace block after `length_scale`."""
        return max(1, round((self.trace_block_size or 1) * self.length_scale))


def _choice_problems(r: Replay) -> list[str]:
    out = []
    if r.format not in FORMATS:
        out.append(f"format={r.format!r} is unknown: choose one of {', '.join(FORMATS)}")
    if r.too_long not in TOO_LONG:
        out.append(f"too_long={r.too_long!r} is unknown: choose one of {', '.join(TOO_LONG)}")
    if r.timestamp_unit is not None and r.timestamp_unit not in UNITS:
        out.append(f"timestamp_unit={r.timestamp_unit!r} is unknown: choose one of {', '.join(UNITS)}")
    if r.format in ("jsonl", "csv"):
        columns = r.columns or {}
        missing = [f for f in FIELDS if f not in columns]
        if missing:
            out.append(f"format={r.format!r} needs columns= naming the trace's {', '.join(missing)} column(s), e.g. "
                       "columns={'timestamp': 'Timestamp', 'input_length': 'Request tokens', "
                       "'output_length': 'Response tokens'}")
        known = (*FIELDS, "hash_ids")
        for key in columns:
            if key not in known:  # a misspelled "hash_ids" dropped every block id, and the prefix sharing with them
                near = difflib.get_close_matches(str(key), known, n=1)
                out.append(f"columns= key {key!r} is none of {', '.join(known)}"
                           + (f" (did you mean {near[0]!r}?)" if near else ""))
        if "hash_ids" in columns and r.block_size is None:
            out.append("a hash_ids column needs block_size= (tokens per block id in that trace)")
        if r.block_size is not None and "hash_ids" not in columns:
            out.append("block_size= sizes the blocks of a hash_ids column, and columns= names none")
    elif r.columns is not None:
        out.append("format='mooncake' has fixed columns: leave columns= out, or use format='jsonl'")
    return out


def _number_problems(r: Replay) -> list[str]:
    def bad(value: Any, ok: bool, what: str) -> str:
        return "" if value is None or ok else f"{what}, got {value!r}"

    return [
        bad(r.limit, isinstance(r.limit, int) and r.limit >= 1, "limit must be an int >= 1"),
        bad(r.start, _number(r.start) and r.start >= 0, "start must be >= 0 (seconds on the trace's clock)"),
        bad(r.duration_s, _number(r.duration_s) and r.duration_s > 0, "duration_s must be > 0"),
        bad(r.time_scale, _number(r.time_scale) and r.time_scale >= 0,
            "time_scale must be >= 0 (0.5 replays twice as fast, 0 all at once)"),
        bad(r.length_scale, _number(r.length_scale) and r.length_scale > 0, "length_scale must be > 0"),
        bad(r.max_total_len, isinstance(r.max_total_len, int) and r.max_total_len >= 2, "max_total_len must be an int >= 2"),
        bad(r.block_size, isinstance(r.block_size, int) and r.block_size >= 1, "block_size must be an int >= 1"),
    ]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class TraceRow:
    """One request as the trace recorded it (`t` in seconds from the trace's start)."""

    line: int
    t: float
    input_len: int
    output_len: int
    blocks: tuple[int, ...] = ()


def read_trace(path: str | Path, replay: Replay, seed: int = 0) -> Workload:
    """The workload of `Workload.from_trace` (the module docstring says what each option does)."""
    path = Path(path)
    rows = window(read_rows(path, replay), replay)
    limit = replay.max_total_len or published_max_model_len()
    requests, clipped, skipped = fit(rows, replay, limit, path.name)
    if not requests:
        raise ValueError(f"{path}: no request of the trace is left after the window and too_long={replay.too_long!r}: "
                         "widen start/duration_s, or raise max_total_len")
    t0 = requests[0][0].t
    timed = tuple(
        Request(p, o, arrival_s=round((row.t - t0) * replay.time_scale, 6), blocks=blocks,
                block_len=replay.block_len if blocks else 0)
        for row, p, o, blocks in requests
    )
    return Workload(timed, seed=seed, kind="trace", trace=TraceInfo(path.name, clipped, skipped))


# -- reading -------------------------------------------------------------------------------------
def read_rows(path: Path, replay: Replay) -> list[TraceRow]:
    if not path.is_file():
        raise ValueError(f"trace file {path} does not exist (or is not a file): give the path of a "
                         f"{replay.format} trace")
    records = _csv_records(path) if replay.format == "csv" else _jsonl_records(path)
    return [_row(record, line, replay, path) for line, record in records]


def _jsonl_records(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    with path.open() as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {line}: not valid JSON ({e.msg}): fix or remove that line") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path} line {line}: a JSON object per line is needed, got {type(record).__name__}")
            yield line, record


def _csv_records(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        for record in reader:
            if None in record or None in record.values():  # DictReader's marks of a long or a short row
                cells = sum(v is not None for k, v in record.items() if k is not None) + len(record.get(None) or [])
                raise ValueError(f"{path} line {reader.line_num}: {cells} cells where the header has "
                                 f"{len(reader.fieldnames or [])}: fix that row")
            yield reader.line_num, record


def _row(record: Mapping[str, Any], line: int, replay: Replay, path: Path) -> TraceRow:
    where = f"{path} line {line}"
    values = {name: _field(record, column, where) for name, column in replay.fields.items()
              if name != "hash_ids" or column in record or replay.format != "mooncake"}
    t = _float(values["timestamp"], "timestamp", where) * replay.seconds_per_unit
    row = TraceRow(line, t, _length(values["input_length"], "input_length", where),
                   _length(values["output_length"], "output_length", where),
                   _blocks(values["hash_ids"], where) if "hash_ids" in values else ())
    _check_blocks(row, replay.trace_block_size, where)
    return row


def _field(record: Mapping[str, Any], column: str, where: str) -> Any:
    if column not in record:
        raise ValueError(f"{where}: no column {column!r} (it has {', '.join(map(repr, record)) or 'none'}): "
                         "name the trace's own columns in columns={...}")
    return record[column]


def _float(value: Any, what: str, where: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = math.nan
    if not math.isfinite(out) or out < 0:
        raise ValueError(f"{where}: {what} {value!r} is not a number >= 0")
    return out


def _length(value: Any, what: str, where: str) -> int:
    number = _float(value, what, where)
    if number != int(number) or number < 1:
        raise ValueError(f"{where}: {what} {value!r} must be a whole number of tokens >= 1 "
                         "(a failed request with no tokens: drop such lines from the trace first)")
    return int(number)


def _blocks(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else [int(v) for v in text.split()]
        except ValueError:
            value = None
    if not isinstance(value, list) or any(not isinstance(b, int) or isinstance(b, bool) or b < 0 for b in value):
        raise ValueError(f"{where}: hash_ids must be a list of ints >= 0, got {str(value)[:80]!r}")
    return tuple(value)


def _check_blocks(row: TraceRow, block_size: int | None, where: str) -> None:
    if not row.blocks or block_size is None:
        return
    need = -(-row.input_len // block_size)
    if len(row.blocks) != need:
        raise ValueError(f"{where}: input_length {row.input_len} fills {need} blocks of {block_size} tokens but "
                         f"hash_ids has {len(row.blocks)}: pass the trace's own block size as block_size=")


# -- selecting and scaling -------------------------------------------------------------------------
def window(rows: Sequence[TraceRow], replay: Replay) -> list[TraceRow]:
    ordered = sorted(rows, key=lambda r: r.t)  # stable: ties keep the file's order
    lo = replay.start or 0.0
    hi = lo + replay.duration_s if replay.duration_s is not None else math.inf
    return [r for r in ordered if lo <= r.t < hi]


def scaled(row: TraceRow, replay: Replay) -> tuple[int, int]:
    """(prompt, output) after `length_scale`; the prompt keeps its number of blocks."""
    s = replay.length_scale
    output = max(1, round(row.output_len * s))
    if not row.blocks:
        return max(1, round(row.input_len * s)), output
    size, block_len = replay.trace_block_size or row.input_len, replay.block_len
    full = len(row.blocks) - 1
    last = row.input_len - full * size  # the partial last block, in trace tokens
    return full * block_len + min(block_len, max(1, round(last * s))), output


def fit(rows: Sequence[TraceRow], replay: Replay, max_total_len: int | None, name: str
        ) -> tuple[list[tuple[TraceRow, int, int, tuple[int, ...]]], int, int]:
    """Each kept row with its prompt, output and blocks; and how many rows were clipped and skipped."""
    kept: list[tuple[TraceRow, int, int, tuple[int, ...]]] = []
    clipped = skipped = 0
    for row in rows:
        if replay.limit is not None and len(kept) >= replay.limit:
            break
        prompt, output = scaled(row, replay)
        if max_total_len is None or prompt + output <= max_total_len:
            kept.append((row, prompt, output, row.blocks))
        elif replay.too_long == "skip":
            skipped += 1
        elif replay.too_long == "clip":
            clipped += 1
            kept.append(_clipped(row, prompt, output, max_total_len, replay.block_len))
        else:
            raise ValueError(_too_long_message(row, prompt, output, max_total_len, replay, name))
    return kept, clipped, skipped


def _clipped(row: TraceRow, prompt: int, output: int, cap: int, block_len: int
             ) -> tuple[TraceRow, int, int, tuple[int, ...]]:
    # the prompt gives way first (its leading blocks, the shared part, stay); the output only when
    # a 1-token prompt still leaves no room
    new_prompt = max(1, min(prompt, cap - output))
    new_output = min(output, cap - new_prompt)
    blocks = row.blocks[:-(-new_prompt // block_len)] if row.blocks else ()
    return row, new_prompt, new_output, blocks


def _too_long_message(row: TraceRow, prompt: int, output: int, cap: int, replay: Replay, name: str) -> str:
    scale = f" (after length_scale={replay.length_scale:g}; the trace has {row.input_len} + {row.output_len})" \
        if replay.length_scale != 1 else ""
    return (f"{name} line {row.line}: prompt {prompt} + output {output} = {prompt + output} tokens{scale} is more than "
            f"max_total_len={cap}: pass too_long='clip' (shorten it) or too_long='skip' (leave it out), "
            "a smaller length_scale, or a larger max_total_len")


def predicted_prefix_hit_rate(workload: Workload, cache_block: int) -> float:
    """The share of prompt tokens a prefix cache with room for everything can serve, from the block ids:
    each request (in arrival order) finds the leading run of blocks earlier requests had, as many of
    those tokens as an earlier prompt covered, rounded down to the engine's `cache_block` tokens, and
    never its whole prompt (vLLM computes at least the last token). Requests without blocks miss."""
    nodes: dict[tuple[int, int], int] = {}  # (parent node, block id) -> node: the leading runs met so far
    covered: dict[int, int] = {}  # node -> the most prompt tokens an earlier request had through it
    hits = total = 0
    for r in workload.requests:
        node, served, path, leading = 0, 0, [], True
        for depth, block in enumerate(r.blocks):
            leading = leading and (node, block) in nodes
            node = nodes.setdefault((node, block), len(nodes) + 1)
            if leading:
                served = covered[node]
            path.append((node, min((depth + 1) * r.block_len, r.prompt_len)))
        for n, tokens in path:
            covered[n] = max(covered.get(n, 0), tokens)
        hits += min(served, r.prompt_len - 1) // cache_block * cache_block
        total += r.prompt_len
    return hits / total if total else 0.0
