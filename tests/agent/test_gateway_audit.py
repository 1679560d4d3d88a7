"""The token continuity audit (rlharness/agent/gateway_audit.py) on sequences built by hand with the
embedded chat model's tokenizer: none, then each kind of drift it names."""

from __future__ import annotations

from rlharness.agent.gateway_audit import audit
from rlharness.agent.gateway_protocols import Call, Completion
from rlharness.agent.gateway_render import ToolMarkers, render
from tests.agent.gateway_helpers import TOK

MARKERS = ToolMarkers()
ENCODE = lambda text: TOK.encode(text, add_special_tokens=not text.startswith(TOK.bos_token))  # noqa: E731
PIECE = lambda text: TOK.encode(text, add_special_tokens=False)  # noqa: E731
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def _check(ids, mask, content="The answer is 5."):
    prompt = ENCODE(render(TOK, QUESTION, None, MARKERS))
    return audit(prompt, ids, mask, Call(chat=True, messages=QUESTION),
                 Completion(content, [], "stop", len(prompt), len(ids)), TOK, ENCODE, MARKERS)


def test_the_sampled_reply_and_its_end_of_turn_are_no_drift():
    ids = PIECE("The answer is 5.") + [TOK.eos_token_id]
    assert _check(ids, [1] * len(ids)) is None


def test_a_special_token_the_model_sampled_mid_turn_is_drift_in_a_model_token():
    """Decoded without special tokens, the reply's text has no trace of it: re-rendered, the conversation
    holds other tokens than were trained. The ledger names the turn, the position and both tokens."""
    start = TOK.convert_tokens_to_ids("<|im_start|>")
    ids = PIECE("The answer") + [start] + PIECE(" is 5.") + [TOK.eos_token_id]
    drift = _check(ids, [1] * len(ids))
    prompt_len = len(ENCODE(render(TOK, QUESTION, None, MARKERS)))
    assert drift["in"] == "model" and drift["token"] == prompt_len + len(PIECE("The answer"))
    assert drift["turn"] == 1 and drift["role"] == "assistant"
    assert drift["trained_text"] == "<|im_start|>" and drift["trained_id"] == start


def test_a_message_tokenised_on_its_own_is_drift_in_an_inserted_token():
    """The tool loop's case: the output appended after `</tool>` as a piece of its own starts with the token
    `<output`; the whole text splits `><` first."""
    call_text = "<tool>2+3</tool>"
    ids = PIECE(call_text) + PIECE("<output>5</output>") + PIECE("#### 5") + [TOK.eos_token_id]
    mask = [1] * len(PIECE(call_text)) + [0] * len(PIECE("<output>5</output>")) + [1] * (len(PIECE("#### 5")) + 1)
    drift = _check(ids, mask, content=call_text + "<output>5</output>#### 5")
    assert drift["in"] == "inserted" and drift["trained_text"] == "<output" and drift["rendered_text"] == "<"


def test_a_raw_prompt_and_its_completion_are_audited_as_text():
    prompt, ids = ENCODE("2 + 3 ="), PIECE(" 5")
    call, mask = Call(chat=False, prompt="2 + 3 ="), [1] * len(ids)
    assert audit(prompt, ids, mask, call, Completion(" 5", [], "stop", 3, 1), TOK, ENCODE, MARKERS) is None
    drift = audit(prompt, ids, mask, call, Completion(" 6", [], "stop", 3, 1), TOK, ENCODE, MARKERS)
    assert drift["turn"] == 1 and drift["role"] == "completion" and drift["in"] == "model"
