"""The training loop, colocated or disaggregated, on one screen.

colocate:  produce a batch (rollout and training take turns on the same devices),
           train, sync weights, evaluate, checkpoint.
disagg:    the manager's producer loop runs concurrently; each step waits for a ready
           batch (`get_batch`), trains, then pauses production for the weight sync.

Version bookkeeping: the initial weights are version 0; after step t the engines get
version t (every `sync_weights_interval` steps). A sample trained at step t whose
oldest token came from version v has staleness t - 1 - v.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from rlharness.build import Components
from rlharness.checkpoint import CheckpointError, begin_checkpoint, commit_checkpoint, latest_checkpoint, read_meta
from rlharness.config.schema import RunConf
from rlharness.logging_utils.ledger import RolloutLedger
from rlharness.logging_utils.metrics import MetricsWriter, format_step_line
from rlharness.logging_utils.plots import write_plots
from rlharness.logging_utils.wandb_logger import WandbLogger
from rlharness.trainer.batch import build_train_batch

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, conf: RunConf, components: Components, run_dir: str | Path, config_dict: dict[str, Any]):
        self.conf = conf
        self.c = components
        self.run_dir = Path(run_dir)
        self.config_dict = config_dict
        self.step = 0  # last completed training step
        self.model_version = 0  # weight version the engines hold
        self.wandb_run_id: str | None = None

    # ------------------------------------------------------------------ main loop
    async def fit(self) -> dict[str, Any]:
        conf = self.conf
        await self._resume()
        self.metrics = MetricsWriter(self.run_dir, resume_step=self.step)
        self.ledger = RolloutLedger(self.run_dir, resume_step=self.step)
        self.wandb = WandbLogger(conf.logger, str(self.run_dir), self.run_dir.name, self.config_dict,
                                 run_id=self.wandb_run_id)
        self.wandb_run_id = self.wandb.run_id
        last: dict[str, Any] = {}
        producer = None
        try:
            if self.step == 0:
                self._log_row({"step": 0, **await self.c.evaluator.evaluate()})
            if conf.mode == "disagg":
                producer = asyncio.create_task(self.c.manager.produce_loop())
            with progress_bar(conf.total_steps, self.step) as bar:
                for step in range(self.step + 1, conf.total_steps + 1):
                    last = await self._train_one_step(step, producer)
                    self._log_row(last)
                    if self._due(step, conf.save_every):
                        await self._save()
                    bar.update(1)
        finally:
            if producer is not None:
                await self.c.manager.close()
            if self.step == conf.total_steps and not latest_checkpoint_is(self.run_dir, self.step):
                await self._save()
            self.metrics.close()
            write_plots(self.run_dir)
            self.wandb.finish()
        return last

    async def _train_one_step(self, step: int, producer: asyncio.Task | None) -> dict[str, Any]:
        conf, c, loop = self.conf, self.c, asyncio.get_running_loop()
        t0 = loop.time()
        if producer is None:
            produced = await c.manager.produce_batch(step)
        else:
            if producer.done():  # surface a crashed producer instead of waiting out the timeout
                producer.result()
            produced = await c.manager.get_batch(step, timeout_s=conf.timeout_s)
        t_rollout = loop.time()
        # Groups finish in timing-dependent order; train them in data order so a run
        # (and a resumed run) sums its loss the same way every time.
        produced.groups.sort(key=lambda g: (g[0].task, g[0].epoch, g[0].prompt_index, g[0].group_id))
        batch, batch_metrics = build_train_batch(
            produced.groups, conf.algo, c.tokenizer.pad_token_id, step,
            max_response_len=conf.max_response_tokens(), temperature=conf.agent.sampling.temperature)
        train_metrics = await c.backend.train_step(batch)
        t_train = loop.time()
        self.step = step
        sync_s = 0.0
        if step % conf.sync_weights_interval == 0:
            sync_s = await self._sync_weights(step)
        self.ledger.write_step(step, produced.groups)
        self.ledger.write_dropped(step, c.manager.pop_dropped())
        row: dict[str, Any] = {"step": step, **batch_metrics, **train_metrics, **produced.stats}
        step_s = loop.time() - t0  # evaluation is timed on its own
        if self._due(step, conf.eval_every) or step == conf.total_steps:
            t_eval = loop.time()
            row.update(await c.evaluator.evaluate())
            row["perf/eval_s"] = loop.time() - t_eval
        trained_tokens = int(batch.response_mask.sum().item())
        row.update({
            "perf/step_s": step_s,
            "perf/rollout_s": t_rollout - t0,
            "perf/train_s": t_train - t_rollout,
            "perf/weight_sync_s": sync_s,
            "perf/tokens_per_s": trained_tokens / max(step_s, 1e-9),
            "perf/samples_per_s": sum(len(g) for g in produced.groups) / max(step_s, 1e-9),
            # Share of the step the trainer waited for its batch (disagg: production fell behind).
            "perf/trainer_idle_frac": (t_rollout - t0) / max(step_s, 1e-9),
            "rollout/groups_in_flight": float(c.manager.in_flight()),
        })
        row.update({f"perf/engine_{k}": v for k, v in c.engine.stats().items()})
        return row

    async def _sync_weights(self, version: int) -> float:
        """Pause production, move the new weights to every engine, resume."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self.c.manager.pause()
        weights = await self.c.backend.get_weights()
        await asyncio.wait_for(self.c.engine.load_weights(weights, version), timeout=self.conf.timeout_s)
        self.model_version = version
        self.c.manager.set_model_step(version)
        self.c.manager.resume()
        return loop.time() - t0

    # ------------------------------------------------------------------ logging
    def _log_row(self, row: dict[str, Any]) -> None:
        self.metrics.write(row)
        self.wandb.log(row)
        log.info(format_step_line(row, self.conf.total_steps))

    @staticmethod
    def _due(step: int, every: int) -> bool:
        return every > 0 and step % every == 0

    # ------------------------------------------------------------------ checkpoints
    async def _save(self) -> None:
        # Everything dropped so far goes to the ledger first, so ledger + checkpoint
        # account for every prompt drawn.
        self.ledger.write_dropped(self.step, self.c.manager.pop_dropped())
        tmp = begin_checkpoint(self.run_dir, self.step)
        await self.c.backend.save(str(tmp / "backend"))  # may be remote (Ray actors)
        torch.save({
            "step": self.step,
            "model_version": self.model_version,
            "wandb_run_id": self.wandb_run_id,
            "producer": self.c.manager.state_dict(),
            "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        }, tmp / "trainer.pt")
        commit_checkpoint(self.run_dir, self.step, tmp, self.conf.keep_checkpoints,
                          meta={"model_version": self.model_version})

    async def _resume(self) -> None:
        """Continue from the newest complete checkpoint in the run directory, if any."""
        found = None if self.conf.resume == "never" else latest_checkpoint(self.run_dir)
        if found is None:
            return
        _, path = found
        read_meta(path)
        try:
            state = torch.load(path / "trainer.pt", weights_only=False)
            await self.c.backend.load(str(path / "backend"))  # may be remote (Ray actors)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is a corrupted checkpoint
            raise CheckpointError(f"checkpoint {path} is corrupted or incompatible: {exc}") from exc
        self.step = state["step"]
        self.model_version = state["model_version"]
        self.wandb_run_id = state["wandb_run_id"]
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        self.c.manager.load_state_dict(state["producer"])
        await self.c.engine.load_weights(await self.c.backend.get_weights(), self.model_version)
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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
