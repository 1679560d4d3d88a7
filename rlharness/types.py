"""The shared types: the only things that cross between stages of the spine.

A ``RolloutState`` is one sample (one prompt copy and its response). A *group* is a
``list[RolloutState]`` holding the ``prompt_repeat_k`` copies of one prompt; groups are
the unit the sampler hands out, the replay buffer stores and the trainer consumes.
"""

from __future__ import annotations

import copy
import hashlib
import os
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

Group = list["RolloutState"]


class Status(str, Enum):
    INIT = "init"
    COMPLETED = "completed"
    ABORTED = "aborted"
    EXPIRED = "expired"
    FAILED = "failed"
    FILTERED = "filtered"
    ARCHIVED = "archived"


# A group's status is the worst of its members' (DESIGN.md). INIT and ARCHIVED rank
# below COMPLETED: an INIT member means "not generated yet", which the group as a
# whole reports only when no member is worse.
_STATUS_PRIORITY = {
    Status.FAILED: 6,
    Status.ABORTED: 5,
    Status.EXPIRED: 4,
    Status.FILTERED: 3,
    Status.INIT: 2,
    Status.COMPLETED: 1,
    Status.ARCHIVED: 0,
}


def group_status(group: Group) -> Status:
    if not group:
        raise ValueError("group_status of an empty group")
    return max((s.status for s in group), key=_STATUS_PRIORITY.__getitem__)


def new_uid() -> str:
    # 16 random hex digits, as uuid4().hex[:16] gave, at a sixth of the cost (17 per group of 8).
    return os.urandom(8).hex()


@dataclass
class RolloutState:
    """One sample. Per-token lists (`response_*`) always have equal length."""

    uid: str
    group_id: str
    task: str
    prompt_index: int  # position of the prompt in its dataset split
    epoch: int  # sampler epoch the prompt was drawn in
    prompt_text: str
    prompt_ids: list[int]
    # Ground truth and anything else the judger needs (answer, numbers, target...).
    label: dict[str, Any] = field(default_factory=dict)
    response_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    # The weight version that produced each response token (initial weights = 0).
    response_model_steps: list[int] = field(default_factory=list)
    # 1 = the model produced this token and it is trained; 0 = text the agent loop
    # inserted (tool output): no loss, no log-prob of its own. Empty on a state built
    # without it (older checkpoints, code that fills response_ids directly) = all ones;
    # read it through `loss_mask()`.
    response_mask: list[int] = field(default_factory=list)
    response_text: str = ""
    reward: dict[str, float] | None = None
    status: Status = Status.INIT
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None
    num_aborts: int = 0  # times generation was interrupted (partial rollout)
    # Seeds this sample's token draws (see SamplingParams.seed): a function of the run
    # seed and the sample's place in the data, so reruns and resumes draw the same tokens.
    sample_seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def min_policy_version(self) -> int | None:
        return min(self.response_model_steps) if self.response_model_steps else None

    @property
    def max_policy_version(self) -> int | None:
        return max(self.response_model_steps) if self.response_model_steps else None

    def reset_response(self) -> None:
        """Forget the generated part; the prompt goes back to be generated afresh."""
        self.response_ids = []
        self.response_logprobs = []
        self.response_model_steps = []
        self.response_mask = []
        self.response_text = ""
        self.reward = None
        self.finish_reason = None

    def append_tokens(self, ids: list[int], logprobs: list[float], model_steps: list[int],
                      mask: list[int] | None = None) -> None:
        """Append tokens; `mask` defaults to ones (model tokens, trained)."""
        mask = [1] * len(ids) if mask is None else list(mask)
        if not (len(ids) == len(logprobs) == len(model_steps) == len(mask)):
            raise ValueError(
                f"append_tokens: lengths differ (ids={len(ids)}, logprobs={len(logprobs)}, "
                f"model_steps={len(model_steps)}, mask={len(mask)})"
            )
        # A state that predates the mask gets its implicit ones made explicit first.
        self.response_mask = self.loss_mask()
        self.response_mask.extend(mask)
        self.response_ids.extend(ids)
        self.response_logprobs.extend(logprobs)
        self.response_model_steps.extend(model_steps)

    def loss_mask(self) -> list[int]:
        """Per response token: 1 = trained, 0 = inserted (e.g. tool output). Empty mask = all ones."""
        if not self.response_mask:
            return [1] * len(self.response_ids)
        if len(self.response_mask) != len(self.response_ids):
            raise ValueError(f"sample uid={self.uid}: response_mask ({len(self.response_mask)}) and "
                             f"response_ids ({len(self.response_ids)}) differ in length")
        return list(self.response_mask)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RolloutState":
        d = dict(d)
        d["status"] = Status(d["status"])
        return cls(**d)

    def clone(self) -> "RolloutState":
        """A deep copy. Lists of numbers are copied flat: `copy.deepcopy` walked every token of
        them, the producer's hottest path (several times the rest of orchestration per group)."""
        new = copy.copy(self)
        for name, value in vars(self).items():
            if name in _NUMBER_LISTS:
                setattr(new, name, list(value))
            elif isinstance(value, (list, dict, set)):
                setattr(new, name, copy.deepcopy(value))
        return new


# RolloutState fields that hold only numbers (copied with list() by `clone`).
_NUMBER_LISTS = frozenset({"prompt_ids", "response_ids", "response_logprobs", "response_model_steps", "response_mask"})


def make_group(
    *,
    task: str,
    prompt_index: int,
    epoch: int,
    prompt_text: str,
    prompt_ids: list[int],
    label: dict[str, Any],
    k: int,
    seed: int = 0,
) -> Group:
    """`k` fresh copies of one prompt sharing a group id."""
    group_id = new_uid()
    return [
        RolloutState(
            uid=new_uid(),
            group_id=group_id,
            task=task,
            prompt_index=prompt_index,
            epoch=epoch,
            prompt_text=prompt_text,
            prompt_ids=list(prompt_ids),
            label=dict(label),
            sample_seed=stable_seed(seed, task, epoch, prompt_index, member),
        )
        for member in range(k)
    ]


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from its parts, the same in every process (unlike hash())."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def group_staleness(group: Group, train_step: int) -> int:
    """Staleness of a group if trained at `train_step`: train_step - min version - 1.

    Measured per token (DESIGN.md): the oldest token of any member decides. A group
    with no tokens yet has staleness 0.
    """
    versions = [v for s in group for v in s.response_model_steps]
    if not versions:
        return 0
    return train_step - min(versions) - 1


@dataclass
class TrainBatch:
    """Padded tensors for one training step; built from groups by `rlharness.trainer.batch`.

    Every per-token tensor is indexed by the token's own position in `input_ids`
    ([B, T]): `response_mask[b, t] = 1` when token t of row b is a trained response
    token, and `advantages`, `rollout_logprobs`, `model_steps` at [b, t] belong to
    that same token. The log-prob of token t comes from the logits at t - 1; the
    backend does that shift once (see `rlharness.algo.losses.token_logprobs`).
    """

    input_ids: Any  # LongTensor [B, T], right-padded
    attention_mask: Any  # LongTensor [B, T]
    response_mask: Any  # FloatTensor [B, T]
    advantages: Any  # FloatTensor [B, T]
    rollout_logprobs: Any  # FloatTensor [B, T]
    model_steps: Any  # LongTensor [B, T], -1 outside responses
    train_step: int = 0
    num_groups: int = 0
    max_response_len: int = 0  # agent max_tokens, for Dr.GRPO's constant normaliser
    # Sampling temperature of the rollouts: the trainer scores tokens at the same
    # temperature so its log-probs are comparable with `rollout_logprobs`.
    temperature: float = 1.0
