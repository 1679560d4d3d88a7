"""OpenAI chat messages <-> the model's text, for the gateway (`agent=openai_gateway`).

The model's own chat template renders system/user/assistant turns. Tool calls follow the
convention of the built-in tool loop (markers from the agent config, defaults shown),
since small chat templates (assets/tiny-chat's ChatML) have no tool syntax of their own:
the model writes `<tool>ARG</tool>` (`<tool>name: ARG</tool>` for a tool other than the
first the request lists; `name:ARG`, as written) and the tool's answer follows inline as `<output>...</output>`,
inside the same assistant turn, as the built-in loop inserts it. So an assistant message
with `tool_calls`, its tool messages and the assistant message after them are one
assistant turn of the template; a conversation that ends with tool messages is rendered
as that turn left open (`continue_final_message`), so the model continues it.

A call's arguments are one JSON object; its single (first required) parameter is the
text between the markers, so `{"expression": "47*382"}` renders `<tool>47*382</tool>`
and parses back to the same object.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rlharness.agent.multi_turn_tool import find_tool_call

_TOOL_NAME_RE = re.compile(r"\s*([A-Za-z_]\w*)\s*:(.*)", re.DOTALL)


class RenderError(ValueError):
    """A request whose messages cannot be rendered (answered with HTTP 400)."""


@dataclass(frozen=True)
class ToolMarkers:
    call_start: str = "<tool>"
    call_end: str = "</tool>"
    output_start: str = "<output>"
    output_end: str = "</output>"


def _tool_params(tools: list[dict[str, Any]]) -> dict[str, str]:
    """Tool name -> the name of its one argument, in the request's order (the first is the default)."""
    out: dict[str, str] = {}
    if not isinstance(tools or [], list):
        raise RenderError("`tools` must be a list")
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RenderError("each entry of `tools` needs {'type': 'function', 'function': {'name': ...}}")
        params = fn.get("parameters") or {}
        if not isinstance(params, dict) or not isinstance(params.get("properties") or {}, dict):
            raise RenderError(f"tool {fn['name']!r}: `parameters` must be a JSON schema object")
        required = params.get("required") or list((params.get("properties") or {}).keys())
        out[fn["name"]] = required[0] if required else "input"
    return out


def _call_text(call: dict[str, Any], params: dict[str, str], m: ToolMarkers) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RenderError("a tool call needs {'function': {'name': ..., 'arguments': ...}}")
    name = fn["name"]
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except json.JSONDecodeError as exc:
        raise RenderError(f"tool call {name!r}: arguments are not JSON ({exc})") from None
    param = params.get(name, "input")
    arg = args.get(param) if isinstance(args, dict) and len(args) == 1 and param in args else json.dumps(args)
    first = next(iter(params), None)
    return m.call_start + (str(arg) if name == first else f"{name}:{arg}") + m.call_end


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        try:
            return "".join(part["text"] for part in content if part.get("type") == "text")
        except (TypeError, KeyError, AttributeError):
            pass
    raise RenderError("message content must be a string or a list of text parts")


def to_template_messages(messages: Any, tools: list[dict[str, Any]] | None,
                         m: ToolMarkers) -> tuple[list[dict[str, str]], bool]:
    """The messages as the template sees them, and whether the last (assistant) turn is left open."""
    if not isinstance(messages, list) or not messages:
        raise RenderError("`messages` must be a non-empty list")
    params = _tool_params(tools or [])
    out: list[dict[str, str]] = []
    merging = False  # the last out message is an assistant turn that tool output may extend
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RenderError("each message needs a role: system, user, assistant or tool")
        role = msg["role"]
        if role == "tool":
            if not merging:
                raise RenderError("a tool message must follow an assistant message with tool_calls")
            out[-1]["content"] += m.output_start + _content(msg) + m.output_end
            continue
        if role == "assistant":
            text = _content(msg) + "".join(_call_text(c, params, m) for c in msg.get("tool_calls") or [])
            if merging:
                out[-1]["content"] += text
            else:
                out.append({"role": "assistant", "content": text})
            merging = bool(msg.get("tool_calls"))
            continue
        out.append({"role": "system" if role == "developer" else role, "content": _content(msg)})
        merging = False
    return out, messages[-1].get("role") in ("assistant", "tool")


def render(tokenizer, messages: Any, tools: list[dict[str, Any]] | None, m: ToolMarkers) -> str:
    """The prompt text for `messages`: a generation prompt after a user turn, the open turn otherwise."""
    converted, open_turn = to_template_messages(messages, tools, m)
    return apply_template(tokenizer, converted, generation_prompt=not open_turn, open_turn=open_turn)


def apply_template(tokenizer, converted: list[dict[str, str]], generation_prompt: bool, open_turn: bool) -> str:
    try:
        return tokenizer.apply_chat_template(converted, tokenize=False, add_generation_prompt=generation_prompt,
                                             continue_final_message=open_turn)
    except Exception as exc:  # noqa: BLE001 - a template error is the request's problem
        raise RenderError(f"the chat template cannot render these messages: {exc}") from None


def special_tokens(tokenizer) -> list[str]:
    """The tokenizer's special tokens as text (`<|im_start|>`...): inside content they would become real
    turn markers when the rendered text is tokenised."""
    found = set(tokenizer.all_special_tokens)
    found.update(t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special)
    return sorted(t for t in found if t)


def find_special_token(messages: Any, specials: list[str]) -> str | None:
    """Where a special token is written inside the content a client sends (system, user and tool messages,
    tool call arguments): "<role> message <i> holds <token>", or None. Assistant text is the model's own
    (decoded without special tokens), so it is not searched."""
    for i, msg in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(msg, dict):
            continue
        texts = [] if msg.get("role") == "assistant" else [msg.get("content")]
        texts += [c.get("function", {}).get("arguments") for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
        for text in texts:
            text = json.dumps(text) if not isinstance(text, str) else text
            hit = next((t for t in specials if t in text), None)
            if hit is not None:
                return f"{msg.get('role')} message {i} holds the special token {hit!r}"
    return None


def parse_completion(text: str, tools: list[dict[str, Any]] | None, m: ToolMarkers,
                     call_id: str) -> tuple[str, list[dict[str, Any]]]:
    """(content, tool_calls) of the model's text: a call is recognised only when the request listed tools."""
    params = _tool_params(tools or [])
    arg = find_tool_call(text, m.call_start, m.call_end) if params else None
    if arg is None:
        return text, []
    content = text[: text.rfind(m.call_start, 0, text.find(m.call_end))]
    name, value = next(iter(params)), arg
    named = _TOOL_NAME_RE.fullmatch(arg)
    if named and named.group(1) in params and named.group(1) != name:
        name, value = named.group(1), named.group(2)  # kept as written: it renders back to the same text
    call = {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps({params[name]: value})}}
    return content, [call]
