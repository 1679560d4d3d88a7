"""`judger=reward_model`: a learned reward model, any Hugging Face sequence-classification folder.

What is scored: the text the policy saw and wrote, `prompt_text + response_text` (the
task's prompt, chat-formatted where the task applies the policy's chat template), encoded
with the reward model's OWN tokenizer (BOS added unless the text starts with it, as the
policy's prompts are encoded). A reward model whose tokenizer differs from the policy's is
allowed: it re-tokenizes the text; it then reads the policy's chat markup as plain text,
so it should have been trained on text in that format (scripts/train_reward_model.py
trains on exactly this text). Texts longer than `max_length` tokens keep their last
`max_length` tokens (the response's end, where the score is read).

reward = (logit[label_index] + reward_shift) * reward_scale (label_index 0 for a one-label head).

Where it runs: the model lives in a process of its own (a pebble worker started from the
judging forkserver; the trainer's interpreter and event loop never run its forward passes),
or, when the run is on Ray (mode=disagg), in a Ray actor with its own placement group
(`judger.num_cpus`, one GPU when `judger.device` is cuda). The scorer takes one call at a time;
groups that arrive while one runs wait and go together in the next, up to `batch_size` rows per
call (one forward pass; a group bigger than that goes alone, in passes of `batch_size`):
`_Coalescing`. A call past `agent.judge_timeout_s` (or a dead process) fails its groups or scores
them 0 (`judger.on_timeout`); a timed-out process is killed and replaced (the model reloads; also
a process that never takes the call up, e.g. a stopped one), a timed-out Ray call is abandoned
(the actor finishes it and goes on).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from rlharness.config.schema import ConfigError, ModelConf, RewardModelJudgerConf
from rlharness.core.coalesce import Coalescing
from rlharness.judger.base import Judger
from rlharness.core.types import RolloutState

log = logging.getLogger(__name__)

HEAD_PREFIXES = ("score.", "classifier.")  # the head names of transformers' *ForSequenceClassification
START_TIMEOUT_S = 300.0  # loading the model in its process (a big one from a slow disk)
FROZEN_GRACE_S = 5.0  # past a call's timeout: its process never took the call up (frozen), see _ProcessScorer


def model_folder(conf: Any, key: str) -> Path:
    """The folder a learned judger's `conf.path` names (relative paths as model.path: the current
    directory, then the project), checked as model.path is (no GGUF file, no code of its own unless
    `<key>.trust_remote_code`)."""
    from rlharness.model.load import check_model_files

    if not conf.path:
        raise ConfigError(f"{key}.path is not set: name a model folder "
                          f"(a reward model: e.g. one made by scripts/train_reward_model.py)")
    return check_model_files(judge_model_conf(conf), key)


def judge_model_conf(conf: Any) -> ModelConf:
    """The model settings a learned judger's folder loads with (its own trust_remote_code)."""
    return ModelConf(path=conf.path, trust_remote_code=conf.trust_remote_code)


def check_reward_model(conf: RewardModelJudgerConf, key: str = "judger") -> None:
    """Refuse, before a run starts, a folder that is not a sequence classifier, a head whose logit
    is ambiguous, or weights that are unreadable, hold code or do not fit its config.json. Reads
    config.json and the weight files' headers only (rlharness/model/weight_files.py)."""
    from transformers import AutoConfig

    from rlharness.model.weight_files import WeightFileError, check_weights, tensor_shapes

    folder = model_folder(conf, key)
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=conf.trust_remote_code)
    architectures = list(getattr(config, "architectures", None) or [])
    try:
        names = list(tensor_shapes(folder))
    except WeightFileError as exc:
        raise ConfigError(f"{key}.path={conf.path}: {exc}") from None
    heads = sorted({n.split(".")[0] for n in names if n.startswith(HEAD_PREFIXES)})
    if not any(a.endswith("ForSequenceClassification") for a in architectures) or not heads:
        raise ConfigError(
            f"{key}.path={conf.path}: {folder} is not a sequence classifier (architectures {architectures}, "
            f"{'head ' + '/'.join(heads) if heads else 'no score/classifier head in its weights'}); a reward model "
            f"is an AutoModelForSequenceClassification folder (scripts/train_reward_model.py makes one)")
    labels = int(config.num_labels)
    if labels > 1 and conf.label_index is None:
        raise ConfigError(f"{key}.label_index is not set: {folder} has a head with {labels} labels; "
                          f"name the one read as the reward ({key}.label_index=0..{labels - 1})")
    if conf.label_index is not None and conf.label_index >= labels:
        raise ConfigError(f"{key}.label_index={conf.label_index} is not allowed: {folder} has {labels} "
                          f"label(s) (0..{labels - 1})")
    try:
        check_weights(folder, "AutoModelForSequenceClassification", conf.trust_remote_code)
    except WeightFileError as exc:
        raise ConfigError(f"{key}.path={conf.path}: {exc}") from None


class RewardModelScorer:
    """The model and its tokenizer, in the process that scores (a judging worker or a Ray actor)."""

    def __init__(self, conf: RewardModelJudgerConf):
        import torch
        from transformers import AutoModelForSequenceClassification
        from transformers.utils import logging as hf_logging

        from rlharness.model.load import load_tokenizer, text_codec
        from rlharness.core.vml_warmup import warm_up_vml

        torch.set_num_threads(conf.torch_threads)
        warm_up_vml()  # the scoring process's first forward must not be MKL's first call (rlharness/core/vml_warmup.py)
        hf_logging.disable_progress_bar()  # a bar per (re)start of the process would clutter the run's log
        folder = model_folder(conf, "judger")
        self.conf = conf
        self.tokenizer = load_tokenizer(judge_model_conf(conf), shared=False)  # its own: padding side set below
        self.tokenizer.padding_side = "right"
        self.encode = text_codec(self.tokenizer)[0]
        self.model = AutoModelForSequenceClassification.from_pretrained(
            str(folder), dtype=getattr(torch, conf.dtype), trust_remote_code=conf.trust_remote_code).to(conf.device).eval()
        if self.model.config.pad_token_id is None:  # the head pools the last token that is not padding
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.label_index = conf.label_index or 0
        self.forward_passes = 0

    def logits(self, texts: list[str]) -> list[float]:
        """logit[label_index] of each text (no normalisation), `batch_size` texts per forward pass."""
        import torch

        out: list[float] = []
        for start in range(0, len(texts), self.conf.batch_size):
            ids = [self.encode(t)[-self.conf.max_length:] for t in texts[start: start + self.conf.batch_size]]
            enc = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(self.conf.device)
            with torch.inference_mode():
                logits = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
            self.forward_passes += 1
            out.extend(logits[:, self.label_index].float().tolist())
        return out

    def ready(self) -> bool:
        return True


# ----------------------------------------------------------------------------- in the worker process
_scorer: RewardModelScorer | None = None


def _init_worker(conf: RewardModelJudgerConf) -> None:
    import ctypes
    import signal
    import sys

    global _scorer
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # killed at once on timeout, even inside a forward pass
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # dies with its parent
        except OSError:
            pass
    _scorer = RewardModelScorer(conf)


def _logits(texts: list[str]) -> list[float]:
    return _scorer.logits(texts)  # type: ignore[union-attr]


def _ready() -> bool:
    return _scorer is not None


def _forward_passes() -> int:
    """The forward passes this process has run (since it started)."""
    return _scorer.forward_passes  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- in the trainer
class _ProcessScorer:
    """The scorer in one pebble worker process (replaced when a call times out, freezes or it dies).

    One call at a time (the one worker runs one anyway): a call's time limit then starts when it is
    sent. pebble times a call from the worker's acknowledgement, which a frozen worker (stopped, or
    stuck before it reads the call) never sends: the wait has its own limit, `timeout_s` plus
    FROZEN_GRACE_S, after which the process is replaced as well."""

    def __init__(self, conf: RewardModelJudgerConf):
        self.conf = conf
        self._pool = self._start()
        self._one_call = asyncio.Lock()
        self.workers_replaced = 0

    def _start(self):
        from rlharness.judger.pool import forkserver_pool

        pool = forkserver_pool(1, _init_worker, (self.conf,))
        pool.schedule(_ready).result(timeout=START_TIMEOUT_S)  # loads the model (a refusal shows here)
        return pool

    def _replace(self) -> None:
        self.close()
        self._pool = self._start()

    async def logits(self, texts: list[str], timeout_s: float) -> list[float]:
        import pebble

        from rlharness.judger.pool import JudgeLimitExceeded

        async with self._one_call:
            waited = asyncio.wrap_future(self._pool.schedule(_logits, args=(texts,), timeout=timeout_s))
            done, _ = await asyncio.wait({waited}, timeout=timeout_s + FROZEN_GRACE_S)
            if not done:
                waited.cancel()
                self.workers_replaced += 1
                await asyncio.to_thread(self._replace)
                raise JudgeLimitExceeded(f"timeout: no answer within {timeout_s:g} s (reward-model process "
                                         f"frozen, replaced)", "timeout")
            try:
                return waited.result()
            except TimeoutError:  # pebble's limit: the worker ran the call too long and was killed
                self.workers_replaced += 1
                raise JudgeLimitExceeded(f"timeout after {timeout_s:g} s (reward-model process replaced)",
                                         "timeout") from None
            except pebble.ProcessExpired as exc:
                self.workers_replaced += 1
                raise JudgeLimitExceeded(f"reward-model process died (exit code {exc.exitcode})", "died") from None

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=10)


class _RayScorer:
    """The scorer as a Ray actor in a placement group of its own (mode=disagg)."""

    def __init__(self, conf: RewardModelJudgerConf):
        from rlharness.cluster.placement import start_side_actor

        self.actor, self.placement_group = start_side_actor(RewardModelScorer, "reward_model", conf.num_cpus,
                                                            conf.device, conf.torch_threads, START_TIMEOUT_S, conf)
        self.workers_replaced = 0

    async def logits(self, texts: list[str], timeout_s: float) -> list[float]:
        return await asyncio.wait_for(asyncio.wrap_future(self.actor.logits.remote(texts).future()), timeout_s)

    def close(self) -> None:
        from rlharness.cluster.placement import stop_side_actor

        stop_side_actor(self.actor, self.placement_group)


class _Coalescing(Coalescing):
    """The groups waiting for the scorer go in one call, up to `batch_size` rows (one forward pass):
    rlharness/core/coalesce.py. A packed call's failure (timeout, a frozen or dead process, which the
    scorer replaces) reaches every group in it, each then applying judger.on_timeout."""

    def __init__(self, scorer, batch_size: int, counts: Counter):
        super().__init__(scorer.logits, batch_size, on_call=lambda: counts.update(("scoring_calls",)))
        self.scorer = scorer

    @property
    def workers_replaced(self) -> int:
        return self.scorer.workers_replaced

    async def logits(self, texts: list[str], timeout_s: float) -> list[float]:
        return await self.call(texts, timeout_s)

    def close(self) -> None:
        self.scorer.close()


class RewardModelJudger(Judger):
    name = "reward_model"
    count_keys = (*Judger.count_keys, "scoring_calls")

    def __init__(self, conf: RewardModelJudgerConf | None = None):
        self.conf = conf or RewardModelJudgerConf()
        model_folder(self.conf, "judger")

    def normalise(self, logit: float) -> float:
        return (logit + self.conf.reward_shift) * self.conf.reward_scale

    def score(self, response_text: str, label: dict[str, Any]) -> dict[str, float]:
        raise TypeError("judger=reward_model scores prompt + response; call judge_group (or score_slow)")

    async def score_slow(self, members: list[RolloutState], timeout_s: float) -> list[dict[str, float]]:
        from rlharness.judger.pool import JudgeLimitExceeded

        scorer = await self._scorer()
        try:
            logits = await scorer.logits([s.prompt_text + s.response_text for s in members], timeout_s)
        except (JudgeLimitExceeded, asyncio.TimeoutError) as exc:
            self.counts["timeouts" if getattr(exc, "kind", "timeout") == "timeout" else "memory_or_crash"] += 1
            if self.conf.on_timeout != "zero":
                raise
            log.warning("judger reward_model: %s on group %s; scored 0 (judger.on_timeout=zero)",
                        exc or "timeout", members[0].group_id)
            self.counts["scored_zero_on_timeout"] += len(members)
            return [{"score": 0.0} for _ in members]
        return [{"score": self.normalise(x)} for x in logits]

    async def _scorer(self):
        return await self._started("_pool", self._new_scorer)

    def _new_scorer(self):
        scorer = _RayScorer(self.conf) if _on_ray() else _ProcessScorer(self.conf)
        log.info("judger reward_model: %s loaded (%s, %s)", self.conf.path, self.conf.device,
                 "Ray actor" if isinstance(scorer, _RayScorer) else "own process")
        return _Coalescing(scorer, self.conf.batch_size, self.counts)

def _on_ray() -> bool:
    """The run is on Ray (mode=disagg started it): the reward model becomes an actor."""
    try:
        import ray
    except ImportError:
        return False
    return ray.is_initialized()
