"""`agent=openai_gateway`: train any agent program that talks to the model through the OpenAI API.

The user's agent is an async callable (`agent.entrypoint=pkg.mod:fn`) called once per
group member as `await fn(row, client)`: `row` is the task row (`prompt`, `label`, `task`,
`index`, the sample's `uid`, and `model`, the name to pass as `model=`), `client` an `openai.AsyncOpenAI`
whose base URL is this member's own route at the local gateway
(`http://127.0.0.1:<port>/rollout/<id>/v1`; no retries: a retried request would be a
second call). It returns the final answer (a string the run's judger scores) or the
reward itself (a number; the judger is not called when every member returned one).

Each call is served by the run's engine with the run's sampling settings, and recorded
as tokens (`gateway_session`): the model's sampled tokens are trained, everything the
rendering added (template, tool outputs, user turns) is masked, every token carries the
weight version that produced it (inserted tokens the version of the token before them).
The ledger row's `turns` lists the messages each call sent (new ones only) and the text
it returned; `agent/calls_per_sample` and `agent/prefix_mismatch` are logged per step.

Members run concurrently, at most `agent.max_concurrency` agent programs at once in this
loop; a group whose agents take longer than `agent.timeout_s` (time between weight
syncs not counted), or one of whose agents raises, is FAILED with the reason (in
`rollouts/dropped.jsonl`); its other agents are cancelled.

Partial rollout: `pause()` aborts the engine requests; a call in flight keeps its tokens
and waits at the gateway (`Session.park`), and the group comes back ABORTED with the
trajectories so far. When the producer continues the group, the same agent programs go
on: the waiting calls continue generating on the new weights. With partial rollout off
(or when the agent program is gone: a resumed run, a restored group) the member's
tokens are discarded and its agent starts afresh.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from rlharness.agent.base import AgentLoop
from rlharness.agent.entrypoint import load_entrypoint
from rlharness.agent.gateway_render import RenderError, ToolMarkers, parse_completion, render
from rlharness.agent.gateway_server import ApiError, GatewayServer, completion_body
from rlharness.agent.gateway_session import Session
from rlharness.agent.multi_turn_tool import call_length, find_tool_call
from rlharness.config.schema import OpenAIGatewayAgentConf
from rlharness.engine.base import GenerateRequest, RolloutEngine, new_request_id
from rlharness.judger.base import Judger
from rlharness.core.types import Group, RolloutState, Status, new_uid

log = logging.getLogger(__name__)
# The agents' HTTP client logs every request at INFO: thousands of lines a step in train.log.
_UNWIND_S = 5.0  # how long a cancelled agent program may take to unwind before the group is returned
for _name in ("httpx", "httpx2"):
    logging.getLogger(_name).setLevel(logging.WARNING)



# Request fields the gateway does not implement, each with the values that mean "as if absent";
# any other value is refused (400) rather than ignored.
NOT_HONOURED = {
    "stop": lambda v: v is None or v == [] or v == "",
    "seed": lambda v: v is None,
    "presence_penalty": lambda v: v in (None, 0),
    "frequency_penalty": lambda v: v in (None, 0),
    "logit_bias": lambda v: not v,
    "logprobs": lambda v: not v,
    "top_logprobs": lambda v: v in (None, 0),
    "response_format": lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
    "tool_choice": lambda v: v in (None, "auto"),
}

class GatewayAgentLoop(AgentLoop):
    conf: OpenAIGatewayAgentConf

    def __init__(self, conf: OpenAIGatewayAgentConf, engine: RolloutEngine, judger: Judger,
                 decode: Callable[[list[int]], str], encode: Callable[[str], list[int]] | None = None,
                 tokenizer=None) -> None:
        super().__init__(conf, engine, judger, decode)
        if tokenizer is None:
            raise ValueError("agent=openai_gateway needs the tokenizer (it renders messages with its chat template)")
        self.tokenizer = tokenizer
        self.entrypoint = load_entrypoint(conf.entrypoint, "agent.entrypoint")
        self.markers = ToolMarkers(conf.tool_call_start, conf.tool_call_end, conf.tool_output_start,
                                   conf.tool_output_end)
        if conf.tool_call_end not in self.stop_strings:  # the engine stops at the end of a call
            self.stop_strings.append(conf.tool_call_end)
        self.server = GatewayServer(conf.model_name, self._complete, lambda rid: rid in self._sessions)
        self._sessions: dict[str, Session] = {}  # rollout id -> session
        self._by_uid: dict[str, Session] = {}  # sample uid -> its live session
        self._pause_epoch = 0
        self._slots: asyncio.Semaphore | None = None  # made in the running loop
        self._refused_seen = 0
        self._http = None  # the agents' shared HTTP connection pool (made in the running loop)
        bos = tokenizer.bos_token
        # A rendered prompt starts with BOS when the template writes it: no second one.
        self._encode = lambda text: tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)))
        self._encode_suffix = lambda text: tokenizer.encode(text, add_special_tokens=False)
        self._decode_raw = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)

    async def close(self) -> None:
        """Stop the server and the agents' connection pool (sessions still live are ended)."""
        await self._stop(list(self._sessions.values()))
        await self.server.close()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # ------------------------------------------------------------------ the group
    async def pause(self) -> None:
        self._pause_epoch += 1
        await super().pause()

    async def generate_group(self, group: Group, enable_partial_rollout: bool) -> Group:
        await self.server.start()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.conf.max_concurrency)
        todo = [s for s in group if s.status is not Status.COMPLETED]
        sessions = [self._session_for(s, enable_partial_rollout) for s in todo]
        try:
            failure = await self._wait(sessions)
        except BaseException:  # cancelled (a pause that timed out): the agents go with the task
            for sess in sessions:
                self._end(sess)
            raise
        if failure is not None:
            await self._stop(sessions)
            return group.mark_failed(failure)
        for s, sess in zip(todo, sessions):
            self._record(s, sess)
        if any(s.status is Status.ABORTED for s in group):
            if not enable_partial_rollout:
                for s in group:  # the whole group restarts on newer weights
                    sess = self._by_uid.get(s.uid)
                    if sess is not None:
                        self._end(sess)
                    self.tokens_discarded += len(s.response_ids)
                    s.reset_response()
                    s.status = Status.ABORTED
            return group
        return await self._judge(group)

    def _session_for(self, s: RolloutState, enable_partial_rollout: bool) -> Session:
        """The member's live session, resumed (a continued group), or a new agent run."""
        sess = self._by_uid.get(s.uid)
        if sess is not None and enable_partial_rollout and sess.parked and s.status is Status.ABORTED:
            sess.resume(self._pause_epoch)
            return sess
        if sess is not None:
            self._end(sess)
        if s.status is not Status.INIT or s.response_ids:
            self.tokens_discarded += len(s.response_ids)  # no agent program to continue them
            s.reset_response()
            s.extra.pop("agent_reward", None)
        sess = Session(new_uid(), s, self._pause_epoch)
        self._sessions[sess.id] = self._by_uid[s.uid] = sess
        sess.agent_task = asyncio.ensure_future(self._run_agent(sess))
        sess.agent_task.add_done_callback(lambda _t, sess=sess: sess.notify())
        return sess

    async def _run_agent(self, sess: Session) -> Any:
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        await self._acquire(sess)
        try:
            s = sess.state
            row = {"prompt": s.prompt_text, "label": s.label, "task": s.task, "index": s.prompt_index,
                   "uid": s.uid, "model": self.conf.model_name}
            if self._http is None:  # one connection pool for all agents (a client of its own costs ~0.1 s of CPU)
                self._http = DefaultAsyncHttpxClient()
            client = AsyncOpenAI(base_url=self.server.base_url(sess.id), api_key="rlharness", max_retries=0,
                                 timeout=None, http_client=self._http)
            return await self.entrypoint(row, client)
        finally:
            self._release(sess)

    async def _wait(self, sessions: list[Session]) -> str | None:
        """Wait until every agent finished or parked; the failure reason of the group, if any."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.conf.timeout_s
        while True:
            for sess in sessions:
                task = sess.agent_task
                if task.cancelled():  # the program cancelled itself (nothing here cancels a live one)
                    return f"agent {self.conf.entrypoint} was cancelled on sample {sess.state.uid}"
                if task.done() and task.exception() is not None:
                    exc = task.exception()
                    log.warning("agent %s raised on sample %s: %r", self.conf.entrypoint, sess.state.uid, exc)
                    return f"agent {self.conf.entrypoint} raised {type(exc).__name__}: {exc}"
            waiting = [sess.watch() for sess in sessions if not (sess.parked or sess.agent_task.done())]
            if not waiting:
                return None
            left = deadline - loop.time()
            if left <= 0:
                return (f"agent {self.conf.entrypoint} did not finish within agent.timeout_s="
                        f"{self.conf.timeout_s:g} ({len(waiting)} of {len(sessions)} member(s) still running)")
            await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)

    def _record(self, s: RolloutState, sess: Session) -> None:
        """The session's trajectory into `s`: COMPLETED with the agent's result, or ABORTED (parked)."""
        sess.write_to(s)
        if sess.parked:
            s.status, s.finish_reason = Status.ABORTED, "abort"
            s.num_aborts += 1
            s.response_text = self.decode(s.response_ids)
            return
        result = sess.agent_task.result()
        self._forget(sess)
        s.status, s.finish_reason = Status.COMPLETED, "stop"
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            s.extra["agent_reward"] = float(result)
            s.response_text = str(result)
        else:
            s.response_text = "" if result is None else str(result)  # what the judger scores

    async def _judge(self, group: Group) -> Group:
        if all("agent_reward" in s.extra for s in group):
            for s in group:
                s.reward = {"score": s.extra["agent_reward"]}
            return group
        return await self.judge_or_fail(group)

    # ------------------------------------------------------------------ sessions
    def _forget(self, sess: Session) -> None:
        self._sessions.pop(sess.id, None)
        if self._by_uid.get(sess.state.uid) is sess:
            del self._by_uid[sess.state.uid]

    def _end(self, sess: Session) -> None:
        """Stop the session's agent program and its waiting call; later requests to its route get 404."""
        self._forget(sess)
        if sess.agent_task is not None and not sess.agent_task.done():
            sess.agent_task.cancel()
        for task in list(sess.handlers):
            task.cancel()

    async def _stop(self, sessions: list[Session]) -> None:
        """End the sessions and give their agent programs a moment to unwind (their `finally` blocks)."""
        for sess in sessions:
            self._end(sess)
        tasks = [t for sess in sessions for t in (sess.agent_task, *sess.handlers) if t is not None and not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=_UNWIND_S)

    async def _acquire(self, sess: Session) -> None:
        await self._slots.acquire()
        sess.slot_held = True

    def _release(self, sess: Session) -> None:
        if sess.slot_held:
            sess.slot_held = False
            self._slots.release()

    async def _park(self, sess: Session) -> None:
        """Wait (the slot given back) until the group is continued; then go on under the new epoch."""
        self._release(sess)
        await sess.park()
        await self._acquire(sess)

    # ------------------------------------------------------------------ one call
    async def _complete(self, rid: str, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        sess = self._sessions[rid]
        task = asyncio.current_task()
        sess.handlers.add(task)
        try:
            return await self._serve_call(sess, body, chat)
        finally:
            sess.handlers.discard(task)

    def _check(self, body: dict[str, Any]) -> int | None:
        """Refuse what the run's sampling does not allow; the call's `max_tokens` (None = the budget left)."""
        sc = self.conf.sampling
        temperature = body.get("temperature")
        if temperature is not None and (not isinstance(temperature, (int, float)) or
                                        abs(float(temperature) - sc.temperature) > 1e-9):
            raise ApiError(400, f"temperature={temperature!r} is not allowed: this run samples at temperature "
                                f"{sc.temperature:g} (omit it or pass that value)", param="temperature")
        top_p = body.get("top_p")
        if top_p is not None and (not isinstance(top_p, (int, float)) or abs(float(top_p) - sc.top_p) > 1e-9):
            raise ApiError(400, f"top_p={top_p!r} is not allowed: this run samples with top_p {sc.top_p:g} "
                                f"(omit it or pass that value)", param="top_p")
        for key, honoured in NOT_HONOURED.items():  # would be silently ignored: what is trained would not be what was asked
            if key in body and not honoured(body[key]):
                raise ApiError(400, f"{key}={body[key]!r} is not supported by the rollout gateway: the run's sampling "
                                    f"decides what is generated (agent.sampling.*)", param=key)
        n = body.get("n")
        if n is not None and n != 1:
            raise ApiError(400, f"n={n!r} is not allowed: one choice per call (call again for another sample)",
                           param="n")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            return None
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ApiError(400, f"max_tokens={max_tokens!r} is not allowed: a positive integer", param="max_tokens")
        if max_tokens > sc.max_tokens:
            raise ApiError(400, f"max_tokens={max_tokens} is not allowed: above this run's budget of "
                                f"{sc.max_tokens} tokens per sample (agent.sampling.max_tokens)", param="max_tokens")
        return max_tokens

    def _prompt_text(self, body: dict[str, Any], chat: bool) -> str:
        try:
            if chat:
                return render(self.tokenizer, body.get("messages"), body.get("tools"), self.markers)
        except RenderError as exc:
            raise ApiError(400, str(exc), param="messages") from None
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ApiError(400, "`prompt` must be a non-empty string (one prompt per call)", param="prompt")
        return prompt

    async def _serve_call(self, sess: Session, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        max_tokens = self._check(body)
        text = self._prompt_text(body, chat)
        if sess.epoch != self._pause_epoch:  # paused between calls (the agent ran its tools)
            await self._park(sess)
        seg, extended = sess.extend_or_start(text, self.engine.version, self._encode, self._encode_suffix)
        start = len(seg.ids)  # this call's tokens begin here
        left = self.conf.sampling.max_tokens - seg.generated()
        want = min(max_tokens or left, left)
        finish = "length"
        while len(seg.ids) - start < want:
            if sess.epoch != self._pause_epoch:
                await self._park(sess)
            request = GenerateRequest(new_request_id(), seg.prompt_ids + seg.ids,
                                      self.sampling_params(want - (len(seg.ids) - start)), sess.state.sample_seed)
            result = await self.engine.generate(request)
            seg.append(result.token_ids, result.logprobs, result.model_steps, trained=True)
            finish = result.finish_reason
            if finish != "abort":
                break
        if finish == "abort":  # aborted just as the call's budget was reached: the agent sees "length"
            finish = "length"
        tools = body.get("tools") if chat else None
        completion = seg.ids[start:]
        if tools and find_tool_call(self.decode(completion), self.markers.call_start, self.markers.call_end):
            keep = call_length(completion, self._has_call)
            self.tokens_discarded += len(completion) - keep
            seg.truncate(start + keep)
            completion = seg.ids[start:]
        seg.add_completion(completion, self._decode_raw)
        out_text = self.decode(completion)
        content, tool_calls = (parse_completion(out_text, tools, self.markers, f"call_{new_uid()}")
                               if chat else (out_text, []))
        if tool_calls:
            finish = "tool_calls"
        self._log_call(sess, body, chat, extended, out_text, len(tool_calls))
        return completion_body(self.conf.model_name, chat, content, tool_calls, finish,
                               len(seg.prompt_ids) + start, len(completion), f"chatcmpl-{new_uid()}")

    def _has_call(self, ids: list[int]) -> bool:
        return find_tool_call(self.decode(ids), self.markers.call_start, self.markers.call_end) is not None

    @staticmethod
    def _log_call(sess: Session, body: dict[str, Any], chat: bool, extended: bool, text: str, calls: int) -> None:
        """Turns for the ledger: the messages this call added (all of them on a new segment), then its text."""
        if chat:
            messages = body["messages"]
            new = messages[sess.seen_messages:] if extended else messages
            sess.turns += [{"role": str(m.get("role", "")), "text": m.get("content") or ""} for m in new if isinstance(m, dict)]
            sess.seen_messages = len(messages) + 1
        else:
            sess.turns.append({"role": "prompt", "text": body["prompt"] if not extended else ""})
        sess.turns.append({"role": "assistant", "text": text})
        sess.calls += 1
        sess.tool_calls += calls

    # ------------------------------------------------------------------ metrics
    def step_metrics(self, groups: list[Group]) -> dict[str, float]:
        samples = [s for g in groups for s in g.samples]
        refused = sum(self.server.refused.values())
        new_refused, self._refused_seen = refused - self._refused_seen, refused
        return {
            "agent/calls_per_sample": sum(s.extra.get("calls", 0) for s in samples) / max(len(samples), 1),
            "agent/prefix_mismatch": float(sum(s.extra.get("prefix_mismatch", 0) for s in samples)),
            "agent/requests_refused": float(new_refused),
        }
