"""The `rollouts/` ledger: every trained sample, and every group dropped, with the reason.

`rollouts/step_XXXXXXXX.jsonl` holds one row per sample trained at that step;
`rollouts/dropped.jsonl` one row per sample of a group that was filtered, failed or
dropped, and per member left out of its trained group (`algo.failed_member_policy=mask`: it
failed for a reason that is not the policy's), with the reason. A multi-turn sample also carries
`tool_calls` and `turns` (the model's text and each tool output in order); a gateway sample its
`segments` (token sequences trained), `token_drift` when its tokens differ from its re-rendered
conversation, and, when it failed, `infra_failure` and the agent program's own `agent_traceback`
and `agent_output`. Together with the checkpoint's buffer they account for every prompt drawn.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rlharness.core.member_failures import masked
from rlharness.logging_utils.metrics import json_line, jsonl_rows, replace_text
from rlharness.core.redaction import redact
from rlharness.core.run_dir import RunDir, step_of
from rlharness.core.types import Group, RolloutState

log = logging.getLogger(__name__)


def sample_row(group: Group, s: RolloutState, train_step: int) -> dict[str, Any]:
    """The row of sample `s` of `group`."""
    row = {
        "uid": s.uid,
        "group_id": group.group_id,
        "task": group.task,
        "prompt_index": group.prompt_index,
        "epoch": group.epoch,
        "train_step": train_step,
        "min_policy_version": s.min_policy_version,
        "max_policy_version": s.max_policy_version,
        "status": s.status.value,
        "reward": (s.reward or {}).get("score"),
        "response_len": len(s.response_ids),
        "num_aborts": s.num_aborts,
        "finish_reason": s.finish_reason,
        "prompt": group.prompt_text,
        "response": s.response_text,
    }
    admission = group.admission
    if admission is not None:  # the task's bound, and the admission it held
        if admission.max_staleness is not None:
            row["max_staleness"] = admission.max_staleness
        row["admit_version"], row["admit_step"] = admission.version, admission.step
    if s.teacher_logprobs and len(s.teacher_logprobs) == len(s.response_logprobs):
        # Distillation: the sample's mean reverse KL to the teacher over its trained tokens (nats per token).
        kept = [(lp, t) for lp, t, m in zip(s.response_logprobs, s.teacher_logprobs, s.loss_mask()) if m]
        row["reverse_kl"] = sum(lp - t for lp, t in kept) / len(kept) if kept else None
    if "turns" in s.extra:  # multi-turn loops: the model's turns and the tool outputs, readable
        row["tool_calls"] = s.extra.get("tool_calls", 0)
        row["turns"] = s.extra["turns"]
    for key in ("segments", "token_drift"):
        if key in s.extra:
            row[key] = s.extra[key]
    for key in ("infra_failure", "agent_traceback", "agent_output"):  # texts an error wrote: secrets out
        if key in s.extra:
            row[key] = redact(s.extra[key])
    return row


class RolloutLedger:
    def __init__(self, run_dir: str | Path, resume_step: int = 0):
        self.run = RunDir(run_dir)
        self.dir = self.run.rollouts
        self.dropped_path = self.run.dropped
        if resume_step > 0:
            self._say_what_is_missing(resume_step)
        self.dir.mkdir(parents=True, exist_ok=True)
        # A resumed run redoes the steps after its checkpoint: forget what they wrote.
        for p in self.dir.glob("step_*.jsonl"):
            if step_of(p.name) > resume_step:
                p.unlink()
        if self.dropped_path.exists():  # a line that does not read is said (file:line) and left out
            keep = [raw for row, raw in jsonl_rows(self.dropped_path, "train_step", warn=True)
                    if row["train_step"] <= resume_step]
            replace_text(self.dropped_path, "".join(ln + "\n" for ln in keep))

    def _say_what_is_missing(self, resume_step: int) -> None:
        """A resume finds the ledger of the steps up to its checkpoint; what is gone is said, once."""
        if not self.dir.is_dir():
            log.warning("%s is missing (deleted?): the ledger of steps 1-%d is lost; the resumed run writes "
                        "its steps from %d on", self.dir, resume_step, resume_step + 1)
            return
        missing = [s for s in range(1, resume_step + 1) if not self.run.rollout(s).is_file()]
        if missing:
            shown = ", ".join(str(s) for s in missing[:10]) + (", ..." if len(missing) > 10 else "")
            log.warning("%s: the ledger files of %d of the checkpoint's %d steps are missing (deleted?): steps "
                        "%s", self.dir, len(missing), resume_step, shown)

    def write_step(self, train_step: int, groups: list[Group], failed_member_policy: str = "mask") -> None:
        """The trained samples; a member the batch left out (`masked`) goes to the dropped rows instead."""
        rows, left_out = [], []
        for g in groups:
            for s in g.samples:
                if masked(s, failed_member_policy):
                    row = {**sample_row(g, s, train_step), "reason": redact(s.extra["infra_failure"])}
                    left_out.append(json_line(row))
                else:
                    rows.append(json_line(sample_row(g, s, train_step)))
        replace_text(self.run.rollout(train_step), "".join(r + "\n" for r in rows))
        if left_out:
            with open(self.dropped_path, "a") as fh:
                fh.write("".join(r + "\n" for r in left_out))

    def write_dropped(self, train_step: int, dropped: list[Group]) -> None:
        """The rows of groups dropped (FILTERED, FAILED), each with its group's `drop_reason` as `reason`."""
        if not dropped:
            return
        with open(self.dropped_path, "a") as fh:
            for group in dropped:
                for s in group.samples:
                    row = {**sample_row(group, s, train_step), "reason": redact(group.drop_reason)}
                    fh.write(json_line(row) + "\n")


def read_ledger(run_dir: str | Path) -> tuple[list[dict], list[dict]]:
    """(trained rows sorted by step, dropped rows) — for tests and analysis."""
    run = RunDir(run_dir)
    trained = []
    for p in sorted(run.rollouts.glob("step_*.jsonl")):
        trained += [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
    dropped = []
    if run.dropped.exists():
        dropped = [json.loads(ln) for ln in run.dropped.read_text().splitlines() if ln.strip()]
    return trained, dropped
