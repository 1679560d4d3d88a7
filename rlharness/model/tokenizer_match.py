"""Whether two model folders read token ids the same way: a model that scores another's tokens (PPO's
critic on the policy's responses, a distillation teacher on the student's) must give each id the same
meaning, and hold an embedding row for every id the other produces.

`tokenizer_differences(a, b)` says what differs, in words (empty: the same): the vocabulary (size,
and which tokens have other ids), the special tokens' ids, an embedding (config.json vocab_size) too
small for the other's ids, and, when asked, the chat templates. It reads tokenizers and configs, never weights.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def tokenizer_differences(a: str | Path, b: str | Path, chat_template: bool = False,
                          trust_remote_code: bool = False) -> list[str]:
    """What differs between the tokenizers (and embedding sizes) of model folders `a` and `b`."""
    from transformers import AutoConfig, AutoTokenizer

    tok_a, tok_b = (AutoTokenizer.from_pretrained(str(f), trust_remote_code=trust_remote_code) for f in (a, b))
    found = []
    vocab_a, vocab_b = tok_a.get_vocab(), tok_b.get_vocab()
    if len(vocab_a) != len(vocab_b):
        found.append(f"vocabulary of {len(vocab_a)} tokens vs {len(vocab_b)}")
    moved = sorted(t for t in vocab_a.keys() & vocab_b.keys() if vocab_a[t] != vocab_b[t])
    only_a, only_b = sorted(vocab_a.keys() - vocab_b.keys()), sorted(vocab_b.keys() - vocab_a.keys())
    if moved:
        t = moved[0]
        found.append(f"{len(moved)} token(s) with other ids (e.g. {t!r}: {vocab_a[t]} vs {vocab_b[t]})")
    if only_a or only_b:
        example = (f"{only_a[0]!r} only in the first" if only_a else f"{only_b[0]!r} only in the second")
        found.append(f"{len(only_a)} token(s) only in the first, {len(only_b)} only in the second (e.g. {example})")
    for name in SPECIAL:
        ida, idb = getattr(tok_a, name, None), getattr(tok_b, name, None)
        if ida != idb:
            found.append(f"{name} {ida} vs {idb}")
    rows = []
    for f in (a, b):
        config = AutoConfig.from_pretrained(str(f), trust_remote_code=trust_remote_code)
        rows.append(int(getattr(config.get_text_config(), "vocab_size", 0) or 0))
    # Padded embeddings (Qwen's 0.5B and 7B: 151936 and 152064 rows, one tokenizer) are fine while each
    # holds a row for every id the other's tokenizer makes.
    for (rows_here, name_here), (tok_other, name_other) in (((rows[1], "second"), (tok_a, "first")),
                                                            ((rows[0], "first"), (tok_b, "second"))):
        if rows_here < len(tok_other):
            found.append(f"the {name_here}'s embedding has {rows_here} rows (config.json vocab_size), the "
                         f"{name_other}'s tokenizer makes ids up to {len(tok_other) - 1}")
    if chat_template and getattr(tok_a, "chat_template", None) != getattr(tok_b, "chat_template", None):
        found.append("chat templates differ")
    return found
