"""`judger=llm`: a generative judge. A model is asked to grade each response; the grade is read
with a regular expression.

For each member, `judger.template` (Jinja, sandboxed; `prompt` = the policy's prompt text,
`response`, `label` in scope) is rendered, wrapped as one user turn in the judge model's chat
template when it has one (`judger.apply_chat_template`), and sent to an engine of the
judger's own (`judger.engine`: hf, or vllm) holding `judger.path`: by default the policy's
starting checkpoint, whose weights stay frozen there (this engine never receives the
trained weights), or any causal-LM folder. Its engine runs generation in its own thread
(hf) or process (vllm), so the event loop only awaits; it is built in the process that
runs the producer (the driver, also in mode=disagg: it is not a Ray actor).

reward = number * reward_scale + reward_shift, the number being group 1 of the first match
of `judger.score_pattern` in the answer (the whole match when the pattern has no group).
An answer without a match is counted (`judge/unparseable`) and handled like a timeout:
`judger.on_timeout=fail` fails the group, `zero` scores that member 0.

Rendering and reading the score run user-written code on model text (a template with loops of
10^5 x 10^5, a pattern that backtracks catastrophically): both run in judging processes
(rlharness/judger/pool.py: `JudgeTemplate` is what they hold) that are killed and replaced past
the member's `agent.judge_timeout_s`, which counts rendering, generation and reading together;
the event loop never runs them, so SIGTERM and `stop_timeout_s` stop the run as always. A
rendering over `judger.max_rendered_chars`, or longer in tokens than the judge model's positions
leave for its answer, fails its member. The template is rendered once before the run starts, on
a task's first row (`check_sample`): an error, a sandbox violation, a key the rows lack or a
rendering that does not finish is refused then, in one line, not 256 failed groups later.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rlharness.config.schema import ConfigError, HFEngineConf, LLMJudgerConf, VLLMEngineConf
from rlharness.judger.base import Judger, gather_fail_fast
from rlharness.judger.pool import JudgeLimitExceeded
from rlharness.core.types import RolloutState

log = logging.getLogger(__name__)


class UnparseableJudgement(RuntimeError):
    pass


class RenderedTooLong(RuntimeError):
    pass


class JudgeTemplate:
    """The template and the score pattern, compiled where they run (a judging process, or here for a test).
    Pickled into the judging processes without their compiled forms."""

    def __init__(self, conf: LLMJudgerConf):
        self.conf = conf
        self._compiled: tuple[Any, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"conf": self.conf, "_compiled": None}

    def _parts(self):
        if self._compiled is None:
            import regex
            from jinja2 import StrictUndefined
            from jinja2.sandbox import SandboxedEnvironment

            # Sandboxed: the template comes from a config file, not from the code. `regex` (re's syntax) finds
            # most matches that make re backtrack for minutes in microseconds; the process bounds the rest.
            template = SandboxedEnvironment(undefined=StrictUndefined).from_string(self.conf.template)
            self._compiled = (template, regex.compile(self.conf.score_pattern))
        return self._compiled

    def render(self, prompt: str, response: str, label: dict[str, Any]) -> str:
        """The rendered template; RenderedTooLong past `judger.max_rendered_chars` (checked as it grows)."""
        out, size = [], 0
        for chunk in self._parts()[0].generate(prompt=prompt, response=response, label=label):
            size += len(chunk)
            if size > self.conf.max_rendered_chars:
                raise RenderedTooLong(f"the rendered judger.template is longer than judger.max_rendered_chars="
                                      f"{self.conf.max_rendered_chars} characters")
            out.append(chunk)
        return "".join(out)

    def parse(self, answer: str) -> float | None:
        """The reward an answer gives, or None when the pattern finds no number in it."""
        pattern = self._parts()[1]
        match = pattern.search(answer)
        if match is None:
            return None
        try:
            number = float(match.group(1) if pattern.groups else match.group(0))
        except (TypeError, ValueError):  # a group that matched nothing, or not a number
            return None
        return number * self.conf.reward_scale + self.conf.reward_shift


class LLMJudger(Judger):
    name = "llm"
    count_keys = (*Judger.count_keys, "unparseable", "judge_requests")

    def __init__(self, conf: LLMJudgerConf | None = None):
        self.conf = conf or LLMJudgerConf()
        self.template = JudgeTemplate(self.conf)

    def render(self, prompt: str, response: str, label: dict[str, Any]) -> str:
        """In this process (tests, tools); a run renders in its judging processes."""
        return self.template.render(prompt, response, label)

    def parse(self, answer: str) -> float | None:
        """In this process (tests, tools); a run reads scores in its judging processes."""
        return self.template.parse(answer)

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        raise TypeError("judger=llm grades prompt + response with a model; call judge_group (or score_slow)")

    def check_sample(self, prompt_text: str, label: dict[str, Any], timeout_s: float, key: str, where: str) -> None:
        """Render the template once on a task's row (its answer as the response), in a judging process under
        `timeout_s`: refused before the run starts if that fails, names `key`.template and `where`."""
        pool = self._start_once("_pool", self._new_pool)
        try:
            text = pool.call_blocking("render", (prompt_text, str(label.get("answer", "")), label), timeout_s)
            self._fit(text)
        except JudgeLimitExceeded as exc:
            raise ConfigError(f"{key}.template is not allowed: rendering it on {where} did not finish ({exc}; "
                              f"agent.judge_timeout_s={timeout_s:g}): loops too large?") from None
        except Exception as exc:  # noqa: BLE001 - a template error, a sandbox violation, a key the rows lack
            raise ConfigError(f"{key}.template is not allowed: rendering it on {where} failed: "
                              f"{type(exc).__name__}: {exc}") from None

    def _new_pool(self):
        from rlharness.judger.pool import JudgePool

        pool = JudgePool(self.template, self.conf.num_workers, self.conf.worker_memory_mb)
        pool.start()
        return pool

    def _fit(self, text: str) -> list[int]:
        """The judge model's prompt ids of a rendering; RenderedTooLong when its answer would not fit."""
        encode, positions = self._start_once("_codec", self._new_codec)
        ids = encode(text)
        if positions is not None and len(ids) + self.conf.max_tokens > positions:
            raise RenderedTooLong(f"the rendered judger.template is {len(ids)} tokens; with judger.max_tokens="
                                  f"{self.conf.max_tokens} that exceeds the judge model's {positions} positions")
        return ids

    def _new_codec(self):
        """(encode, positions) of the judge model: its tokenizer, chat template and position count."""
        from rlharness.data.prompt_length import model_positions
        from rlharness.judger.reward_model import judge_model_conf
        from rlharness.model.load import load_model_config, load_tokenizer, text_codec

        model = judge_model_conf(self.conf)
        tokenizer = load_tokenizer(model)
        encode_text = text_codec(tokenizer)[0]
        chat = self.conf.apply_chat_template and getattr(tokenizer, "chat_template", None)

        def encode(text: str) -> list[int]:
            if chat:
                text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                     add_generation_prompt=True)
            return encode_text(text)

        return encode, model_positions(load_model_config(model))

    async def score_slow(self, members: list[RolloutState], timeout_s: float) -> list[dict[str, float]]:
        engine = await self._engine()
        pool = await self._started("_pool", self._new_pool)
        loop = asyncio.get_running_loop()

        async def one(s: RolloutState) -> dict[str, float]:
            from rlharness.engine.base import GenerateRequest, SamplingParams, new_request_id

            deadline = loop.time() + timeout_s  # rendering, generating and reading share the member's time
            try:
                text = await pool.call("render", (s.prompt_text, s.response_text, s.label), timeout_s)
            except JudgeLimitExceeded as exc:
                return self._on_limit(s, f"rendering judger.template: {exc}", exc.kind)
            ids = self._fit(text)
            sampling = SamplingParams(temperature=self.conf.temperature, max_tokens=self.conf.max_tokens,
                                      greedy=self.conf.temperature == 0)
            self.counts["judge_requests"] += 1
            try:
                result = await asyncio.wait_for(
                    engine.generate(GenerateRequest(new_request_id(), ids, sampling, seed=s.sample_seed)),
                    max(deadline - loop.time(), 1e-3))
            except asyncio.TimeoutError:
                return self._on_limit(s, f"no judgement within {timeout_s:g} s", "timeout")
            try:
                reward = await pool.call("parse", (result.text,), max(deadline - loop.time(), 1e-3))
            except JudgeLimitExceeded as exc:
                return self._on_limit(s, f"reading the score with judger.score_pattern: {exc}", exc.kind)
            if reward is None:
                self.counts["unparseable"] += 1
                return self._on_limit(s, f"unparseable judgement {result.text[:120]!r} "
                                         f"(judger.score_pattern={self.conf.score_pattern!r})", "unparseable")
            return {"score": reward}

        return await gather_fail_fast([one(s) for s in members])

    def _on_limit(self, s: RolloutState, why: str, kind: str) -> dict[str, float]:
        """A member past its limits (kind: timeout | memory | died | unparseable): fail the group or score 0."""
        if kind in ("timeout", "memory", "died"):
            self.counts["timeouts" if kind == "timeout" else "memory_or_crash"] += 1
        if self.conf.on_timeout != "zero":
            raise (UnparseableJudgement if kind == "unparseable" else TimeoutError)(why)
        log.warning("judger llm: %s on a response of group %s; scored 0 (judger.on_timeout=zero)", why, s.group_id)
        self.counts["scored_zero_on_timeout"] += 1
        s.judge_limit = why
        return {"score": 0.0}

    async def _engine(self):
        return await self._started("_judge_engine", self._new_engine)

    def _new_engine(self):
        """The judge's engine (built once, off the event loop: loading takes seconds)."""
        from rlharness.engine import build_engine
        from rlharness.judger.reward_model import judge_model_conf

        engine_conf = HFEngineConf(device=self.conf.device) if self.conf.engine == "hf" else VLLMEngineConf()
        engine = build_engine(engine_conf, judge_model_conf(self.conf), seed=0)
        log.info("judger llm: engine=%s (%s) with %s", self.conf.engine, type(engine).__name__, self.conf.path)
        return engine

    async def close(self) -> None:
        held = self.__dict__.pop("_judge_engine", None)
        self.__dict__.pop("_judge_engine_lock", None)
        if held is not None:
            await held.close()
        await super().close()
