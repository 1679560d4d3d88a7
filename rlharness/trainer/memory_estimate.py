"""What training one micro-batch costs in memory, from the model's shape (its config.json) alone.

An estimate for `explain=true`, before anything loads: the weights, their gradients and AdamW's two
moments (only for what trains: LoRA trains its adapters), a frozen reference copy for a KL term, and
the activations one micro-batch of the longest rows keeps for the backward pass of a Llama/Qwen2-style
decoder (per token and layer: the norms', attention's and MLP's inputs and outputs; eager attention
also keeps the heads x length x length scores and probabilities), plus the vocabulary projection of
`backend.logprob_chunk_tokens` response tokens at a time (logits, log-softmax and their gradient, in
float32). `trainer.probe_longest` measures the real peak (`probe/peak_mb`); docs/operations/health.md
compares the two.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rlharness.model.load import resolve_model_path

MB = 1024 * 1024
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    positions: int | None
    tied: bool

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        """From a Hugging Face config.json (a multimodal one's `text_config`)."""
        c = config.get("text_config") or config
        hidden = int(c["hidden_size"])
        heads = int(c.get("num_attention_heads", 1))
        return cls(hidden=hidden, layers=int(c["num_hidden_layers"]), heads=heads,
                   kv_heads=int(c.get("num_key_value_heads") or heads),
                   head_dim=int(c.get("head_dim") or hidden // heads),
                   intermediate=int(c.get("intermediate_size") or 4 * hidden), vocab=int(c["vocab_size"]),
                   positions=c.get("max_position_embeddings"),
                   tied=bool(config.get("tie_word_embeddings", c.get("tie_word_embeddings", False))))

    @property
    def parameters(self) -> int:
        h, d = self.hidden, self.head_dim
        attention = h * self.heads * d * 2 + h * self.kv_heads * d * 2
        layer = attention + 3 * h * self.intermediate + 2 * h
        embeddings = self.vocab * h * (1 if self.tied else 2)
        return self.layers * layer + embeddings + h


def model_shape(path: str) -> ModelShape | None:
    """The shape in `path`'s config.json (a model folder as `model.path` takes it); None if it does not tell."""
    try:
        config = json.loads((resolve_model_path(path) / "config.json").read_text(encoding="utf-8"))
        return ModelShape.from_config(config)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def training_memory_mb(shape: ModelShape, *, dtype: str, trainable_params: int, rows: int, seq_len: int,
                       response_tokens: int, chunk_tokens: int, reference: bool, gradient_checkpointing: bool,
                       eager_attention: bool) -> dict[str, float]:
    """MB of each part for one training micro-batch of `rows` x `seq_len` tokens (module docstring)."""
    b = DTYPE_BYTES[dtype]
    weights = shape.parameters * b
    tokens = rows * seq_len
    per_token_layer = (6 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 4 * shape.intermediate) * b
    attention = 2 * rows * shape.heads * seq_len * seq_len * b if eager_attention else 0
    kept_layers = 1 if gradient_checkpointing else shape.layers  # checkpointing keeps layer inputs, recomputes one
    activations = (tokens * per_token_layer + attention) * kept_layers + tokens * shape.hidden * b * shape.layers
    logits = 3 * min(chunk_tokens, rows * response_tokens) * shape.vocab * 4
    parts = {
        "weights": weights,
        "gradients": trainable_params * b,
        "optimizer": trainable_params * 2 * b,
        "reference": weights if reference else 0,
        "activations": activations,
        "logits": logits,
    }
    out = {k: v / MB for k, v in parts.items()}
    out["total"] = sum(out.values())
    return out
