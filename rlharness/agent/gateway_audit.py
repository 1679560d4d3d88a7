"""Token continuity, audited: are the tokens trained those the chat template gives for the conversation?

The gateway trains the tokens the engine produced (token in, token out), and builds each
sequence piece by piece: a call's new messages are tokenised on their own and appended after
the model's own tokens. A framework that re-renders the conversation and tokenises it again
for training (or an agent whose history differs from what the model wrote) trains other tokens
than were sampled, silently; and even token-in/token-out can differ from what the same
conversation would give at inference (a token merge across a message boundary, a template that
strips whitespace, a model that wrote a token sequence the tokenizer would never produce).

So for every trained sequence (segment) the final conversation is rendered again with the
template (its last call's messages plus the reply the gateway returned, the turn closed; a raw
prompt plus its completion for the completions API) and tokenised whole; the first token where
the two differ is the drift. Trailing tokens past the re-rendered text that are special tokens
(the end-of-turn the model wrote, which an open completion has no text for) are not drift.

Policy: what is trained stays what the engine sampled, with its own log-probs (retraining on the
re-rendered tokens would train tokens the policy never produced, with log-probs nobody computed).
The audit reports: `agent/token_drift_frac` per step, and a drifting sample's ledger row gets
`token_drift`: the segment, the first divergent turn (its index and role in the template's
conversation) and token (its position; `in`: the prompt, a token the model sampled, one the gateway
inserted (a tool output, a user turn: context only, never trained), or past the trained end; the
trained and the re-rendered id and text).

A drift at an inserted token is the common, benign kind: a message tokenised on its own after the
model's tokens can split differently than the whole text would (tiny-chat: `</tool>` + `<output>`
gives `<output` as one token, the whole text `><` then `output`); the model is trained on the
context it actually saw. A drift at a `model` token means the trained tokens are not what a
re-rendered conversation would hold there (a sampled special token, a non-canonical split).
"""

from __future__ import annotations

from typing import Any, Callable

from rlharness.agent.gateway_protocols import Call, Completion
from rlharness.agent.gateway_render import RenderError, ToolMarkers, apply_template, to_template_messages


def final_conversation(call: Call, completion: Completion, markers: ToolMarkers) -> list[dict[str, str]]:
    reply: dict[str, Any] = {"role": "assistant", "content": completion.content}
    if completion.tool_calls:
        reply["tool_calls"] = completion.tool_calls
    converted, _ = to_template_messages([*call.messages, reply], call.tools, markers)
    return converted


def first_divergence(trained: list[int], rendered: list[int], special_ids: set[int]) -> int | None:
    """The first position where the two sequences differ, or None (module docstring)."""
    n = min(len(trained), len(rendered))
    for i in range(n):
        if trained[i] != rendered[i]:
            return i
    if len(trained) > n and not all(t in special_ids for t in trained[n:]):
        return n
    return None


def audit(prompt_ids: list[int], ids: list[int], mask: list[int], call: Call, completion: Completion, tokenizer,
          encode: Callable[[str], list[int]], markers: ToolMarkers) -> dict[str, Any] | None:
    """None when the sequence trained equals the re-rendered conversation's tokens; else where it drifts,
    and in what: the prompt, a token the model sampled, or one the gateway inserted (`mask` 0)."""
    trained = prompt_ids + ids
    special_ids = set(tokenizer.all_special_ids)
    try:
        if call.chat:
            converted = final_conversation(call, completion, markers)
            rendered = encode(apply_template(tokenizer, converted, generation_prompt=False, open_turn=False))
        else:
            converted, rendered = [], encode(call.prompt + completion.content)
    except RenderError as exc:  # the reply itself does not render: that is drift of its own kind
        return {"turn": None, "role": None, "token": None, "why": str(exc)}
    j = first_divergence(trained, rendered, special_ids)
    if j is None:
        return None
    turn, role = _turn_of(j, converted, call, tokenizer, encode)
    piece = lambda seq: (seq[j], tokenizer.decode([seq[j]])) if j < len(seq) else (None, None)  # noqa: E731
    (trained_id, trained_text), (rendered_id, rendered_text) = piece(trained), piece(rendered)
    r = j - len(prompt_ids)
    where = "prompt" if r < 0 else "end" if r >= len(ids) else "model" if mask[r] else "inserted"
    return {"turn": turn, "role": role, "token": j, "in": where, "trained_id": trained_id,
            "trained_text": trained_text, "rendered_id": rendered_id, "rendered_text": rendered_text}


def _turn_of(j: int, converted: list[dict[str, str]], call: Call, tokenizer,
             encode: Callable[[str], list[int]]) -> tuple[int, str]:
    """(index, role) of the conversation turn holding token `j` (the completion is turn 1 of a raw prompt)."""
    if not call.chat:
        return (0, "prompt") if j < len(encode(call.prompt)) else (1, "completion")
    for k in range(1, len(converted) + 1):
        if len(encode(apply_template(tokenizer, converted[:k], generation_prompt=False, open_turn=False))) > j:
            return k - 1, converted[k - 1]["role"]
    return len(converted) - 1, converted[-1]["role"]
