"""The shared types: the only things that cross between stages of the spine.

A ``RolloutState`` is one sample (one prompt copy and its response). A *group* is a
``list[RolloutState]`` holding the ``prompt_repeat_k`` copies of one prompt; groups are
the unit the sampler hands out, the replay buffer stores and the trainer consumes.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import struct
from dataclasses import asdict, dataclass, field, fields
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


# A group's status is the worst of its members'. INIT and ARCHIVED rank
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
    first = group[0].status
    for s in group:
        if s.status is not first:
            return max((s.status for s in group), key=_STATUS_PRIORITY.__getitem__)
    return first  # the usual case: every member agrees (no ranking needed)


# uids: 16 random hex digits (as uuid4().hex[:16] gave), 17 per group of 8 on the producer's hot
# path. A private generator seeded from the OS, re-seeded in every forked child (a fork would
# otherwise repeat the parent's sequence), and untouched by `random.seed(run seed)`, which would
# make a resumed run repeat the uids of the run it resumes.
_uid_rng = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _uid_rng.seed(os.urandom(32)))
_uid_bits = _uid_rng.getrandbits


def new_uid() -> str:
    return _uid_bits(64).to_bytes(8, "little").hex()  # f"{...:016x}" formatting cost twice this


@dataclass(slots=True)  # no per-instance __dict__: a state is created for every member of every group
class RolloutState:
    """One sample. Per-token lists (`response_*`) always have equal length."""

    uid: str
    group_id: str
    task: str
    prompt_index: int  # position of the prompt in its dataset split
    epoch: int  # sampler epoch the prompt was drawn in
    prompt_text: str
    # Read-only, like `label`: a group's members share one list (and one label), and clones share them.
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
    # Seeds this sample's token draws (see GenerateRequest.seed): a function of the run
    # seed and the sample's place in the data, so reruns and resumes draw the same tokens.
    sample_seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def min_policy_version(self) -> int | None:
        return min(self.response_model_steps) if self.response_model_steps else None

    @property
    def max_policy_version(self) -> int | None:
        return max(self.response_model_steps) if self.response_model_steps else None

    def is_pristine(self) -> bool:
        """Never generated, never interrupted, nothing in `extra`: what `make_group` builds, and
        what `restore_pristine` returns it to (so the producer need not copy it before generating)."""
        return (self.status is Status.INIT and not self.response_ids and not self.response_mask
                and not self.response_text and self.reward is None and self.finish_reason is None
                and not self.num_aborts and not self.extra)

    def restore_pristine(self) -> None:
        """Undo whatever generation did to a state that `is_pristine` was true of."""
        self.reset_response()
        self.status = Status.INIT
        self.num_aborts = 0
        self.extra = {}

    def reset_response(self) -> None:
        """Forget the generated part (and why it failed); the prompt goes back to be generated afresh."""
        for key in _RESPONSE_FAILURE_KEYS:
            self.extra.pop(key, None)
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
        n = len(ids)
        if not (n == len(logprobs) == len(model_steps)) or (mask is not None and len(mask) != n):
            raise ValueError(
                f"append_tokens: lengths differ (ids={n}, logprobs={len(logprobs)}, "
                f"model_steps={len(model_steps)}, mask={n if mask is None else len(mask)})"
            )
        # A state that predates the mask gets its implicit ones made explicit first (a mask
        # already as long as the response is extended in place: the producer's hot path).
        if len(self.response_mask) != len(self.response_ids):
            self.response_mask = self.loss_mask()
        self.response_mask.extend([1] * n if mask is None else mask)
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
        """A deep copy of everything but the read-only prompt ids and label (shared), built field
        by field: number lists copied flat, dicts of plain values (str, int, float, bool, None)
        copied flat, anything else deep-copied. `copy.deepcopy` walked every token, and even
        `copy.copy` + setattr cost 4x this (a copy is taken of every continued group)."""
        # Positional, in field order (checked below): keyword passing cost a third more.
        return type(self)(
            self.uid, self.group_id, self.task, self.prompt_index, self.epoch, self.prompt_text,
            self.prompt_ids, self.label, list(self.response_ids),
            list(self.response_logprobs), list(self.response_model_steps), list(self.response_mask),
            self.response_text, _copy_mapping(self.reward), self.status, self.finish_reason, self.num_aborts,
            self.sample_seed, _copy_mapping(self.extra),
        )


# What `extra` says about a response's failure (rlharness/core/member_failures.py): gone with the response.
_RESPONSE_FAILURE_KEYS = ("infra_failure", "agent_traceback", "agent_output")

# The fields `clone` and `make_group` pass by position, in order: a field added to RolloutState
# (or moved) must be added there too.
_FIELD_ORDER = (
    "uid", "group_id", "task", "prompt_index", "epoch", "prompt_text", "prompt_ids", "label", "response_ids",
    "response_logprobs", "response_model_steps", "response_mask", "response_text", "reward", "status",
    "finish_reason", "num_aborts", "sample_seed", "extra")
if _FIELD_ORDER != tuple(f.name for f in fields(RolloutState)):
    raise AssertionError(f"RolloutState.clone/make_group are out of date: fields are "
                         f"{[f.name for f in fields(RolloutState)]}, they pass {list(_FIELD_ORDER)}")

# Immutable values a flat copy may share.
_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def _copy_mapping(value: Any) -> Any:
    """Deep copy of a dict (or None); flat when every value is a plain immutable."""
    if value is None:
        return None
    if type(value) is dict:
        for v in value.values():
            if type(v) not in _PLAIN_TYPES:
                return copy.deepcopy(value)
        return value.copy()
    return copy.deepcopy(value)


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
    """`k` fresh copies of one prompt sharing a group id (member uids: "<group id>-<m>") and one
    (read-only) copy of the prompt ids and label."""
    group_id = new_uid()
    init = Status.INIT
    prompt_ids, label = list(prompt_ids), dict(label)
    # Positional, in field order (see _FIELD_ORDER): this runs for every member of every fresh group.
    return [
        RolloutState(group_id + _member_suffix(m), group_id, task, prompt_index, epoch, prompt_text, prompt_ids, label,
                     [], [], [], [], "", None, init, None, 0, member_seed, {})
        for m, member_seed in enumerate(member_seeds(seed, task, epoch, prompt_index, k))
    ]


_MEMBER_SUFFIXES = tuple(f"-{m}" for m in range(64))


def _member_suffix(m: int) -> str:
    return _MEMBER_SUFFIXES[m] if m < 64 else f"-{m}"


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from its parts, the same in every process (unlike hash())."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def member_seeds(seed: int, task: str, epoch: int, prompt_index: int, k: int) -> list[int]:
    """The `k` members' 63-bit seeds, the same in every process: eight per 64-byte blake2b digest
    of (seed, task, epoch, prompt_index, block), so a group of up to 8 costs one hash (a hash
    per member was a tenth of the producer's time, overhead benchmark)."""
    seeds: list[int] = []
    block = 0
    while len(seeds) < k:
        digest = hashlib.blake2b(repr((seed, task, epoch, prompt_index, block)).encode(), digest_size=64).digest()
        seeds += [x >> 1 for x in _EIGHT_U64.unpack(digest)]
        block += 1
    del seeds[k:]
    return seeds


_EIGHT_U64 = struct.Struct("<8Q")


def oldest_version(group: Group) -> float:
    """The weight version of the group's oldest token (inf for a group without tokens)."""
    return min((min(s.response_model_steps) for s in group if s.response_model_steps), default=float("inf"))


def staleness(version: float, train_step: int) -> float:
    """Staleness of a token of weight `version` if trained at `train_step`:
    train_step - version - 1. Measured per token: a group's oldest token decides (-inf
    for a group without tokens, which is never stale)."""
    return train_step - version - 1


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
    # [B] float: each sample's score (reward + shaping); algo.advantage=gae turns it into token rewards
    # and the advantages at train time (the backend's critic), so `advantages` is 0 until then.
    scores: Any = None
