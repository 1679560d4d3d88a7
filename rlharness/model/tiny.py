"""Tiny character-level models built in code: the embedded default and test fixtures.

A WordLevel tokenizer over single characters (`decoders.Fuse()` joins them back),
wrapped in `PreTrainedTokenizerFast` so `AutoTokenizer` reloads it from disk, and a
small Llama-architecture model in Hugging Face format.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_CHARS = "0123456789+-*/=() ,#"
SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]


def build_char_tokenizer(chars: str = DEFAULT_CHARS):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def build_tiny_llama(vocab_size: int, *, layers: int = 2, hidden: int = 128, heads: int = 4,
                     ffn: int = 512, max_positions: int = 128, seed: int = 0,
                     pad_token_id: int = 0, bos_token_id: int = 1, eos_token_id: int = 2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
        eos_token_id=eos_token_id, attn_implementation="eager",
    )
    return LlamaForCausalLM(config)


def save_tiny_model(out_dir: str | Path, *, chars: str = DEFAULT_CHARS, seed: int = 0, **model_kwargs) -> Path:
    """A randomly initialised tiny model + tokenizer, loadable by `rlharness.model.load`."""
    out = Path(out_dir)
    tok = build_char_tokenizer(chars)
    model = build_tiny_llama(len(tok), seed=seed, pad_token_id=tok.pad_token_id,
                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **model_kwargs)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
