"""What `--llmperf-model` names: a local folder, a hub id, or `shape:NAME`.

A shape is an architecture config shipped in `pytest_llmperf/shapes/` and run with random weights, so
a runner measures a 7B model's speed without downloading it. Shapes are written to a cache folder as
a one-file model directory (`config.json`) that both transformers and vLLM can load.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

DEFAULT_MODEL = "shape:tiny-llama"
SHAPE_PREFIX = "shape:"


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: `path` is what engines load; `is_shape` means random (dummy) weights."""

    name: str
    path: str
    is_shape: bool
    max_position_embeddings: int | None
    vocab_size: int | None


def available_shapes() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("pytest_llmperf.shapes").iterdir() if p.name.endswith(".json"))


def shape_config(name: str) -> dict:
    path = resources.files("pytest_llmperf.shapes") / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown model shape {name!r}: choose one of {', '.join(available_shapes())}")
    return json.loads(path.read_text())


def resolve_model(spec: str, cache_dir: str | None = None) -> ModelSpec:
    """Turn `--llmperf-model` into something an engine can load (no download happens here)."""
    if spec.startswith(SHAPE_PREFIX):
        name = spec[len(SHAPE_PREFIX):]
        config = shape_config(name)
        folder = Path(cache_dir or os.path.join(tempfile.gettempdir(), "pytest-llmperf-shapes")) / name
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "config.json"
        text = json.dumps(config, indent=1, sort_keys=True)
        if not target.exists() or target.read_text() != text:
            tmp = folder / f".config.{os.getpid()}.json"
            tmp.write_text(text)
            os.replace(tmp, target)  # atomic: parallel workers may write the same shape
        return ModelSpec(spec, str(folder), True, config.get("max_position_embeddings"), config.get("vocab_size"))
    local = Path(spec).expanduser()
    if local.exists():
        cfg_file = local / "config.json"
        if not cfg_file.is_file():
            raise ValueError(f"model folder {local} has no config.json: give a model folder, a hub id or shape:NAME")
        config = json.loads(cfg_file.read_text())
        return ModelSpec(spec, str(local), False, config.get("max_position_embeddings"), config.get("vocab_size"))
    if spec.count("/") == 1 and not spec.startswith(("/", ".")):
        return ModelSpec(spec, spec, False, None, None)  # a hub id: the engine loads (and may download) it
    raise ValueError(
        f"--llmperf-model {spec!r} is neither a folder, a hub id (org/name) nor a shape; "
        f"shapes: {', '.join(SHAPE_PREFIX + s for s in available_shapes())}"
    )
