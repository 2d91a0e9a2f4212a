"""What `--llmperf-model` names: a local folder, a hub id, or `shape:NAME`.

A shape is an architecture config shipped in `pytest_llmperf/shapes/` and run with random weights, so
a runner measures a 7B model's speed without downloading it. Shapes are written to a cache folder as
a model directory that both transformers and vLLM can load: `config.json`, and a word tokenizer (token
id k <-> the word `wk`, one token per word, with a chat template) so that servers can take text and chat
requests and stream text back. Its ids cover the whole vocabulary, so random weights can emit any id.
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


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def word_tokenizer(config: dict) -> tuple[dict, dict]:
    """A WordLevel `tokenizer.json` and its `tokenizer_config.json` for a shape: id k is the word `wk`,
    except the config's special ids and the chat role markers, which take the lowest free ids."""
    vocab_size = int(config["vocab_size"])
    names: dict[int, str] = {}
    for key, name in (("bos_token_id", "<s>"), ("eos_token_id", "</s>"), ("pad_token_id", "<pad>")):
        if isinstance(config.get(key), int) and config[key] not in names:
            names[config[key]] = name
    free = (k for k in range(vocab_size) if k not in names)
    for name in ("<unk>", "<|system|>", "<|user|>", "<|assistant|>"):
        names[next(free)] = name
    vocab = {names.get(k, f"w{k}"): k for k in range(vocab_size)}
    added = [{"id": k, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, name in sorted(names.items())]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
                 "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    by_id = {v: k for k, v in names.items()}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
                        "model_max_length": int(config.get("max_position_embeddings") or 4096),
                        "unk_token": "<unk>", "add_bos_token": False, "add_eos_token": False}
    for role, name in (("bos_token", "<s>"), ("eos_token", "</s>"), ("pad_token", "<pad>")):
        if name in by_id:
            tokenizer_config[role] = name
    return tokenizer, tokenizer_config


def _write_if_changed(target: Path, text: str) -> bool:
    if target.exists() and target.read_text() == text:
        return False
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, target)  # atomic: parallel workers may write the same shape
    return True


def resolve_model(spec: str, cache_dir: str | None = None) -> ModelSpec:
    """Turn `--llmperf-model` into something an engine can load (no download happens here)."""
    if spec.startswith(SHAPE_PREFIX):
        name = spec[len(SHAPE_PREFIX):]
        config = shape_config(name)
        folder = Path(cache_dir or os.path.join(tempfile.gettempdir(), "pytest-llmperf-shapes")) / name
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "config.json"
        text = json.dumps(config, indent=1, sort_keys=True)
        if _write_if_changed(target, text) or not (folder / "tokenizer.json").exists():
            tokenizer, tokenizer_config = word_tokenizer(config)
            _write_if_changed(folder / "tokenizer_config.json", json.dumps(tokenizer_config, indent=1))
            _write_if_changed(folder / "tokenizer.json", json.dumps(tokenizer))
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
