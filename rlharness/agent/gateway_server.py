"""The gateway's HTTP server: an OpenAI-compatible API per rollout, on 127.0.0.1 (aiohttp).

Routes, under `/rollout/<id>/v1` (one base URL per member: concurrent agents never mix):
`POST /chat/completions`, `POST /completions`, `GET /models`. Streaming is not served.
Refused per request with an OpenAI-style error body (`{"error": {"message", "type",
"param", "code"}}`) and counted, the rollout going on: malformed JSON or fields (400), a
temperature or top_p other than the run's, `n > 1`, `max_tokens` above the run's budget, a field it does not honour (`stop`, `seed`, `logprobs`, penalties, ...) (400),
another model name (404), an unknown rollout id (404).

The server runs in the run's event loop (the engine calls are the loop's coroutines);
`GatewayAgentLoop` owns it and the sessions, and does the generation (`complete`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import Any, Awaitable, Callable

from aiohttp import web

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status)


# (session id, parsed body, chat or not) -> the OpenAI response body
Completer = Callable[[str, dict[str, Any], bool], Awaitable[dict[str, Any]]]


class GatewayServer:
    def __init__(self, model_name: str, complete: Completer, has_session: Callable[[str], bool]) -> None:
        self.model_name = model_name
        self._complete = complete
        self._has_session = has_session
        self.refused: Counter = Counter()  # reason -> requests refused (counted, the rollout goes on)
        self._runner: web.AppRunner | None = None
        self.port = 0
        app = web.Application()
        app.router.add_post("/rollout/{rid}/v1/chat/completions", self._chat)
        app.router.add_post("/rollout/{rid}/v1/completions", self._text)
        app.router.add_get("/rollout/{rid}/v1/models", self._models)
        self._app = app

    async def start(self) -> None:
        if self._runner is not None:
            return
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)  # a free port, chosen by the OS
        await site.start()
        self.port = runner.addresses[0][1]
        self._runner = runner
        log.info("openai gateway serving %s on http://127.0.0.1:%d/rollout/<id>/v1", self.model_name, self.port)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def base_url(self, rollout_id: str) -> str:
        return f"http://127.0.0.1:{self.port}/rollout/{rollout_id}/v1"

    # ------------------------------------------------------------------ routes
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "rlharness"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        return await self._serve(request, chat=True)

    async def _text(self, request: web.Request) -> web.Response:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, chat: bool) -> web.Response:
        rid = request.match_info["rid"]
        try:
            body = await self._body(request)
            if not self._has_session(rid):
                raise ApiError(404, f"no rollout {rid!r} in flight at this gateway", code="rollout_not_found")
            if body.get("model") != self.model_name:
                raise ApiError(404, f"The model {body.get('model')!r} does not exist; this gateway serves "
                                    f"{self.model_name!r}", param="model", code="model_not_found")
            if body.get("stream"):
                raise ApiError(400, "stream=true is not supported by the rollout gateway", param="stream")
            return web.json_response(await self._complete(rid, body, chat))
        except ApiError as err:
            self.refused[err.code or err.param or "invalid_request"] += 1
            log.info("gateway refused a request of rollout %s: %s", rid, err.message)
            return err.response()
        except Exception as exc:  # noqa: BLE001 - the agent gets an API error (its group fails), the run goes on
            log.exception("gateway: a request of rollout %s failed", rid)
            return ApiError(500, f"the gateway failed to serve this request: {type(exc).__name__}: {exc}",
                            kind="server_error").response()

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}", code="malformed_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", code="malformed_json")
        return body


def completion_body(model: str, chat: bool, content: str, tool_calls: list[dict[str, Any]],
                    finish_reason: str, prompt_tokens: int, completion_tokens: int, call_id: str) -> dict[str, Any]:
    """An OpenAI `chat.completion` (or `text_completion`) response with one choice."""
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
    else:
        choice = {"index": 0, "text": content, "finish_reason": finish_reason, "logprobs": None}
    return {"id": call_id, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
