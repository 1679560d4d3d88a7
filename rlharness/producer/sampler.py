"""The sampler: hands out groups of `prompt_repeat_k` copies of one prompt.

Order of preference for each group:
1. an ABORTED group from the replay buffer (interrupted work, possibly with partial tokens);
2. an EXPIRED group (too stale, responses cleared) — also when tail batch is off, else
   those prompts would never be trained;
3. a fresh prompt from the dataset.
In tail-batch mode (`sample(from_expired_only=True)`) only EXPIRED groups are taken.

The dataset order is a permutation seeded by (seed, epoch), created lazily on the
first fresh draw, never in `__init__`: a resumed run sets the position first and
only then starts iterating (the seed review's multi-process dataloader defect). The
position (epoch, offset within the epoch, seed) is the checkpointed state.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import numpy as np

from rlharness.config.schema import SamplerConf, check_prompt_repeat_k
from rlharness.data.base import PromptRow
from rlharness.producer.replay_buffer import ReplayBuffer
from rlharness.core.types import Group, Status, make_group

log = logging.getLogger(__name__)

# The layout of `state_dict` (a state saved without "format" has this one too).
STATE_FORMAT = 1


class DataExhausted(RuntimeError):
    """The dataset ran out and `sampler.allow_epoch_rollover` is False."""


class ExpiredPoolEmpty(LookupError):
    """Tail-batch sampling asked for an EXPIRED group but none is waiting."""


class Sampler:
    def __init__(
        self,
        conf: SamplerConf,
        task: str,
        rows: Sequence[PromptRow],
        encode: Callable[[str], list[int]],
        replay_buffer: ReplayBuffer,
        seed: int,
    ) -> None:
        check_prompt_repeat_k(conf.prompt_repeat_k)  # a conf built around the schema is checked here too
        if len(rows) == 0:
            raise ValueError(f"task {task!r}: the training dataset is empty; the sampler has nothing to draw")
        self.conf = conf
        self.task = task
        self.rows = rows
        self.encode = encode
        self.replay_buffer = replay_buffer
        self.seed = seed
        self.epoch = 0
        self.offset = 0  # prompts already drawn in this epoch
        self.drawn = 0  # fresh prompts drawn over the whole run (for accounting)
        self._order: np.ndarray | None = None  # permutation of this epoch, built lazily

    def __len__(self) -> int:
        return len(self.rows)

    def check_batch_size(self, batch_size: int) -> None:
        """Refuse, before anything starts, a batch that one epoch cannot fill without roll-over;
        warn when roll-over will put some prompts into one batch more than once."""
        if batch_size <= len(self.rows):
            return
        if not self.conf.allow_epoch_rollover:
            raise ValueError(
                f"task {self.task!r}: batch_size={batch_size} groups per step exceeds the dataset's "
                f"{len(self.rows)} prompts and sampler.allow_epoch_rollover=False"
            )
        log.warning("task %s: batch_size=%d groups per step exceeds the dataset's %d prompts: every batch holds "
                    "some prompts more than once (from consecutive epochs)", self.task, batch_size, len(self.rows))

    # ------------------------------------------------------------------ sampling
    def sample(self, from_expired_only: bool = False) -> Group:
        if from_expired_only:
            group = self.replay_buffer.pop_group(self.task, Status.EXPIRED)
            if group is None:
                raise ExpiredPoolEmpty(f"task {self.task!r}: no EXPIRED group waiting for tail-batch sampling")
            return group
        for status in (Status.ABORTED, Status.EXPIRED):
            group = self.replay_buffer.pop_group(self.task, status)
            if group is not None:
                return group
        return self._fresh()

    def _fresh(self) -> Group:
        if self.offset >= len(self.rows):
            if not self.conf.allow_epoch_rollover:
                raise DataExhausted(
                    f"task {self.task!r}: all {len(self.rows)} prompts of epoch {self.epoch} were drawn and "
                    f"sampler.allow_epoch_rollover=False"
                )
            self.epoch += 1
            self.offset = 0
            self._order = None
            log.info("task %s: starting epoch %d", self.task, self.epoch)
        if self._order is None:
            self._order = self._permutation(self.epoch)
        row = self.rows[int(self._order[self.offset])]
        self.offset += 1
        self.drawn += 1
        return make_group(
            task=self.task,
            prompt_index=row.index,
            epoch=self.epoch,
            prompt_text=row.prompt_text,
            prompt_ids=self.encode(row.prompt_text),
            label=row.label,
            k=self.conf.prompt_repeat_k,
            seed=self.seed,
        )

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.conf.shuffle:
            return np.arange(len(self.rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "task": self.task,
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "drawn": self.drawn,
            "num_rows": len(self.rows),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format", 1) != STATE_FORMAT:
            raise ValueError(f"task {self.task!r}: sampler state format {state['format']!r} is not one this code reads "
                             f"({STATE_FORMAT}): resume with the version of rlharness that wrote the checkpoint")
        if state["task"] != self.task:
            raise ValueError(f"sampler state is for task {state['task']!r}, not {self.task!r}")
        if state["num_rows"] != len(self.rows):
            raise ValueError(
                f"task {self.task!r}: sampler state was saved with {state['num_rows']} prompts, "
                f"the dataset now has {len(self.rows)}; the position would point elsewhere"
            )
        self.epoch = state["epoch"]
        self.offset = state["offset"]
        self.seed = state["seed"]
        self.drawn = state["drawn"]
        self._order = None  # rebuilt lazily from (seed, epoch)
