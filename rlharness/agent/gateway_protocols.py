"""The APIs the gateway speaks, each turned into one `Call` and answered from one `Completion`.

- `chat`: OpenAI chat completions (`POST /v1/chat/completions`).
- `text`: OpenAI legacy completions (`POST /v1/completions`): a raw prompt, no template.
- `messages`: the Anthropic Messages API (`POST /v1/messages`): `system`, text / `tool_use` /
  `tool_result` blocks, `input_schema` tools.
- `responses`: the OpenAI Responses API (`POST /v1/responses`): `instructions`, `input` items
  (messages, `function_call`, `function_call_output`), flat function tools. Stateless: the
  gateway keeps no responses, so `previous_response_id` is refused (send the conversation).

Every request field is either used, checked against the run's sampling (`SAMPLING`: equal to
the run's value or neutral, else refused by the loop), ignored because it changes nothing that
is generated (`IGNORED`: metadata, storage flags), or refused (400, naming it): nothing is
silently dropped, so what is trained is what was asked for. Messages and tools become OpenAI chat
form (what `gateway_render` renders); the reply goes back in the request's own API's form.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from rlharness.core.types import new_uid


class ApiError(Exception):
    """A refused request: its HTTP status and an error body in the API's own shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self, protocol: str) -> web.Response:
        if protocol == "messages":
            body: dict[str, Any] = {"type": "error", "error": {"type": self.kind, "message": self.message}}
        else:
            body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status)


@dataclass
class Call:
    """One model call, whatever API it came through."""

    chat: bool  # messages rendered with the chat template (else `prompt`, raw)
    messages: list[dict[str, Any]] | None = None  # OpenAI chat form
    tools: list[dict[str, Any]] | None = None  # OpenAI chat form: {"type": "function", "function": {...}}
    prompt: str | None = None
    max_tokens: Any = None  # as sent (checked by the loop)
    sampling: dict[str, Any] = field(default_factory=dict)  # the SAMPLING fields the request set
    names: dict[str, str] = field(default_factory=dict)  # a SAMPLING name -> the API's own, where they differ


@dataclass
class Completion:
    content: str
    tool_calls: list[dict[str, Any]]  # OpenAI chat form
    finish: str  # stop | length | tool_calls
    prompt_tokens: int
    completion_tokens: int


# Fields that steer sampling, under one name whatever the API (the loop checks each).
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
            "n", "seed", "stop", "logit_bias", "logprobs", "top_logprobs", "response_format", "tool_choice",
            "stream")
# Fields that change nothing generated: accepted and not used.
IGNORED = ("model", "user", "metadata", "store", "service_tier", "parallel_tool_calls", "stream_options",
           "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "safety_identifier")


def _refuse_unknown(body: dict[str, Any], known: set[str], api: str) -> None:
    for key in body:
        if key not in known:
            raise ApiError(400, f"{key!r} is not supported by the rollout gateway's {api} (refused rather than "
                                f"ignored: what is trained must be what was asked for)", param=key,
                           code="unsupported_parameter")


def _sampling(body: dict[str, Any], renames: dict[str, str] | None = None) -> dict[str, Any]:
    out = {name: body[name] for name in SAMPLING if name in body}
    for theirs, ours in (renames or {}).items():
        if theirs in body:
            out[ours] = body[theirs]
    return out


def _text_of(content: Any, what: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A string, or the concatenated text of a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in kinds or not isinstance(part.get("text"), str):
                raise ApiError(400, f"{what}: only text parts ({', '.join(kinds)}) are supported", param=what)
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"{what} must be a string or a list of text parts", param=what)


# ----------------------------------------------------------------------------- OpenAI chat / completions
_CHAT_FIELDS = {"messages", "tools", "max_tokens", "max_completion_tokens", *SAMPLING, *IGNORED}


def parse_chat(body: dict[str, Any]) -> Call:
    _refuse_unknown(body, _CHAT_FIELDS, "chat completions")
    return Call(chat=True, messages=body.get("messages"), tools=body.get("tools"),
                max_tokens=body.get("max_completion_tokens", body.get("max_tokens")), sampling=_sampling(body))


_TEXT_FIELDS = {"prompt", "max_tokens", "echo", "suffix", "best_of", *SAMPLING, *IGNORED} - {"tool_choice",
                                                                                              "response_format"}


def parse_text(body: dict[str, Any]) -> Call:
    _refuse_unknown(body, _TEXT_FIELDS, "completions")
    for key, neutral in (("echo", (None, False)), ("suffix", (None, "")), ("best_of", (None, 1))):
        if body.get(key) not in neutral:
            raise ApiError(400, f"{key}={body[key]!r} is not supported by the rollout gateway", param=key)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "`prompt` must be a non-empty string (one prompt per call)", param="prompt")
    return Call(chat=False, prompt=prompt, max_tokens=body.get("max_tokens"), sampling=_sampling(body))


def chat_body(c: Completion, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": c.content}
    if c.tool_calls:
        message["tool_calls"] = c.tool_calls
    return {"id": f"chatcmpl-{new_uid()}", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": c.finish, "logprobs": None}],
            "usage": _usage(c)}


def text_body(c: Completion, model: str) -> dict[str, Any]:
    return {"id": f"cmpl-{new_uid()}", "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": c.content, "finish_reason": c.finish, "logprobs": None}],
            "usage": _usage(c)}


def _usage(c: Completion) -> dict[str, int]:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens}


# ----------------------------------------------------------------------------- Anthropic Messages
# Anthropic's own fields that change nothing generated here (caching hints, routing, accounting).
_MESSAGES_IGNORED = ("cache_control", "inference_geo", "workspace_id", "user_profile_id", "diagnostics")
_MESSAGES_FIELDS = {"messages", "system", "tools", "max_tokens", "stop_sequences", "thinking", *SAMPLING, *IGNORED,
                    *_MESSAGES_IGNORED}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def parse_messages(body: dict[str, Any]) -> Call:
    _refuse_unknown(body, _MESSAGES_FIELDS, "Messages API")
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise ApiError(400, "thinking is not supported by the rollout gateway (the model writes what it writes)",
                       param="thinking")
    sampling = _sampling(body, {"stop_sequences": "stop"})
    names = {"stop": "stop_sequences"}
    choice = body.get("tool_choice")
    if choice is not None:  # {"type": "auto"} is the default; any other choice is refused by the loop
        sampling["tool_choice"] = choice.get("type") if isinstance(choice, dict) and set(choice) <= {
            "type", "disable_parallel_tool_use"} else choice
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text_of(system, "system")})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise ApiError(400, "`messages` must be a non-empty list", param="messages")
    for turn in turns:
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            raise ApiError(400, "each message needs role user or assistant", param="messages")
        messages += _anthropic_turn(turn["role"], turn.get("content"))
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ApiError(400, "`tools` must be a list", param="tools")
        tools = [_anthropic_tool(t) for t in tools]
    return Call(chat=True, messages=messages, tools=tools, max_tokens=body.get("max_tokens"), sampling=sampling,
                names=names)


def _anthropic_tool(t: Any) -> dict[str, Any]:
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or t.get("type") not in (None, "custom"):
        raise ApiError(400, "each tool needs a name and an input_schema (server tools are not supported)",
                       param="tools")
    return {"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                             "parameters": t.get("input_schema") or {}}}


def _anthropic_turn(role: str, content: Any) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI chat messages (a user turn's tool results become tool messages)."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ApiError(400, "message content must be a string or a list of blocks", param="messages")
    out: list[dict[str, Any]] = []
    text, calls = [], []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and role == "user":
            result = _text_of(block.get("content"), "tool_result content")
            if block.get("is_error"):
                result = f"error: {result}"
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": result})
        else:
            raise ApiError(400, f"a {role} message block of type {kind!r} is not supported (text, tool_use in "
                                f"assistant turns, tool_result in user turns)", param="messages")
    if role == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if calls:
            message["tool_calls"] = calls
        return [message]
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def messages_body(c: Completion, model: str) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": c.content}] if c.content or not c.tool_calls else []
    for call in c.tool_calls:
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": json.loads(call["function"]["arguments"])})
    return {"id": f"msg_{new_uid()}", "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": _STOP_REASONS[c.finish], "stop_sequence": None,
            "usage": {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens}}


# ----------------------------------------------------------------------------- OpenAI Responses
_RESPONSES_FIELDS = {"input", "instructions", "tools", "max_output_tokens", "text", "previous_response_id",
                     "reasoning", "include", "truncation", "background", *SAMPLING, *IGNORED}


def parse_responses(body: dict[str, Any]) -> Call:
    _refuse_unknown(body, _RESPONSES_FIELDS, "Responses API")
    if body.get("previous_response_id") is not None:
        raise ApiError(400, "previous_response_id is not supported: the rollout gateway keeps no responses; send "
                            "the whole conversation as `input`", param="previous_response_id")
    for key, neutral in (("reasoning", (None,)), ("include", (None, [])), ("truncation", (None, "disabled")),
                         ("background", (None, False))):
        if body.get(key) not in neutral:
            raise ApiError(400, f"{key}={body[key]!r} is not supported by the rollout gateway", param=key)
    sampling = _sampling(body)
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else body.get("text")
    if fmt is not None:
        sampling["response_format"] = fmt
    messages: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        messages.append({"role": "system", "content": _text_of(body["instructions"], "instructions")})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ApiError(400, "`input` must be a non-empty string or list of items", param="input")
    for item in items:
        _responses_item(item, messages)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ApiError(400, "`tools` must be a list", param="tools")
        tools = [_responses_tool(t) for t in tools]
    return Call(chat=True, messages=messages, tools=tools, max_tokens=body.get("max_output_tokens"),
                sampling=sampling, names={"response_format": "text.format"})


def _responses_tool(t: Any) -> dict[str, Any]:
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
        raise ApiError(400, "each tool must be {'type': 'function', 'name': ..., 'parameters': ...} (built-in tools "
                            "are not supported)", param="tools")
    return {"type": "function", "function": {"name": t["name"], "description": t.get("description") or "",
                                             "parameters": t.get("parameters") or {}}}


def _responses_item(item: Any, messages: list[dict[str, Any]]) -> None:
    if not isinstance(item, dict):
        raise ApiError(400, "each input item must be an object", param="input")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise ApiError(400, "a message item needs role user, system, developer or assistant", param="input")
        messages.append({"role": role, "content": _text_of(item.get("content"), "input content",
                                                           ("input_text", "output_text", "text"))})
    elif kind == "function_call":
        call = {"id": str(item.get("call_id", "")), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # the calls of the message just before
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                         "content": _text_of(item.get("output"), "function_call_output", ("input_text", "text"))})
    else:
        raise ApiError(400, f"input items of type {kind!r} are not supported (message, function_call, "
                            f"function_call_output)", param="input")


def responses_body(c: Completion, model: str) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if c.content or not c.tool_calls:
        output.append({"type": "message", "id": f"msg_{new_uid()}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": c.content, "annotations": []}]})
    for call in c.tool_calls:
        output.append({"type": "function_call", "id": f"fc_{new_uid()}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    length = c.finish == "length"
    return {"id": f"resp_{new_uid()}", "object": "response", "created_at": int(time.time()), "model": model,
            "status": "incomplete" if length else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if length else None, "error": None,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "text": {"format": {"type": "text"}},
            "usage": {"input_tokens": c.prompt_tokens, "output_tokens": c.completion_tokens,
                      "total_tokens": c.prompt_tokens + c.completion_tokens,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}


# protocol -> (parse the body, build the reply); the URL path under /rollout/<id>/v1/ of each
PROTOCOLS = {"chat": (parse_chat, chat_body), "text": (parse_text, text_body),
             "messages": (parse_messages, messages_body), "responses": (parse_responses, responses_body)}
PATHS = {"chat/completions": "chat", "completions": "text", "messages": "messages", "responses": "responses"}
