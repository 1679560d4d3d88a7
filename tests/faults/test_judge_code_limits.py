"""User-written judging code cannot hang a run: an llm judge's Jinja template and `judger.score_pattern`,
and `judger=format`'s pattern, run where they can be killed (judging processes, replaced past
`agent.judge_timeout_s`), so a timeout fails the member's group with its reason (or scores it 0,
`judger.on_timeout=zero`), the run goes on, and SIGTERM stops it cleanly; the template is rendered once
before the run on a task's first row, so an error, a sandbox violation, a missing key, a rendering
that does not finish or is too long is refused in one line before any work.

Real runs: the policy on the simulated engine (judging is what is under test), the llm judge on the
embedded tiny model (`judger.path` defaults to the policy's checkpoint) with the hf engine."""

from __future__ import annotations

import json
import signal

import pytest

from rlharness.core.fault_points import signal_at
from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import read_metrics
from tests.faults.test_judging_faults import col, write_task
from tests.faults.test_refused_input import refused
from tests.helpers import run_cli, start_cli

pytestmark = [pytest.mark.timeout(600)]

LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
# Catastrophic for re and for regex alike on any non-empty text (minutes); never matches.
CATASTROPHIC = r"(?:(?:.?){500}){500}\Z\d"
JUDGE = ["judger=llm", "judger.template='{{ response }}+000='", "judger.max_tokens=4", "judger.reward_scale=0.001", "judger.num_workers=2",
         "sampler.prompt_repeat_k=2"]


def answers(hang_every: int = 4) -> list[str]:
    """Answers of the task's rows: every `hang_every`-th (never the first) is HANG."""
    return ["HANG" if i % hang_every == hang_every - 1 else str(i + i % 7) for i in range(16)]


def task(tmp_path, hang_every: int = 4, eval_prompts: int = 8) -> list[str]:
    """The run's task; `eval_prompts=1` where every judgement spins to its timeout (the evaluations at the
    first and last step judge too)."""
    return [o.replace("eval.num_prompts=8", f"eval.num_prompts={eval_prompts}")
            for o in write_task(tmp_path / "data", answers(hang_every)) if o != "save_every=0"]


def template(body: str) -> str:
    return f"judger.template='{body}'"


def test_a_template_that_hangs_on_some_rows_fails_those_groups_at_the_timeout(tmp_path):
    run_dir = tmp_path / "run"
    hang = template('{% if label.answer == "HANG" %}' + LOOPS + "{% endif %}{{ response }}+000=")
    run_cli([*task(tmp_path, eval_prompts=1), *JUDGE, hang, "agent.judge_timeout_s=3", "total_steps=2",
             f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    trained, dropped = read_ledger(run_dir)
    hung = [r for r in dropped if "rendering judger.template: timeout after 3 s" in r["reason"]]
    assert hung and col(metrics, "judge/timeouts") >= len({r["group_id"] for r in hung}), dropped[:2]
    assert col(metrics, "judge/processes_replaced") >= 1
    assert len({r["group_id"] for r in trained}) == 2 * 4  # both steps trained full batches


def test_a_catastrophic_score_pattern_costs_its_timeout_and_the_run_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    run_cli([*task(tmp_path, 99, eval_prompts=1), *JUDGE, "judger.on_timeout=zero",
             f"judger.score_pattern='{CATASTROPHIC}'", "agent.judge_timeout_s=5", "total_steps=1",
             f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert col(metrics, "judge/timeouts") >= 1 and col(metrics, "judge/scored_zero_on_timeout") >= 1
    assert col(metrics, "judge/processes_replaced") >= 1
    assert [r["step"] for r in metrics if "train/loss" in r] == [1]


def test_a_format_pattern_that_backtracks_forever_does_not_stall_the_event_loop(tmp_path):
    run_dir = tmp_path / "run"
    run_cli([*task(tmp_path, 99, eval_prompts=1), "judger=format",
             f"judger.pattern='{CATASTROPHIC}'", "judger.on_timeout=zero", "judger.num_workers=2",
             "agent.judge_timeout_s=1", "sampler.prompt_repeat_k=2", "total_steps=1", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert col(metrics, "judge/timeouts") >= 1 and [r["step"] for r in metrics if "train/loss" in r] == [1]


def test_sigterm_stops_a_run_whose_judge_is_stuck_in_a_template(tmp_path):
    """SIGTERM arrives while members hang in rendering (a minute each): the run stops cleanly, at once,
    not when stop_timeout_s's watchdog gives up (and not never: `re` and Jinja held the interpreter)."""
    run_dir = tmp_path / "run"
    hang = template('{% if label.answer == "HANG" %}' + LOOPS + "{% endif %}{{ response }}+000=")
    # At most 5 groups in flight (batch 4 + over-sampling's 1), 2 members each: with 11 judging processes a
    # render that finishes always finds one, so a group lands (SIGTERM) while the HANG rows' renders spin.
    proc = start_cli([*task(tmp_path), *JUDGE, hang, "judger.num_workers=11",
                      "agent.judge_timeout_s=120", "total_steps=3", "save_every=1", f"hydra.run.dir={run_dir}"],
                     cwd=tmp_path, env=signal_at(signal.SIGTERM, "group_put", 1))
    assert proc.wait(300) == 128 + signal.SIGTERM, proc.stderr_text()[-3000:]
    err = proc.stderr_text()
    assert "stopped by SIGTERM at step" in err and "passed while stopping" not in err, err[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "still in flight after pause_timeout_s" in log, log[-3000:]  # the HANG rows' groups, cancelled


@pytest.mark.parametrize("body, expect", [
    (LOOPS + "{{ response }}", ["did not finish", "agent.judge_timeout_s=2"]),
    ("{{ response.__class__.__mro__ }}", ["SecurityError", "__class__"]),
    ("{{ response }} {{ label.reference }}", ["UndefinedError", "reference"]),
    ("{% for i in range(100000) %}{{ response }}{% endfor %}", ["RenderedTooLong", "judger.max_rendered_chars=16384"]),
    ("{% for i in range(200) %}{{ response }}{% endfor %}", ["RenderedTooLong", "the judge model's 128 positions"]),
])
def test_a_template_that_cannot_render_is_refused_before_work(tmp_path, body, expect):
    line = refused([*task(tmp_path, 99), *JUDGE, template(body),
                    "agent.judge_timeout_s=2"], tmp_path,
                   ["judger.template is not allowed: rendering it on the first prompt of task jsonl", *expect])
    assert "Traceback" not in line


def test_a_routers_llm_part_is_checked_under_its_key(tmp_path):
    refused([*task(tmp_path, 99), "judger=router", "+judger.weights.llm=1",
             template("{{ response.__class__ }}").replace("judger.template", "judger.llm.template")], tmp_path,
            ["judger.llm.template is not allowed", "SecurityError"])


def test_the_sample_rendering_uses_the_rows_label(tmp_path):
    """A template reading a label key the rows have renders at the start (no false refusal)."""
    run_dir = tmp_path / "run"
    run_cli([*task(tmp_path, 99), *JUDGE,
             template("{{ response }} vs {{ label.answer }}+000="), "total_steps=1", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path)
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 1
