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
    # <think> and </think>: what a reasoning parser (`vllm serve --reasoning-parser deepseek_r1`) looks up
    for name in ("<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<think>", "</think>"):
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


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8": 1, "fp8": 1}
GATED_MLP = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"}  # gate, up and down projections
UNTIED_BY_DEFAULT = {"llama", "mistral", "qwen2"}  # transformers' default when config.json does not say


def footprint(config: dict, dtype: str) -> tuple[int, int] | None:
    """(weight bytes, KV-cache bytes per token) of a decoder from its config.json, biases and norms left
    out (well under 1%); None for an architecture this does not know."""
    try:
        h, layers, heads = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or h // heads)
        ffn = int(config.get("intermediate_size") or config["ffn_dim"])
        vocab = int(config["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    size = DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 2)
    mlp = (3 if config.get("model_type") in GATED_MLP else 2) * h * ffn
    attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim  # q and o, k and v
    tied = config.get("tie_word_embeddings", config.get("model_type") not in UNTIED_BY_DEFAULT)
    embeddings = vocab * h * (1 if tied else 2)
    weights = (embeddings + layers * (attention + mlp)) * size
    return weights, 2 * layers * kv_heads * head_dim * size


def model_config(model: ModelSpec) -> dict | None:
    """The config.json of a resolved model, where there is a local one (shapes and folders)."""
    path = Path(model.path) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def stored_name(spec: str) -> str:
    """The model's name in baselines: a shape or hub id as given, a snapshot in Hugging Face's cache by its
    hub id (its folder is named for the revision: a new revision would start a baseline of its own), another
    local folder by its own name only (`local:Llama-3.1-8B`), so that no path of this machine is stored or
    keys a baseline."""
    if spec.startswith(SHAPE_PREFIX) or (spec.count("/") == 1 and not spec.startswith(("/", ".", "~"))
                                         and not Path(spec).expanduser().exists()):
        return spec
    folder = Path(spec).expanduser().resolve()
    repo = folder.parent.parent.name
    if folder.parent.name == "snapshots" and repo.startswith("models--"):  # <cache>/models--org--name/snapshots/<rev>
        hub_id = repo.removeprefix("models--").replace("--", "/", 1)
        return hub_id if "/" in hub_id else "local:" + hub_id  # no org (gpt2): as `gpt2` given itself is named
    return "local:" + folder.name


def check_spec(spec: str) -> None:
    """`spec` checked as `--llmperf-model` takes it, loading and writing nothing (a session's option is
    checked at start, a test's marker before its body): ValueError saying what to give."""
    if spec.startswith(SHAPE_PREFIX):
        shape_config(spec[len(SHAPE_PREFIX):])
        return
    local = Path(spec).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ValueError(f"model folder {local} has no config.json: give a model folder, a hub id or shape:NAME")
        return
    if spec.count("/") != 1 or spec.startswith(("/", ".")):
        raise ValueError(f"model {spec!r} is neither a folder, a hub id (org/name) nor a shape; "
                         f"shapes: {', '.join(SHAPE_PREFIX + s for s in available_shapes())}")


def resolve_model(spec: str, cache_dir: str | None = None) -> ModelSpec:
    """Turn `--llmperf-model` into something an engine can load (no download happens here)."""
    check_spec(spec)
    if spec.startswith(SHAPE_PREFIX):
        name = spec[len(SHAPE_PREFIX):]
        config = shape_config(name)
        folder = Path(cache_dir or os.path.join(tempfile.gettempdir(), "pytest-llmperf-shapes")) / name
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "config.json"
        text = json.dumps(config, indent=1, sort_keys=True)
        _write_if_changed(target, text)
        # written whenever it differs, not only with a new config: a folder left by an earlier version of the
        # plugin in the same temporary directory gets this version's tokenizer
        tokenizer, tokenizer_config = word_tokenizer(config)
        _write_if_changed(folder / "tokenizer_config.json", json.dumps(tokenizer_config, indent=1))
        _write_if_changed(folder / "tokenizer.json", json.dumps(tokenizer))
        return ModelSpec(spec, str(folder), True, config.get("max_position_embeddings"), config.get("vocab_size"))
    local = Path(spec).expanduser()
    if local.exists():
        config = json.loads((local / "config.json").read_text())
        return ModelSpec(spec, str(local), False, config.get("max_position_embeddings"), config.get("vocab_size"))
    return ModelSpec(spec, spec, False, None, None)  # a hub id: the engine loads (and may download) it
