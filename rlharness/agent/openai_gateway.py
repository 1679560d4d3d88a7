"""`agent=openai_gateway`: train any agent program that talks to the model through the OpenAI or Anthropic API.

The user's agent is a callable (`agent.entrypoint=pkg.mod:fn`) called once per group member as
`fn(row, client)`, in a process of its own (rlharness/agent/agent_pool.py): `row` is the task
row (`prompt`, `label`, `task`, `index`, the sample's `uid`, `model`, the name to pass as
`model=`, and `base_url`, the member's own route at the local gateway), `client` an OpenAI or
Anthropic client on that route (`agent.client`; async for an `async def`). It returns the final
answer (a string the run's judger scores) or the reward itself (a number, range-checked like a
judged one; the judger is not called when every member returned one).

Each call is bounded before it reaches the engine (gateway_server, gateway_protocols): its
sampling fields honoured or refused, its special tokens refused, its prompt plus `max_tokens`
within the model's positions, the sample's calls together within `agent.max_total_tokens`.
It is served by the run's engine with the run's sampling settings and recorded as tokens
(gateway_session): the model's sampled tokens are trained, everything the rendering added
(template, tool outputs, user turns) is masked, every token carries the weight version that
produced it. Calls made in parallel each get a token sequence of their own (a branch), trained
as a row of its own with the sample's reward. Every trained sequence is audited against the
chat template (gateway_audit: `agent/token_drift_frac`, the ledger row's `token_drift`).

Failures: a member whose program raises (anything, `SystemExit` included), exits, returns
without calling the model, or runs past `agent.timeout_s` (its process is killed, however it
blocks) fails for a reason that is not the policy's: one line in the log, the reason and the
program's traceback in its row (rlharness/core/member_failures.py; `algo.failed_member_policy`
decides what training does with it). The other members go on. A reward out of range fails the
group, named.

Partial rollout: `pause()` aborts the engine requests; a call in flight keeps its tokens and
waits at the gateway (`Session.park`), and the group comes back ABORTED with the trajectories
so far. When the producer continues the group, the same agent programs go on: the waiting calls
continue generating on the new weights. With partial rollout off (or when the agent program is
gone: a resumed run, a restored group) the member's tokens are discarded and its agent starts
afresh.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from typing import Any, Callable

from rlharness.agent.base import AgentLoop
from rlharness.agent.entrypoint import load_entrypoint
from rlharness.agent.gateway_audit import audit
from rlharness.agent.gateway_protocols import PROTOCOLS, ApiError, Call, Completion
from rlharness.agent.gateway_render import (RenderError, ToolMarkers, find_special_token, parse_completion, render,
                                            special_tokens)
from rlharness.agent.gateway_server import GatewayHub, Route, join_hub
from rlharness.agent.gateway_session import Plan, Segment, Session
from rlharness.agent.multi_turn_tool import call_length, find_tool_call
from rlharness.config.schema import OpenAIGatewayAgentConf, SamplingConf
from rlharness.core.member_failures import infra_failure, mark_infra_failure
from rlharness.core.types import Group, RolloutState, Status, new_uid
from rlharness.data.prompt_length import model_positions
from rlharness.engine.base import GenerateRequest, RolloutEngine, new_request_id
from rlharness.judger.base import Judger, reward_out_of_range

log = logging.getLogger(__name__)
_UNWIND_S = 5.0  # how long stopped agents' processes and calls may take to end before the group is returned

# Request fields that must be absent or neutral (anything else would be silently ignored: refused).
_NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "min_p": lambda v: v is None or v == 0,
    "repetition_penalty": lambda v: v is None or v == 1,
    "presence_penalty": lambda v: v is None or v == 0,
    "frequency_penalty": lambda v: v is None or v == 0,
    "n": lambda v: v is None or v == 1,
    "seed": lambda v: v is None,
    "stop": lambda v: v is None or v == [] or v == "",
    "logit_bias": lambda v: not v,
    "logprobs": lambda v: v is None or v is False,
    "top_logprobs": lambda v: v is None or v == 0,
    "response_format": lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
    "tool_choice": lambda v: v is None or v == "auto",
    "stream": lambda v: v is None or v is False,
}


def check_sampling(call: Call, sc: SamplingConf) -> None:
    """Each sampling field the request set is the run's value, or neutral; else ApiError naming it (as the
    request's API names it)."""
    for name, value in call.sampling.items():
        theirs = call.names.get(name, name)
        if name in ("temperature", "top_p", "top_k"):
            run = getattr(sc, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            off = name == "top_k" and run == 0 and value == -1  # vLLM's spelling of "no top-k"
            ok = value is None or (number and (abs(value - run) <= 1e-9 or off))
            if not ok:
                raise ApiError(400, f"{theirs}={value!r} is not allowed: this run samples with {name} {run:g} "
                                    f"(omit it or pass that value)", param=theirs)
        elif not _NEUTRAL[name](value):
            raise ApiError(400, f"{theirs}={value!r} is not supported by the rollout gateway: the run's sampling "
                                f"decides what is generated (agent.sampling.*)", param=theirs)


def _positions(tokenizer) -> int | None:
    """The model's positions, from the config next to its tokenizer (None when there is none to read)."""
    try:
        from transformers import AutoConfig

        return model_positions(AutoConfig.from_pretrained(tokenizer.name_or_path))
    except Exception:  # noqa: BLE001 - no config there: bounded by the token budget only
        return None


class GatewayAgentLoop(AgentLoop):
    conf: OpenAIGatewayAgentConf

    def __init__(self, conf: OpenAIGatewayAgentConf, engine: RolloutEngine, judger: Judger,
                 decode: Callable[[list[int]], str], encode: Callable[[str], list[int]] | None = None,
                 tokenizer=None) -> None:
        super().__init__(conf, engine, judger, decode)
        if tokenizer is None:
            raise ValueError("agent=openai_gateway needs the tokenizer (it renders messages with its chat template)")
        self.tokenizer = tokenizer
        load_entrypoint(conf.entrypoint, "agent.entrypoint")  # refused here if it cannot run at all
        self.markers = ToolMarkers(conf.tool_call_start, conf.tool_call_end, conf.tool_output_start,
                                   conf.tool_output_end)
        if conf.tool_call_end not in self.stop_strings:  # the engine stops at the end of a call
            self.stop_strings.append(conf.tool_call_end)
        self.positions = _positions(tokenizer)
        self.budget = conf.sample_token_budget
        self.specials = special_tokens(tokenizer)
        self._longest_token_chars = max(map(len, tokenizer.get_vocab()), default=1)
        self.hub: GatewayHub | None = None
        self._sessions: dict[str, Session] = {}  # rollout id -> session
        self._by_uid: dict[str, Session] = {}  # sample uid -> its live session
        self._pause_epoch = 0
        self.refused: Counter = Counter()
        self._refused_seen = 0
        bos = tokenizer.bos_token
        # A rendered prompt starts with BOS when the template writes it: no second one.
        self._encode = lambda text: tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos)))
        self._encode_suffix = lambda text: tokenizer.encode(text, add_special_tokens=False)
        self._decode_raw = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)

    async def _join(self) -> GatewayHub:
        if self.hub is not None and self.hub.loop is not asyncio.get_running_loop():
            self.hub, self._sessions, self._by_uid = None, {}, {}  # a new event loop: the old one's are gone
        if self.hub is None:
            self.hub = join_hub(self.conf.max_request_bytes, self.conf.max_concurrency)
        await self.hub.server.start()
        return self.hub

    async def close(self) -> None:
        """End the live sessions and leave the run's gateway (closed with its last loop)."""
        await self._stop(list(self._sessions.values()))
        if self.hub is not None:
            hub, self.hub = self.hub, None
            await hub.release()

    # ------------------------------------------------------------------ the group
    async def pause(self) -> None:
        self._pause_epoch += 1
        await super().pause()

    async def generate_group(self, group: Group, enable_partial_rollout: bool) -> Group:
        await self._join()
        todo = [s for s in group if s.status is not Status.COMPLETED]
        sessions = [self._session_for(s, enable_partial_rollout) for s in todo]
        now = asyncio.get_running_loop().time()
        for sess in sessions:
            if sess.deadline is not None:  # a continued group: its programs' clocks start again
                sess.deadline = now + self.conf.timeout_s
        try:
            await self._wait(sessions)
        except BaseException:  # cancelled (a pause that timed out): the agents go with the task
            for sess in sessions:
                self._end(sess)
            raise
        for s, sess in zip(todo, sessions):
            self._record(s, sess)
        if any(s.status is Status.ABORTED for s in group):
            if not enable_partial_rollout:
                for s in group:  # the whole group restarts on newer weights
                    sess = self._by_uid.get(s.uid)
                    if sess is not None:
                        self._end(sess)
                    self.tokens_discarded += len(s.response_ids)
                    self._reset(s)
                    s.status = Status.ABORTED
            return group
        bad = next(((s, why) for s in group if "agent_reward" in s.extra
                    and (why := reward_out_of_range({"score": s.extra["agent_reward"]})) is not None), None)
        if bad is not None:
            return self._fail_group(group, f"agent {self.conf.entrypoint} returned an unusable reward for sample "
                                           f"{bad[0].uid}: {bad[1]}")
        return await self._judge(group)

    def _session_for(self, s: RolloutState, enable_partial_rollout: bool) -> Session:
        """The member's live session, resumed (a continued group), or a new agent run."""
        sess = self._by_uid.get(s.uid)
        if sess is not None and enable_partial_rollout and sess.parked and s.status is Status.ABORTED:
            sess.resume(self._pause_epoch)
            return sess
        if sess is not None:
            self._end(sess)
        if s.status is not Status.INIT or s.response_ids or s.extra:
            self.tokens_discarded += len(s.response_ids)  # no agent program to continue them
            self._reset(s)
        sess = Session(new_uid(), s, self._pause_epoch)
        self._sessions[sess.id] = self._by_uid[s.uid] = sess
        self.hub.server.routes[sess.id] = Route(self.conf.model_name, self._route(sess), self.refused)
        sess.agent_task = asyncio.ensure_future(self._run_agent(sess))
        sess.agent_task.add_done_callback(lambda _t, sess=sess: sess.notify())
        return sess

    @staticmethod
    def _reset(s: RolloutState) -> None:
        s.reset_response()
        for key in ("agent_reward", "branches", "token_drift"):
            s.extra.pop(key, None)

    async def _run_agent(self, sess: Session) -> dict[str, Any]:
        await self._acquire(sess)
        loop = asyncio.get_running_loop()

        def started() -> None:  # the program's clock starts once its process has the job
            sess.deadline = loop.time() + self.conf.timeout_s
            sess.notify()

        try:
            s = sess.state
            root = self.hub.server.root_url(sess.id)
            row = {"prompt": s.prompt_text, "label": s.label, "task": s.task, "index": s.prompt_index,
                   "uid": s.uid, "model": self.conf.model_name, "base_url": root}
            return await self.hub.pool.run({"entrypoint": self.conf.entrypoint, "row": row, "base_url": root,
                                            "client": self.conf.client}, on_start=started)
        finally:
            self._release(sess)

    async def _wait(self, sessions: list[Session]) -> None:
        """Until every agent finished (and the calls it left in flight ended: their tokens are the sample's),
        parked or was stopped at its deadline."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            for sess in sessions:
                if (not sess.agent_task.done() and not sess.parked and sess.deadline is not None
                        and now >= sess.deadline):
                    sess.failure = (f"agent {self.conf.entrypoint} did not finish within agent.timeout_s="
                                    f"{self.conf.timeout_s:g} (its process was killed)")
                    self._end(sess)
            waiting = [sess for sess in sessions if not (sess.parked or sess.idle)]
            if not waiting:
                return
            deadlines = [sess.deadline for sess in waiting if sess.deadline is not None and not sess.agent_task.done()]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            await asyncio.wait([sess.watch() for sess in waiting], timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)

    def _record(self, s: RolloutState, sess: Session) -> None:
        """The session's trajectory into `s`: COMPLETED (its reply, or an infrastructure failure), or ABORTED."""
        sess.write_to(s)
        if sess.parked:
            s.status, s.finish_reason = Status.ABORTED, "abort"
            s.num_aborts += 1
            s.response_text = self.decode(s.response_ids)
            return
        task = sess.agent_task
        if task.cancelled():
            reply: dict[str, Any] = {}
        elif task.exception() is not None:
            reply = {"error": f"the gateway could not run it: {task.exception()!r}", "died": True}
        else:
            reply = task.result()
        self._forget(sess)
        s.status = Status.COMPLETED
        s.finish_reason = "length" if sess.budget_spent else "stop"
        failure = sess.failure
        if failure is None and "error" in reply and sess.budget_spent:
            reply = {"answer": ""}  # it stopped at its refused call: the sample ended at its budget (the policy's)
        if failure is None and "error" in reply:
            failure = f"agent {self.conf.entrypoint}" + (": " if reply.get("died") else " raised ") + reply["error"]
        if failure is None and not sess.segments:
            failure = f"agent {self.conf.entrypoint} returned without calling the model"
        if failure is not None:
            log.warning("sample %s failed (not the policy's fault): %s", s.uid, failure.splitlines()[0][:300])
            mark_infra_failure(s, failure, reply.get("traceback") or None)
            if reply.get("output"):
                s.extra["agent_output"] = reply["output"]
            s.response_text = ""
            return
        if "reward" in reply:
            s.extra["agent_reward"] = reply["reward"]
            s.response_text = str(reply["reward"])
        else:
            s.response_text = reply.get("answer", "")  # what the judger scores
        for i, seg in enumerate(seg for seg in sess.segments if seg.ids):
            drift = self._audit(seg)
            if drift is not None:  # the first drifting sequence (the row's `token_drift`)
                s.extra["token_drift"] = {"segment": i, **drift}
                break

    def _audit(self, seg: Segment) -> dict[str, Any] | None:
        call, completion = seg.last_call
        return audit(seg.prompt_ids, seg.ids, seg.mask, call, completion, self.tokenizer, self._encode, self.markers)

    async def _judge(self, group: Group) -> Group:
        valid = [s for s in group if infra_failure(s) is None]
        if valid and all("agent_reward" in s.extra for s in valid):
            for s in group:
                s.reward = {"score": s.extra.get("agent_reward", 0.0)}  # a failed member's is never read
            return group
        return await self.judge_or_fail(group)

    @staticmethod
    def _fail_group(group: Group, reason: str) -> Group:
        log.warning("group %s FAILED: %s", group.group_id, reason)
        return group.mark_failed(reason)

    # ------------------------------------------------------------------ sessions
    def _forget(self, sess: Session) -> None:
        self._sessions.pop(sess.id, None)
        if self.hub is not None:
            self.hub.server.routes.pop(sess.id, None)
        if self._by_uid.get(sess.state.uid) is sess:
            del self._by_uid[sess.state.uid]

    def _end(self, sess: Session) -> None:
        """Stop the session's agent program (its process killed) and its calls; its route then answers 404."""
        self._forget(sess)
        if sess.agent_task is not None and not sess.agent_task.done():
            sess.agent_task.cancel()
        for task in list(sess.handlers):
            task.cancel()

    async def _stop(self, sessions: list[Session]) -> None:
        """End the sessions and let their processes and calls end."""
        for sess in sessions:
            self._end(sess)
        tasks = [t for sess in sessions for t in (sess.agent_task, *sess.handlers) if t is not None and not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=_UNWIND_S)

    async def _acquire(self, sess: Session) -> None:
        if sess.slot_held:
            return
        await self.hub.slots.acquire()
        if sess.slot_held:  # another call of this session took one meanwhile
            self.hub.slots.release()
        sess.slot_held = True

    def _release(self, sess: Session) -> None:
        if sess.slot_held and self.hub is not None:
            sess.slot_held = False
            self.hub.slots.release()

    async def _park(self, sess: Session) -> None:
        """Wait (the slot given back) until the group is continued; then go on under the new epoch."""
        self._release(sess)
        await sess.park()
        await self._acquire(sess)

    # ------------------------------------------------------------------ one call
    def _route(self, sess: Session):
        async def serve(protocol: str, body: dict[str, Any]) -> dict[str, Any]:
            parse, reply = PROTOCOLS[protocol]
            task = asyncio.current_task()
            sess.handlers.add(task)
            sess.generating += 1
            try:
                return reply(await self._serve_call(sess, parse(body)), self.conf.model_name)
            finally:
                sess.generating -= 1
                sess.handlers.discard(task)
                sess.notify()
        return serve

    def _check(self, call: Call) -> int | None:
        """Refuse what the run's sampling does not allow; the call's `max_tokens` (None: agent.sampling.max_tokens,
        within the budget left)."""
        check_sampling(call, self.conf.sampling)
        max_tokens = call.max_tokens
        if max_tokens is None:
            return None
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ApiError(400, f"max_tokens={max_tokens!r} is not allowed: a positive integer", param="max_tokens")
        if max_tokens > self.budget:
            raise ApiError(400, f"max_tokens={max_tokens} is not allowed: above this run's budget of {self.budget} "
                                f"tokens per sample (agent.max_total_tokens)", param="max_tokens")
        return max_tokens

    def _prompt_text(self, call: Call) -> str:
        if not call.chat:
            return call.prompt  # the agent rendered it itself: special tokens are its own business
        hit = find_special_token(call.messages, self.specials)
        if hit is not None:
            raise ApiError(400, f"{hit}: refused, since the rendered text would turn it into a real turn marker "
                                f"(escape it in your agent)", param="messages", code="special_token_in_content")
        try:
            return render(self.tokenizer, call.messages, call.tools, self.markers)
        except RenderError as exc:
            raise ApiError(400, str(exc), param="messages") from None

    def _context_error(self, tokens: int, asked: int | None) -> ApiError:
        wanted = f"{tokens} tokens of prompt" + (f" + {asked} of max_tokens" if asked else
                                                 " and at least one to generate")
        return ApiError(400, f"This model's maximum context length is {self.positions} tokens; the request needs "
                             f"{wanted}", param="messages", code="context_length_exceeded")

    async def _serve_call(self, sess: Session, call: Call) -> Completion:
        max_tokens = self._check(call)
        text = self._prompt_text(call)
        if self.positions is not None and len(text) // self._longest_token_chars >= self.positions:
            raise self._context_error(len(text) // self._longest_token_chars, max_tokens)  # not worth encoding
        plan, left = await self._plan_within_budget(sess, text)
        context = plan.context_len
        if self.positions is not None and context + (max_tokens or 1) > self.positions:
            raise self._context_error(context, max_tokens)
        want = min(max_tokens or self.conf.sampling.max_tokens, left)
        if self.positions is not None:
            want = min(want, self.positions - context)
        seg = sess.commit(plan, self.engine.version)
        flight = (seg, len(seg.ids), want)  # its budget is held until it ends (parallel calls share one)
        sess.in_flight.append(flight)
        try:
            completion, finish = await self._generate(sess, seg, want)
        finally:
            seg.busy = False
            sess.in_flight.remove(flight)
            sess.call_ended()
        tools = call.tools if call.chat else None
        if tools and find_tool_call(self.decode(completion), self.markers.call_start, self.markers.call_end):
            keep = call_length(completion, self._has_call)
            self.tokens_discarded += len(completion) - keep
            seg.truncate(len(seg.ids) - len(completion) + keep)
            completion = completion[:keep]
        seg.text += self._decode_raw(completion)
        seg.mark()
        out_text = self.decode(completion)
        content, tool_calls = (parse_completion(out_text, tools, self.markers, f"call_{new_uid()}")
                               if call.chat else (out_text, []))
        result = Completion(content, tool_calls, "tool_calls" if tool_calls else finish,
                            context, len(completion))
        seg.last_call = (call, result)
        if sess.spent >= self.budget:
            sess.budget_spent = True
        self._log_call(sess, seg, plan.seg is seg, call, out_text, len(tool_calls))
        return result

    async def _plan_within_budget(self, sess: Session, text: str) -> tuple[Plan, int]:
        """Where the call goes and the tokens it may generate. Calls in flight hold what they may still
        generate: a call that finds the budget held waits until one of them ends (parallel calls never pass
        the budget together, and one asked while another holds it is served after it, not refused)."""
        while True:
            if sess.budget_spent:
                raise ApiError(400, f"this sample's token budget ({self.budget}, agent.max_total_tokens) is spent: "
                                    f"the sample has ended", code="sample_budget_exhausted")
            if sess.epoch != self._pause_epoch:  # paused between calls (the agent ran its tools)
                await self._park(sess)
            plan = sess.plan(text, self._encode, self._encode_suffix)
            left = self.budget - sess.spent - sess.reserved() - len(plan.suffix_ids)
            if left >= 1:
                return plan, left
            if not sess.in_flight:
                sess.budget_spent = True
                raise ApiError(400, f"this call's messages take this sample past its token budget ({self.budget}, "
                                    f"agent.max_total_tokens): the sample has ended", code="sample_budget_exhausted")
            await sess.wait_for_a_call()

    async def _generate(self, sess: Session, seg: Segment, want: int) -> tuple[list[int], str]:
        """Up to `want` tokens into `seg` (parking across pauses); (the call's tokens, finish reason)."""
        start = len(seg.ids)
        finish = "length"
        while len(seg.ids) - start < want:
            if sess.epoch != self._pause_epoch:
                await self._park(sess)
            request = GenerateRequest(new_request_id(), seg.prompt_ids + seg.ids,
                                      self.sampling_params(want - (len(seg.ids) - start)), seg.seed)
            result = await self.engine.generate(request)
            seg.append(result.token_ids, result.logprobs, result.model_steps, trained=True)
            finish = result.finish_reason
            if finish != "abort":
                break
        if finish == "abort":  # aborted just as the call's budget was reached: the agent sees "length"
            finish = "length"
        return seg.ids[start:], finish

    def _has_call(self, ids: list[int]) -> bool:
        return find_tool_call(self.decode(ids), self.markers.call_start, self.markers.call_end) is not None

    @staticmethod
    def _log_call(sess: Session, seg: Segment, extended: bool, call: Call, text: str, calls: int) -> None:
        """Turns for the ledger: the messages this call added (all of them on a new segment), then its text."""
        if call.chat:
            new = call.messages[sess.seen_messages.get(id(seg), 0):] if extended else call.messages
            sess.turns += [{"role": str(m.get("role", "")), "text": m.get("content") or ""} for m in new
                           if isinstance(m, dict)]
            sess.seen_messages[id(seg)] = len(call.messages) + 1
        else:
            sess.turns.append({"role": "prompt", "text": call.prompt if not extended else ""})
        sess.turns.append({"role": "assistant", "text": text})
        sess.calls += 1
        sess.tool_calls += calls

    # ------------------------------------------------------------------ metrics
    def step_metrics(self, groups: list[Group]) -> dict[str, float]:
        samples = [s for g in groups for s in g.samples]
        refused = sum(self.refused.values())
        new_refused, self._refused_seen = refused - self._refused_seen, refused
        audited = [s for s in samples if s.extra.get("segments") and infra_failure(s) is None]
        n = max(len(samples), 1)
        return {
            "agent/calls_per_sample": sum(s.extra.get("calls", 0) for s in samples) / n,
            "agent/prefix_mismatch": float(sum(s.extra.get("prefix_mismatch", 0) for s in samples)),
            "agent/requests_refused": float(new_refused),
            "agent/segments_per_sample": sum(s.extra.get("segments", 0) for s in samples) / n,
            "agent/token_drift_frac": sum("token_drift" in s.extra for s in audited) / max(len(audited), 1),
        }
