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
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from rlharness.config.schema import HFEngineConf, LLMJudgerConf, ModelConf, VLLMEngineConf
from rlharness.judger.base import Judger, gather_fail_fast
from rlharness.core.types import RolloutState

log = logging.getLogger(__name__)


class UnparseableJudgement(RuntimeError):
    pass


class LLMJudger(Judger):
    name = "llm"
    count_keys = (*Judger.count_keys, "unparseable", "judge_requests")

    def __init__(self, conf: LLMJudgerConf | None = None):
        from jinja2 import StrictUndefined
        from jinja2.sandbox import SandboxedEnvironment

        self.conf = conf or LLMJudgerConf()
        self._pattern = re.compile(self.conf.score_pattern)
        # Sandboxed: the template comes from a config file, not from the code.
        self._template = SandboxedEnvironment(undefined=StrictUndefined).from_string(self.conf.template)

    def render(self, prompt: str, response: str, label: dict[str, Any]) -> str:
        return self._template.render(prompt=prompt, response=response, label=label)

    def parse(self, answer: str) -> float | None:
        """The reward an answer gives, or None when the pattern finds no number in it."""
        match = self._pattern.search(answer)
        if match is None:
            return None
        try:
            number = float(match.group(1) if self._pattern.groups else match.group(0))
        except (TypeError, ValueError):  # a group that matched nothing, or not a number
            return None
        return number * self.conf.reward_scale + self.conf.reward_shift

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        raise TypeError("judger=llm grades prompt + response with a model; call judge_group (or score_slow)")

    async def score_slow(self, members: list[RolloutState], timeout_s: float) -> list[dict[str, float]]:
        engine, encode = await self._engine()

        async def one(s: RolloutState) -> dict[str, float]:
            from rlharness.engine.base import GenerateRequest, SamplingParams, new_request_id

            ids = encode(self.render(s.prompt_text, s.response_text, s.label))
            sampling = SamplingParams(temperature=self.conf.temperature, max_tokens=self.conf.max_tokens,
                                      greedy=self.conf.temperature == 0)
            self.counts["judge_requests"] += 1
            try:
                result = await asyncio.wait_for(
                    engine.generate(GenerateRequest(new_request_id(), ids, sampling, seed=s.sample_seed)), timeout_s)
            except asyncio.TimeoutError:
                self.counts["timeouts"] += 1
                return self._on_limit(s, f"no judgement within {timeout_s:g} s", TimeoutError)
            reward = self.parse(result.text)
            if reward is None:
                self.counts["unparseable"] += 1
                return self._on_limit(s, f"unparseable judgement {result.text[:120]!r} "
                                         f"(judger.score_pattern={self.conf.score_pattern!r})", UnparseableJudgement)
            return {"score": reward}

        return await gather_fail_fast([one(s) for s in members])

    def _on_limit(self, s: RolloutState, why: str, error: type[Exception]) -> dict[str, float]:
        if self.conf.on_timeout != "zero":
            raise error(why)
        log.warning("judger llm: %s on a response of group %s; scored 0 (judger.on_timeout=zero)", why, s.group_id)
        self.counts["scored_zero_on_timeout"] += 1
        s.judge_limit = why
        return {"score": 0.0}

    async def _engine(self):
        return await self._started("_judge_engine", self._new_engine)

    def _new_engine(self):
        """The judge's engine and prompt encoder (built once, off the event loop: loading takes seconds)."""
        from rlharness.engine import build_engine
        from rlharness.model.load import load_tokenizer, text_codec

        model = ModelConf(path=self.conf.path)
        engine_conf = HFEngineConf(device=self.conf.device) if self.conf.engine == "hf" else VLLMEngineConf()
        engine = build_engine(engine_conf, model, seed=0)
        tokenizer = load_tokenizer(model)
        encode_text = text_codec(tokenizer)[0]
        chat = self.conf.apply_chat_template and getattr(tokenizer, "chat_template", None)

        def encode(text: str) -> list[int]:
            if chat:
                text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                     add_generation_prompt=True)
            return encode_text(text)

        log.info("judger llm: engine=%s (%s) with %s", self.conf.engine, type(engine).__name__, self.conf.path)
        return engine, encode

    async def close(self) -> None:
        held = self.__dict__.pop("_judge_engine", None)
        self.__dict__.pop("_judge_engine_lock", None)
        if held is not None:
            await held[0].close()
        await super().close()
