"""The shared types: the only things that cross between stages of the spine.

A ``RolloutState`` is one sample (one prompt copy and its response). A ``Group`` holds the
``prompt_repeat_k`` samples of one prompt with the facts of the group as a whole (its id,
task, prompt, admission, drop reason, counters); groups are the unit the sampler hands
out, the agent loops generate, the replay buffer stores and the trainer consumes.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import struct
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, Iterator

from rlharness.core.redaction import redact


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
    # The distillation teacher's log-prob of each response token (empty: not scored, or no teacher).
    teacher_logprobs: list[float] = field(default_factory=list)
    response_text: str = ""
    reward: dict[str, float] | None = None
    # Why the judger scored this response 0 instead of judging it (a time or memory limit it ran past,
    # with judger.on_timeout=zero); None when it was judged.
    judge_limit: str | None = None
    status: Status = Status.INIT
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None
    num_aborts: int = 0  # times generation was interrupted (partial rollout)
    # Seeds this sample's token draws (see GenerateRequest.seed): a function of the run
    # seed and the sample's place in the data, so reruns and resumes draw the same tokens.
    sample_seed: int = 0
    # What the agent loop reports about the response, for the ledger, tables and metrics, and
    # nothing else (the producer's bookkeeping lives in typed fields of the Group). Keys:
    # `turns` (list of {"role", "text"}) and `tool_calls` (int): the multi-turn tool loop and the
    # OpenAI gateway; `calls`, `prefix_mismatch`, `segments` (ints): the gateway's calls, calls that
    # matched no token sequence held, token sequences trained; `branches` (list of dicts): the
    # sequences beyond the first, trained as rows of their own (rlharness/trainer/batch.py);
    # `token_drift` (dict): where trained tokens differ from the re-rendered conversation;
    # `agent_reward` (float): the reward an agent program returned itself (gateway);
    # `infra_failure` (str), `agent_traceback`, `agent_output`: why the sample failed for a reason
    # that is not the policy's (rlharness/core/member_failures.py).
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
                and not self.teacher_logprobs and not self.response_text and self.reward is None
                and self.judge_limit is None and self.finish_reason is None and not self.num_aborts and not self.extra)

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
        self.teacher_logprobs = []
        self.response_text = ""
        self.reward = None
        self.judge_limit = None
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
        if self.teacher_logprobs:  # a teacher's scores cover the response as it was
            self.teacher_logprobs = []
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
            list(self.teacher_logprobs), self.response_text, _copy_mapping(self.reward), self.judge_limit, self.status,
            self.finish_reason, self.num_aborts, self.sample_seed, _copy_mapping(self.extra),
        )


# What `extra` says about a response's failure (rlharness/core/member_failures.py): gone with the response.
_RESPONSE_FAILURE_KEYS = ("infra_failure", "agent_traceback", "agent_output")

# The fields `clone` and `make_group` pass by position, in order: a field added to RolloutState
# (or moved) must be added there too.
_FIELD_ORDER = (
    "uid", "group_id", "task", "prompt_index", "epoch", "prompt_text", "prompt_ids", "label", "response_ids",
    "response_logprobs", "response_model_steps", "response_mask", "teacher_logprobs", "response_text", "reward",
    "judge_limit", "status", "finish_reason", "num_aborts", "sample_seed", "extra")
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


@dataclass(frozen=True, slots=True)
class Admission:
    """How a group was admitted when it started without tokens (rlharness/producer/staleness.py):
    the engines' weight version then, the train step its place in the produced counts budgeted
    it for, and its task's staleness bound."""

    version: int
    step: int
    max_staleness: int | None  # None in checkpoints written before tasks had bounds of their own

    @property
    def staleness(self) -> int:
        """Staleness at admission: step - 1 - version."""
        return self.step - 1 - self.version


# A group's identity: fixed when it is made, and shared by every member (a sample stands alone for
# judgers, ledger rows and tables); code about the group as a whole reads it from the group.
GROUP_FACTS = ("group_id", "task", "prompt_index", "epoch", "prompt_text", "label")


@dataclass(slots=True)
class Group:
    """The samples of one prompt and what the producer knows about them as a whole.

    Its status is the worst of its members' (FAILED > ABORTED > EXPIRED > FILTERED >
    COMPLETED); the members keep their own (a continued group keeps the members that finished).
    Iterating a group iterates its samples."""

    group_id: str
    task: str
    prompt_index: int  # position of the prompt in its dataset split
    epoch: int  # sampler epoch the prompt was drawn in (-1: an eval group)
    prompt_text: str
    label: dict[str, Any]  # read-only, shared with the members
    samples: list[RolloutState]
    # The producer's bookkeeping (BOOKKEEPING below: what a fresh group starts with).
    admission: Admission | None = None  # stamped when it starts without tokens
    drop_reason: str | None = None  # why it is FAILED or FILTERED (rollouts/dropped.jsonl's `reason`)
    num_expired: int = 0  # times its responses were thrown away as too stale (replay buffer)
    num_crashes: int = 0  # times the agent loop crashed on it (failed at MAX_CRASHES_PER_GROUP)
    put_model_step: int | None = None  # the engines' weight version when it was last put into the buffer
    put_train_step: int | None = None  # the earliest train step it could be trained at then

    def __iter__(self) -> Iterator[RolloutState]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def status(self) -> Status:
        """The worst of the members' statuses."""
        samples = self.samples
        if not samples:
            raise ValueError(f"group {self.group_id} has no samples")
        first = samples[0].status
        for s in samples:
            if s.status is not first:
                return max((s.status for s in samples), key=_STATUS_PRIORITY.__getitem__)
        return first  # the usual case: every member agrees (no ranking needed)

    def oldest_version(self) -> float:
        """The weight version of the group's oldest token (inf for a group without tokens)."""
        return min((min(s.response_model_steps) for s in self.samples if s.response_model_steps), default=float("inf"))

    def num_response_tokens(self) -> int:
        return sum(len(s.response_ids) for s in self.samples)

    # ------------------------------------------------------------------ status changes
    def mark_aborted(self) -> Group:
        """Mark a group that was interrupted (or never started) ABORTED, in place.

        Members that finished keep COMPLETED and their tokens; the others keep whatever
        partial tokens they hold (the agent loop already reset them when partial rollout
        is off) and become ABORTED, so the group as a whole reports ABORTED.
        """
        for s in self.samples:
            if s.status != Status.COMPLETED:
                s.status = Status.ABORTED
        if self.status != Status.ABORTED:
            for s in self.samples:  # every member finished but the group was never judged
                s.status = Status.ABORTED
        return self

    def mark_failed(self, reason: str) -> Group:
        """Every member FAILED (a judger, the agent loop or the producer gave up on the group), with why."""
        return self._drop(Status.FAILED, reason)

    def mark_filtered(self, reason: str) -> Group:
        """Every member FILTERED (a group filter found no learning signal), with why."""
        return self._drop(Status.FILTERED, reason)

    def _drop(self, status: Status, reason: str) -> Group:
        for s in self.samples:
            s.status = status
        self.drop_reason = redact(reason)  # an error may quote a header or a URL with credentials
        return self

    # ------------------------------------------------------------------ copies
    def is_pristine(self) -> bool:
        """Fresh from `make_group`: no bookkeeping and every member pristine (`RolloutState.is_pristine`)."""
        for name, default in BOOKKEEPING.items():
            if getattr(self, name) != default:
                return False
        return all(s.is_pristine() for s in self.samples)

    def restore_pristine(self) -> None:
        """Undo whatever generation did to a group that `is_pristine` was true of (its admission stamp included)."""
        for name, default in BOOKKEEPING.items():
            setattr(self, name, default)
        for s in self.samples:
            s.restore_pristine()

    def clone(self) -> Group:
        """A copy whose members are `RolloutState.clone`s (the read-only prompt and label shared)."""
        return Group(self.group_id, self.task, self.prompt_index, self.epoch, self.prompt_text, self.label,
                     [s.clone() for s in self.samples], self.admission, self.drop_reason, self.num_expired,
                     self.num_crashes, self.put_model_step, self.put_train_step)

    @classmethod
    def from_samples(cls, samples: list[RolloutState], **bookkeeping: Any) -> Group:
        """The group of `samples` built elsewhere (tests, older checkpoints): its identity is theirs,
        which they must share."""
        if not samples:
            raise ValueError("a group needs at least one sample")
        facts = {name: getattr(samples[0], name) for name in GROUP_FACTS}
        for s in samples:
            differ = [name for name in GROUP_FACTS if getattr(s, name) != facts[name]]
            if differ:
                raise ValueError(f"sample {s.uid} differs from sample {samples[0].uid} of its group in {differ}")
        return cls(**facts, samples=list(samples), **bookkeeping)

    # ------------------------------------------------------------------ plain data (checkpoints)
    def to_dict(self) -> dict[str, Any]:
        """Plain data: the group's fields, then each member's own (its copy of the group's identity left out)."""
        return {
            **{name: getattr(self, name) for name in GROUP_FACTS},
            "label": copy.deepcopy(self.label),
            "admission": None if self.admission is None else asdict(self.admission),
            **{name: getattr(self, name) for name in BOOKKEEPING if name != "admission"},
            "samples": [{k: v for k, v in s.to_dict().items() if k not in GROUP_FACTS} for s in self.samples],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Group:
        facts = {name: d[name] for name in GROUP_FACTS}
        samples = [RolloutState.from_dict({**facts, **s}) for s in d["samples"]]  # the label shared, as make_group
        admission = d["admission"]
        return cls(**facts, samples=samples, admission=None if admission is None else Admission(**admission),
                   **{name: d[name] for name in BOOKKEEPING if name != "admission"})


# The producer's bookkeeping fields of a Group and their values in a fresh one.
BOOKKEEPING = {f.name: f.default for f in fields(Group) if f.name not in GROUP_FACTS and f.name != "samples"}


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
    samples = [
        RolloutState(group_id + _member_suffix(m), group_id, task, prompt_index, epoch, prompt_text, prompt_ids, label,
                     [], [], [], [], [], "", None, None, init, None, 0, member_seed, {})
        for m, member_seed in enumerate(member_seeds(seed, task, epoch, prompt_index, k))
    ]
    return Group(group_id, task, prompt_index, epoch, prompt_text, label, samples)


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
