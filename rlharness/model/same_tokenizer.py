"""Whether a second model reads the run's token ids as the policy does (a distillation teacher today;
a PPO critic from another folder could ask the same).

A model that scores the policy's token ids, rather than its text, must give each id the same
meaning: same vocabulary entries at the same ids (it may have more after them), the same special
tokens, and the same ids for the task's text (normalisers and merges can differ with one vocabulary).
"""

from __future__ import annotations

from typing import Callable, Iterable

SPECIAL_IDS = ("eos_token_id", "bos_token_id")
SHOWN_IDS = 12  # ids shown of a text whose encodings differ


def tokenizer_difference(policy, other, texts: dict[str, Iterable[str]],
                         encode_policy: Callable[[str], list[int]],
                         encode_other: Callable[[str], list[int]]) -> str | None:
    """How `other` (a tokenizer) differs from `policy`'s on ids, or None where it agrees.

    `texts`: label -> texts (a task's prompts), each encoded by both (`encode_*`: as the run encodes,
    special tokens included). The first difference found is described, naming the label and index."""
    policy_vocab, other_vocab = policy.get_vocab(), other.get_vocab()
    moved = [t for t, i in policy_vocab.items() if other_vocab.get(t) != i]
    if moved:
        t = min(moved, key=policy_vocab.__getitem__)
        where = f"id {other_vocab[t]}" if t in other_vocab else "no id"
        return (f"its vocabulary differs: {len(moved)} of the policy's {len(policy_vocab)} tokens have another id "
                f"(e.g. {t!r}: policy id {policy_vocab[t]}, here {where})")
    for name in SPECIAL_IDS:
        mine, theirs = getattr(policy, name), getattr(other, name)
        if mine != theirs:
            return f"its {name} is {theirs}, the policy's {mine}"
    for label, items in texts.items():
        for index, text in enumerate(items):
            a, b = encode_policy(text), encode_other(text)
            if a != b:
                return (f"{label} prompt {index} encodes to other ids: {b[:SHOWN_IDS]}{'...' if len(b) > SHOWN_IDS else ''}"
                        f", the policy's {a[:SHOWN_IDS]}{'...' if len(a) > SHOWN_IDS else ''}")
    return None
