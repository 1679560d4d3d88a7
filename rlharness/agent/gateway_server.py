"""The gateway's HTTP server: one per run, on 127.0.0.1, every rollout its own route (aiohttp).

Routes, under `/rollout/<id>` (one per agent run, so concurrent agents never mix):
`POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/messages` (Anthropic),
`POST /v1/responses`, `GET /v1/models` (`gateway_protocols` says what each accepts). An
OpenAI client's base URL is `<route>/v1`, an Anthropic client's `<route>`.

Refused before anything reaches the engine, with an error body in the API's own shape (and
counted; the rollout goes on): a body over `agent.max_request_bytes` (413); a body that is not
UTF-8, not JSON, nested deeper than 64 levels, or holding a string that is not valid Unicode
(a lone surrogate) (400, never 500); another model name or an unknown rollout (404); the
per-call checks of the loop (sampling fields, budgets, context length, special tokens: 400).

`GatewayHub` is what the run's gateway loops share in one event loop: this server and the pool
of agent processes (`agent_pool`), started once (however many loops and groups start it at the
same moment) and closed when the last loop using it closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

from rlharness.agent.agent_pool import AgentPool
from rlharness.agent.gateway_protocols import PATHS, ApiError

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 64

# (protocol, parsed body) -> the reply body
Serve = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class Route:
    model_name: str
    serve: Serve
    refused: Counter  # reason -> requests refused, the owning loop's


class GatewayServer:
    def __init__(self, max_request_bytes: int) -> None:
        self.routes: dict[str, Route] = {}
        self._runner: web.AppRunner | None = None
        self._starting: asyncio.Task | None = None
        self.port = 0
        app = web.Application(client_max_size=max_request_bytes)
        for path, protocol in PATHS.items():
            app.router.add_post(f"/rollout/{{rid}}/v1/{path}", self._handler(protocol))
        app.router.add_get("/rollout/{rid}/v1/models", self._models)
        self._app = app

    async def start(self) -> None:
        """Listen (once: concurrent callers wait for the same start)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)  # a free port, chosen by the OS
        await site.start()
        self.port = runner.addresses[0][1]
        self._runner = runner
        log.info("agent gateway listening on http://127.0.0.1:%d/rollout/<id>/v1 (OpenAI chat, completions, "
                 "responses; Anthropic messages)", self.port)

    async def close(self) -> None:
        if self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def root_url(self, rollout_id: str) -> str:
        return f"http://127.0.0.1:{self.port}/rollout/{rollout_id}"

    # ------------------------------------------------------------------ routes
    async def _models(self, request: web.Request) -> web.Response:
        route = self.routes.get(request.match_info["rid"])
        if route is None:
            return ApiError(404, "no rollout in flight at this route", code="rollout_not_found").response("chat")
        return web.json_response({"object": "list", "data": [
            {"id": route.model_name, "object": "model", "created": 0, "owned_by": "rlharness"}]})

    def _handler(self, protocol: str):
        async def handle(request: web.Request) -> web.Response:
            return await self._serve(request, protocol)
        return handle

    async def _serve(self, request: web.Request, protocol: str) -> web.Response:
        rid = request.match_info["rid"]
        route = self.routes.get(rid)
        try:
            body = await read_body(request)
            if route is None:
                raise ApiError(404, f"no rollout {rid!r} in flight at this gateway", code="rollout_not_found")
            if body.get("model") != route.model_name:
                raise ApiError(404, f"The model {body.get('model')!r} does not exist; this gateway serves "
                                    f"{route.model_name!r}", kind="not_found_error", param="model",
                               code="model_not_found")
            return web.json_response(await route.serve(protocol, body))
        except ApiError as err:
            if route is not None:
                route.refused[err.code or err.param or "invalid_request"] += 1
            log.debug("gateway refused a request of rollout %s: %s", rid, err.message)
            return err.response(protocol)
        except Exception as exc:  # noqa: BLE001 - the agent gets an API error, the run goes on
            log.exception("gateway: a request of rollout %s failed", rid)
            return ApiError(500, f"the gateway failed to serve this request: {type(exc).__name__}: {exc}",
                            kind="server_error").response(protocol)


async def read_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object, or ApiError: 413 past the size limit, 400 for anything malformed."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"the request body is over the gateway's limit of {request.client_max_size} bytes "
                            f"(agent.max_request_bytes)", code="request_too_large") from None
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not UTF-8: {exc}", code="malformed_json") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="malformed_json") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply", code="malformed_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="malformed_json")
    _check_plain(body)
    return body


def _check_plain(body: Any) -> None:
    """At most MAX_JSON_DEPTH levels deep, every string valid Unicode (walked without recursion)."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ApiError(400, f"the request body is nested more than {MAX_JSON_DEPTH} levels deep",
                           code="malformed_json")
        children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, child in children:
            for s in (key, child):
                if isinstance(s, str):
                    try:
                        s.encode("utf-8")
                    except UnicodeEncodeError:
                        raise ApiError(400, "the request body holds a string that is not valid Unicode (a lone "
                                            "surrogate escape such as \\ud800)", code="malformed_json") from None
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))


class GatewayHub:
    """The server and the agent processes the gateway loops of one event loop share (module docstring)."""

    def __init__(self, max_request_bytes: int, max_concurrency: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.server = GatewayServer(max_request_bytes)
        self.pool = AgentPool(max_idle=max_concurrency)
        # Agent programs running at once (a call parked for a weight sync gives its slot back).
        self.slots = asyncio.Semaphore(max_concurrency)
        self.users = 0

    async def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            _HUBS.pop(asyncio.get_running_loop(), None)
            await self.pool.close()
            await self.server.close()


_HUBS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GatewayHub]" = weakref.WeakKeyDictionary()


def join_hub(max_request_bytes: int, max_concurrency: int) -> GatewayHub:
    """The running event loop's hub (made by its first user, whose limits it takes); `release` it once."""
    loop = asyncio.get_running_loop()
    hub = _HUBS.get(loop)
    if hub is None:
        hub = _HUBS[loop] = GatewayHub(max_request_bytes, max_concurrency)
    hub.users += 1
    return hub
