"""The training loop, colocated or disaggregated, on one screen.

colocate:  produce a batch (rollout and training take turns on the same devices),
           train, sync weights, evaluate, checkpoint.
disagg:    the manager's producer loop runs concurrently; each step waits for a ready
           batch (`get_batch`), trains, then pauses production for the weight sync.

Version bookkeeping: the initial weights are version 0; after step t the engines get
version t (every `sync_weights_interval` steps, and before every evaluation, which always
runs on the weights just trained). A sample trained at step t whose
oldest token came from version v has staleness t - 1 - v.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
import logging
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from rlharness.config.run import RunConf
from rlharness.core import fault_points
from rlharness.health import HealthMonitors
from rlharness.health.bias import BiasMeter, distributions
from rlharness.core.checkpoint import (CheckpointError, CheckpointWriteError, begin_checkpoint, check_fields,
                                       commit_checkpoint, error_line, latest_checkpoint, load_state, read_meta,
                                       save_state, writing)
from rlharness.model.weight_files import check_backend_weights
from rlharness.trainer.components import Components
from rlharness.logging_utils.ledger import RolloutLedger
from rlharness.logging_utils.metrics import MetricsWriter, format_step_line, read_metrics
from rlharness.logging_utils.plots import write_plots
from rlharness.logging_utils.progress import phase
from rlharness.logging_utils.samples import forget_evals_after, write_eval_rows
from rlharness.logging_utils.wandb_logger import WandbLogger
from rlharness.core.run_dir import CHECKPOINTS, RunDir, step_name
from rlharness.producer.sampler import DataExhausted
from rlharness.core.stopping import StopController
from rlharness.agent.base import close_agent_loops
from rlharness.trainer.batch import build_train_batch
from rlharness.trainer.onpolicy_guard import (all_tokens_on_policy, guard_on, onpolicy_gap_warning, save_evidence,
                                              weights_verdict)
from rlharness.trainer.nonfinite import NonFiniteGuard, batch_problem, step_problem
from rlharness.trainer.probe import probe_longest, probe_on
from rlharness.trainer.zero_signal import warn_if_greedy

log = logging.getLogger(__name__)

# Of stop_timeout_s, what a stop may spend waiting for in-flight groups (the rest: the checkpoint, W&B, actors).
STOP_DRAIN_SHARE = 0.2
# What a checkpoint's trainer.pt holds (written by `_save`, checked on resume: another program's or version's
# file is refused naming the key, not a KeyError after the run directory was written to).
TRAINER_STATE = {"step": int, "model_version": int, "wandb_run_id": (str, type(None)), "producer": dict,
                 "rng": dict}


class Trainer:
    def __init__(self, conf: RunConf, components: Components, run_dir: str | Path, config_dict: dict[str, Any],
                 stop: StopController | None = None):
        self.conf = conf
        self.c = components
        self.run_dir = Path(run_dir)
        self.config_dict = config_dict
        self.stop = stop or StopController(conf.stop_timeout_s)
        self.step = 0  # last completed training step
        self.model_version = 0  # weight version the engines hold
        self.wandb_run_id: str | None = None
        self.started = False  # past the resume: from here on the run directory is being written
        self.stop_report = ""  # what a signal stop did, for its one line
        self._rng_at_step = rng_state()  # generators as of the last completed step (what a checkpoint holds)
        self._last_save_s: float | None = None
        # Each task's response budget: DAPO's overlong penalty is taken against the group's own.
        self._task_budgets = {name: conf.sampling_for(e).max_tokens for name, e in conf.task_entries().items()}
        # Tasks with a distillation teacher -> the weight of its per-token term (rlharness/algo/distill.py).
        self._teacher_coefs = {name: t.coef for name, e in conf.task_entries().items()
                               if (t := conf.teacher_for(e)) is not None}
        self._teacher_busy_s = 0.0
        self.nonfinite = NonFiniteGuard(conf.trainer.max_nonfinite_steps, conf.algo)
        # Training-health monitors (rlharness/health/): eval/accuracy is independent of the trained reward
        # only where eval scores with another judger (a learned reward trains).
        health = conf.health
        if conf.algo.advantage == "opd":  # the teacher is the signal: groups of equal rewards still learn
            health = replace(health, monitors=[m for m in health.monitors if m != "zero_signal"])
        self.health = HealthMonitors(health, eval_independent=bool(components.eval_judgers),
                                     eval_prompts=conf.eval.num_prompts, total_steps=conf.total_steps)
        self.bias = BiasMeter(conf.max_response_tokens())  # generated against trained (rlharness/health/bias.py)

    # ------------------------------------------------------------------ main loop
    async def fit(self) -> dict[str, Any]:
        conf = self.conf
        await self._resume()
        if self.step >= conf.total_steps:
            log.info("%s is already at step %d (total_steps=%d): nothing to train; pass total_steps=N with "
                     "N > %d to extend it", self.run_dir, self.step, conf.total_steps, self.step)
            return {}
        # trainer.probe_longest: the longest micro-batch trained once (and undone) before any data is used.
        probed = await probe_longest(conf, self.c.backend, self.c.task_data, self.c.encode) \
            if self.step == 0 and probe_on(conf) else {}
        self.started = True
        if conf.algo.advantage != "opd":  # distillation has signal on greedy samples too: no group baseline
            warn_if_greedy({("agent.sampling" if not conf.tasks else f"tasks.{name}.sampling"):
                            conf.sampling_for(entry) for name, entry in conf.task_entries().items()},
                           conf.algo.advantage)
        stop_event = self.stop.attach(asyncio.get_running_loop())
        self.metrics = MetricsWriter(self.run_dir, resume_step=self.step)
        self.health.replay(read_metrics(self.metrics.path))  # a resume continues the monitors' windows
        self.ledger = RolloutLedger(self.run_dir, resume_step=self.step)
        forget_evals_after(self.run_dir, self.step)
        self.wandb = WandbLogger(conf.logger, str(self.run_dir), self.config_dict, run_id=self.wandb_run_id)
        self.wandb_run_id = self.wandb.run_id
        last: dict[str, Any] = {}
        producer = None
        data_ended = False
        try:
            self._judge_window()  # count from here
            if self.step == 0 and not self.stop.requested:
                self._log_row(self._with_health({"step": 0, **await self._evaluate(0), **self._judge_window(),
                                                 **probed}))
            if conf.mode == "disagg" and not self.stop.requested:
                producer = asyncio.create_task(self.c.manager.produce_loop())
            with progress_bar(conf.total_steps, self.step) as bar:
                for step in range(self.step + 1, conf.total_steps + 1):
                    if self.stop.requested:
                        break
                    try:
                        row = await self._train_one_step(step, producer, stop_event)
                    except DataExhausted as exc:  # allow_epoch_rollover=false: a clean end, not a crash
                        log.warning("stopping after step %d of %d: %s", self.step, conf.total_steps, exc)
                        data_ended = True
                        break
                    if row is None:  # stopped while producing: this step is not trained
                        break
                    last = row
                    self._log_row(last)
                    self.health.stop_if_asked()  # health.on_alarm=stop: no checkpoint of this step
                    if self._due(step, conf.save_every):
                        await self._save()
                    bar.update(1)
        except Exception as exc:
            # The cause in one line, whatever stopped the run (judger failing, filter dropping
            # everything, data exhausted, expiry, a timeout); the traceback follows from the caller.
            log.error("run stopped at step %d: %s: %s", self.step, type(exc).__name__, exc)
            raise
        finally:
            if producer is not None:
                if self.stop.requested:
                    self.c.manager.hurry(conf.stop_timeout_s * STOP_DRAIN_SHARE)
                await self.c.manager.close()
            if self.stop.requested:
                await self._save_on_stop()
            elif ((self.step == conf.total_steps or data_ended) and not self.health.stopped
                  and not latest_checkpoint_is(self.run_dir, self.step)):
                await self._save()
            # Groups dropped since the last step or checkpoint (a save ledgers them itself) reach the ledger
            # even when the run stops, as part of the next step: a resume from the last checkpoint redoes them.
            self.ledger.write_dropped(self.step + 1, self.c.manager.pop_dropped())
            await close_agent_loops([*self.c.manager.agent_loops(), *self.c.evaluator.agent_loops()])
            self.metrics.close()
            write_plots(self.run_dir)
            self.wandb.finish()
        return last

    async def _produce(self, step: int, producer: asyncio.Task | None, stop_event: asyncio.Event):
        """The step's batch, or None when a stop is requested first (production is then cancelled:
        in-flight groups go back to the buffer as ABORTED, nothing is lost)."""
        c = self.c
        if producer is None:
            work = asyncio.ensure_future(c.manager.produce_batch(step))
        else:
            if producer.done():  # surface a crashed producer instead of waiting out the timeout
                producer.result()
            work = asyncio.ensure_future(c.manager.get_batch(step, timeout_s=self.conf.timeout_s))
        stopper = asyncio.ensure_future(stop_event.wait())
        try:
            await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if work.done():
            return work.result()
        c.manager.hurry(self.conf.stop_timeout_s * STOP_DRAIN_SHARE)
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return None

    async def _train_one_step(self, step: int, producer: asyncio.Task | None,
                              stop_event: asyncio.Event) -> dict[str, Any] | None:
        conf, c, loop = self.conf, self.c, asyncio.get_running_loop()
        t0 = loop.time()
        produced = await self._produce(step, producer, stop_event)
        if produced is None:
            return None
        t_rollout = loop.time()
        # From here the step runs to its end even when a stop is requested: an optimizer
        # step under way must never be checkpointed as the step before it.
        # Groups finish in timing-dependent order; train them in data order so a run
        # (and a resumed run) sums its loss the same way every time.
        produced.groups.sort(key=lambda g: (g.task, g.epoch, g.prompt_index, g.group_id))
        batch, batch_metrics = build_train_batch(
            produced.groups, conf.algo, c.tokenizer.pad_token_id, step,
            max_response_len=conf.max_response_tokens(), temperature=conf.agent.sampling.temperature,
            task_budgets=self._task_budgets, teacher_coefs=self._teacher_coefs)
        if producer is None:  # colocated: the engine may hand its device to training (vLLM sleep mode)
            await c.engine.sleep()
        problem = batch_problem(batch)  # such a batch is not trained at all (its loss could only be NaN)
        on_policy = all_tokens_on_policy(batch.model_steps, batch.response_mask, step)
        # The weights about to be trained, for the guard: it can then say whether the engine held them.
        trained_sums = (c.backend.weight_checksums() if on_policy and guard_on(
            conf.algo.onpolicy_logprob_gap_warn, conf.model.narrowest_dtype) else None)
        train_metrics = await c.backend.train_step(batch) if problem is None else {}
        problem = problem or step_problem(train_metrics)
        train_metrics.update(self.nonfinite.record(step, problem, train_metrics, batch_metrics))
        t_train = loop.time()
        if on_policy:
            self._guard_onpolicy(step, produced.groups, batch, train_metrics, trained_sums)
        self.step = step
        fault_points.reach("step_trained", step)
        sync_s, sync_bytes = 0.0, 0
        if step % conf.sync_weights_interval == 0:
            sync_s, sync_bytes = await self._sync_weights(step)
        self.ledger.write_step(step, produced.groups, conf.algo.failed_member_policy)
        self.ledger.write_dropped(step, c.manager.pop_dropped())
        self.wandb.log_samples(step, produced.groups)
        row: dict[str, Any] = {"step": step, **batch_metrics, **train_metrics, **produced.stats,
                               **self.bias.update(produced.generated, produced.groups)}
        self.wandb.log_histograms(step, distributions(produced.generated, produced.groups))
        step_s = loop.time() - t0  # evaluation is timed on its own
        if self._due(step, conf.eval_every) or step == conf.total_steps:
            t_eval = loop.time()
            if self.model_version != step:
                # sync_weights_interval > 1: the engines hold older weights than the ones just trained. Sync
                # first, so the eval row (and the value returned to Hydra sweepers) is this step's model;
                # from here the engines sample with these weights too, and their tokens' versions say so.
                eval_sync_s, eval_sync_bytes = await self._sync_weights(step)
                sync_s, sync_bytes = sync_s + eval_sync_s, sync_bytes + eval_sync_bytes
            row.update(await self._evaluate(step))
            row["perf/eval_s"] = loop.time() - t_eval
        row.update(self._judge_window())  # all judging since the previous row, this row's eval included
        trained_tokens = int(batch.response_mask.sum().item())
        row.update({
            "perf/step_s": step_s,
            "perf/rollout_s": t_rollout - t0,
            "perf/train_s": t_train - t_rollout,
            "perf/weight_sync_s": sync_s,
            # What the sync sent (LoRA: only what changed); 0 without a sync.
            "perf/weight_sync_bytes": float(sync_bytes),
            "perf/tokens_per_s": trained_tokens / max(step_s, 1e-9),
            "perf/samples_per_s": sum(len(g) for g in produced.groups) / max(step_s, 1e-9),
            # Share of the step the trainer waited for its batch (disagg: production fell behind).
            "perf/trainer_idle_frac": (t_rollout - t0) / max(step_s, 1e-9),
            "rollout/groups_in_flight": float(c.manager.in_flight()),
        })
        row.update({f"perf/engine_{k}": v for k, v in c.engine.stats().items()})
        if c.teachers:
            row.update(self._teacher_window())
        self._rng_at_step = rng_state()
        return self._with_health(row, produced.groups)

    def _with_health(self, row: dict[str, Any], groups=None) -> dict[str, Any]:
        """The row with the health monitors' numbers (rlharness/health/); their alarms are logged."""
        row.update(self.health.check(row, groups))
        return row

    def _guard_onpolicy(self, step: int, groups, batch, train_metrics: dict[str, Any],
                        trained_sums: dict[str, Any] | None) -> None:
        """Warn when an on-policy step's engine log-probs are not the trainer's (rlharness/trainer/onpolicy_guard.py)."""
        gap = train_metrics.get("train/logprob_diff_rollout")
        if gap is None:
            return
        row_gaps = getattr(self.c.backend, "last_row_gaps", None)
        warning = onpolicy_gap_warning(step, groups, row_gaps, gap, self.conf.algo.onpolicy_logprob_gap_warn,
                                       self.conf.model.narrowest_dtype)
        if warning:
            # The engine still holds the step's weights (the sync comes after): which ones did it compute with?
            engine_sums = self.c.engine.weight_checksums()
            kept = save_evidence(RunDir(self.run_dir).onpolicy_evidence(step), batch, row_gaps, trained_sums,
                                 engine_sums)
            log.warning(warning + weights_verdict(trained_sums, engine_sums) + kept)

    async def _sync_weights(self, version: int) -> tuple[float, int]:
        """Pause production, move the new weights to every engine, resume. Returns (seconds, bytes sent)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self.c.manager.pause()
        sent = await asyncio.wait_for(self.c.weights.sync(version), timeout=self.conf.timeout_s)
        self.model_version = version
        self.c.manager.set_model_step(version)
        self.c.manager.resume()
        return loop.time() - t0, sent.bytes_sent

    def _judge_window(self) -> dict[str, float]:
        """The judgers' counts since the last call, as `judge/<name>` summed over tasks, and in a
        multi-task run also `judge/<task>/<name>` per task (each task has its own judger)."""
        now: dict[str, float] = {}
        per_task = len(self.c.judgers) > 1
        for task, judger in self.c.judgers.items():
            for k, v in judger.stats().items():
                now[k] = now.get(k, 0.0) + v
                if per_task:
                    now[f"{task}/{k}"] = v
        before, self._judge_marks = getattr(self, "_judge_marks", {}), now
        return {f"judge/{k}": v - before.get(k, 0.0) for k, v in now.items()}

    def _teacher_window(self) -> dict[str, float]:
        """The teachers' scoring seconds since the last step (their calls ran while the batch was produced:
        part of perf/rollout_s colocated, beside training in mode=disagg). Groups a teacher failed are
        counted in rollout/groups_failed, with the reason in rollouts/dropped.jsonl."""
        busy = sum(t.busy_s for t in self.c.distinct_teachers())
        window, self._teacher_busy_s = busy - self._teacher_busy_s, busy
        return {"perf/teacher_s": window}

    async def _evaluate(self, step: int) -> dict[str, Any]:
        """Eval metrics; the completions go to evals/step_N.jsonl and a W&B table."""
        with phase(f"eval at step {step}: {self.c.evaluator.num_prompts} prompt(s)", log):
            metrics = await self.c.evaluator.evaluate()
        rows = self.c.evaluator.last_rows
        write_eval_rows(RunDir(self.run_dir).eval_file(step), rows)
        self.wandb.log_eval(step, rows)
        return metrics

    # ------------------------------------------------------------------ logging
    def _log_row(self, row: dict[str, Any]) -> None:
        self.metrics.write(row)
        self.wandb.log(row)
        log.info(format_step_line(row, self.conf.total_steps))

    @staticmethod
    def _due(step: int, every: int) -> bool:
        return every > 0 and step % every == 0

    # ------------------------------------------------------------------ checkpoints
    async def _save_on_stop(self) -> None:
        """The stop's checkpoint: only if there is progress to keep and it fits in the time left."""
        found = latest_checkpoint(self.run_dir)
        name = f"{CHECKPOINTS}/{step_name(self.step)}"
        if found is not None and found[0] == self.step:
            self.stop_report = f"{name} already saved"
            return
        if self.step == 0:
            self.stop_report = "no step trained, nothing to save"
            return
        if self.nonfinite.weights_bad:
            self.stop_report = "the weights are non-finite: no checkpoint written, the last one is kept"
            return
        left_s = self.stop.time_left_s()
        # The save must end before the watchdog's deadline; the last one's duration says how long one takes.
        if self._last_save_s is not None and self._last_save_s * 1.5 > left_s:
            kept = f"{CHECKPOINTS}/{step_name(found[0])}" if found else "no checkpoint"
            self.stop_report = (f"checkpoint skipped: the last took {self._last_save_s:.1f}s, {left_s:.1f}s "
                                f"left of stop_timeout_s ({kept} stays valid)")
            log.warning(self.stop_report)
            return
        await self._save()
        self.stop_report = f"{name} saved in {self._last_save_s:.1f}s"

    async def _save(self) -> None:
        if self.nonfinite.weights_bad:  # the backend would refuse too; say it once, keep the last checkpoint
            log.error("no checkpoint at step %d: the weights are non-finite; the last checkpoint is kept", self.step)
            return
        t0 = time.monotonic()
        # Everything dropped so far goes to the ledger first, so ledger + checkpoint
        # account for every prompt drawn.
        self.ledger.write_dropped(self.step, self.c.manager.pop_dropped())
        tmp = begin_checkpoint(self.run_dir, self.step)
        try:
            await self.c.backend.save(str(tmp / "backend"))  # may be remote (Ray actors)
            with writing(tmp / "trainer.pt"):
                save_state({
                    "step": self.step,
                    "model_version": self.model_version,
                    "wandb_run_id": self.wandb_run_id,
                    "producer": self.c.manager.state_dict(),
                    "rng": self._rng_at_step,
                }, tmp / "trainer.pt")
            commit_checkpoint(self.run_dir, self.step, tmp, self.conf.keep_checkpoints,
                              meta={"model_version": self.model_version})
        except Exception as exc:
            # A full disk, a quota: say which file, free what the half-written one took, and say what is
            # kept (the previous checkpoint was never touched: a new one is renamed into place only whole).
            shutil.rmtree(tmp, ignore_errors=True)
            found = latest_checkpoint(self.run_dir)
            kept = (f"the previous checkpoint {found[1]} is intact (a resume continues from step {found[0]})"
                    if found else "there is no earlier checkpoint")
            what = str(exc) if isinstance(exc, CheckpointWriteError) else f"{type(exc).__name__}: {exc}"
            raise CheckpointWriteError(f"checkpoint of step {self.step} not saved: {what}; {kept}") from exc
        self._last_save_s = time.monotonic() - t0

    async def _resume(self) -> None:
        """Continue from the newest complete checkpoint in the run directory, if any."""
        found = None if self.conf.resume == "never" else latest_checkpoint(self.run_dir)
        if found is None:
            return
        _, path = found
        read_meta(path)
        state = load_state(path / "trainer.pt")  # data only: a crafted file is refused, never run
        check_fields(state, TRAINER_STATE, path / "trainer.pt")
        check_fields(state["rng"], {"python": (tuple, list), "torch": torch.Tensor, "numpy": (tuple, list)},
                     path / "trainer.pt")
        check_backend_weights(path / "backend")
        try:
            with phase(f"loading checkpoint {path}"):
                await self.c.backend.load(str(path / "backend"))  # may be remote (Ray actors)
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - any unreadable file is a corrupted checkpoint
            raise CheckpointError(f"checkpoint {path} is corrupted or incompatible: {error_line(exc)}") from exc
        self.step = state["step"]
        # The engines get the checkpoint's weights, which are the weights after its step: that is their
        # version (with sync_weights_interval > 1 the first life's engines may have held older ones, but
        # those are not saved; stamping these with the older number would make the ledger lie).
        self.model_version = self.step
        if state["model_version"] != self.step:
            log.info("resuming at step %d: the engines get the weights of step %d (the first life's engines "
                     "held version %d; sync_weights_interval=%d)", self.step, self.step, state["model_version"],
                     self.conf.sync_weights_interval)
        self.wandb_run_id = state["wandb_run_id"]
        set_rng_state(state["rng"])
        self._rng_at_step = state["rng"]
        try:
            self.c.manager.load_state_dict(state["producer"])
        except (ValueError, KeyError, TypeError) as exc:  # other tasks, another batch size, another format: named
            raise CheckpointError(f"checkpoint {path}: {exc}") from exc
        await self.c.weights.sync(self.model_version, full=True)  # the engines hold no base for a difference
        self.c.manager.set_model_step(self.model_version)
        log.info("resumed from %s (step %d, weight version %d)", path, self.step, self.model_version)


@contextlib.contextmanager
def progress_bar(total_steps: int, done: int):
    """A step bar on an interactive terminal; log lines print above it, not through it."""
    with logging_redirect_tqdm(), tqdm(total=total_steps, initial=done, desc="training", unit="step",
                                       dynamic_ncols=True, disable=not sys.stderr.isatty()) as bar:
        yield bar


def latest_checkpoint_is(run_dir: Path, step: int) -> bool:
    found = latest_checkpoint(run_dir)
    return found is not None and found[0] == step


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch generator states as plain data and tensors (loadable with weights_only)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)

