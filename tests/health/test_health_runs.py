"""Health monitors in real runs where their condition is made to happen: one warning line naming the
step, the signal, the evidence and the advice; `on_alarm=stop` ends the run with exit status 3,
keeping the last checkpoint; the bias metrics show what an async run drops."""

from __future__ import annotations

import re
import statistics

import pytest

from rlharness.config.schema import HealthConf
from rlharness.core.checkpoint import latest_checkpoint
from rlharness.health.alarm import EXIT_HEALTH_STOP
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.faults.test_refused_input import SIM
from tests.helpers import run_cli

pytestmark = [pytest.mark.timeout(900)]

ALARM = re.compile(r"step (\d+): health alarm (\w+): ([^:]+): (.+); usually: (.+) \(health\.\w+\.on_alarm=(warn|stop)")


def alarms(text: str) -> list[tuple[int, str]]:
    """(step, monitor) of every alarm line, checking each names its signal, evidence and advice."""
    out = []
    for line in text.splitlines():
        m = ALARM.search(line)
        if m:
            assert m.group(4) and m.group(5), line
            out.append((int(m.group(1)), m.group(2)))
    return out


def test_a_stop_alarm_ends_the_run_with_exit_3_and_keeps_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    # The sim engine's random tokens are never a right sum: every group has equal rewards (0).
    done = run_cli([*SIM, "total_steps=10", "health.zero_signal.steps=3", "health.zero_signal.on_alarm=stop",
                    f"hydra.run.dir={run_dir}"], cwd=tmp_path, check=False)
    assert done.returncode == EXIT_HEALTH_STOP, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("error: step 3: stopped by health.zero_signal.on_alarm=stop: no learning signal (the alarm line "
                    "in train.log has the evidence); no checkpoint of step 3 was written, the last one is kept"), last
    assert "Traceback" not in done.stderr
    assert latest_checkpoint(run_dir)[0] == 2  # save_every=2: step 3 alarmed and was not saved
    rows = read_metrics(RunDir(run_dir).metrics)
    assert rows[-1]["step"] == 3 and rows[-1]["health/alarms"] == 1.0 and rows[-1]["health/zero_signal_steps"] == 3
    assert alarms(RunDir(run_dir).log().read_text()) == [(3, "zero_signal")]
    # The run continues from its last checkpoint; the monitor's streak continues from the rows kept.
    done = run_cli([f"resume={run_dir}", "total_steps=4", "health.zero_signal.on_alarm=warn"], cwd=tmp_path)
    rows = read_metrics(RunDir(run_dir).metrics)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and rows[3]["health/zero_signal_steps"] == 3


def test_a_run_that_never_scores_has_no_signal_and_a_frozen_reward(tmp_path):
    """The sim engine's random tokens are never a right sum: every reward is 0, from the first step on.
    With the default thresholds: no signal after 5 steps, a reward distribution that stopped moving
    after 10 (its window), each said once and the run goes on (on_alarm=warn)."""
    run_dir = tmp_path / "run"
    run_cli([*SIM, "total_steps=10", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert alarms(RunDir(run_dir).log().read_text()) == [(5, "zero_signal"), (10, "reward_frozen")]
    rows = read_metrics(RunDir(run_dir).metrics)
    assert rows[-1]["step"] == 10 and rows[-1]["health/reward_frozen_ratio"] < HealthConf().reward_frozen.max_ratio
    assert latest_checkpoint(run_dir)[0] == 10


def test_host_memory_that_grows_every_step_is_caught(tmp_path):
    run_dir = tmp_path / "run"
    run_cli([*SIM, "total_steps=10", "health.host_memory.warmup_steps=2", "health.host_memory.window_steps=5",
             "health.host_memory.max_mb_per_step=30", f"hydra.run.dir={run_dir}"], cwd=tmp_path,
            env={"RLHARNESS_TEST_LEAK_MB_PER_STEP": "60"})
    fired = alarms(RunDir(run_dir).log().read_text())
    assert (7, "host_memory") in fired, fired  # the first full window: steps 3-7
    rows = read_metrics(RunDir(run_dir).metrics)
    assert rows[7]["health/rss_mb_per_step"] > 40 and rows[7]["health/rss_mb"] > rows[3]["health/rss_mb"] + 200


def test_a_policy_rewarded_for_repeating_itself_degenerates_and_its_kl_accelerates(tmp_path):
    """The format judger pays for three equal digits in a row; the LR warms up to 1e-3 over 25 steps. The
    policy learns to repeat digits until the budget cuts it (degenerate outputs, responses at the budget)
    and the KL to the starting policy accelerates (measured: docs/operations/health.md). Its entropy falls
    to a fraction of its start while the reward it is paid rises 0 -> 1: that is convergence onto what
    scores, not the collapse the entropy monitor is for."""
    run_dir = tmp_path / "run"
    run_cli(["judger=format", r"judger.pattern='(?s).*(\d)\1\1.*'", "algo.lr=1e-3", "algo.warmup_steps=25",
             "algo.lr_schedule=constant", "algo.kl_coef=0.01", "batch_size=16", "total_steps=36", "eval_every=0",
             "save_every=0", "eval.num_prompts=8", "logger.mode=disabled", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path)
    fired = {monitor for _, monitor in alarms(RunDir(run_dir).log().read_text())}
    assert {"degenerate_outputs", "kl_acceleration"} <= fired, fired
    assert not fired & {"entropy_collapse", "reward_hacking", "host_memory"}, fired
    rows = read_metrics(RunDir(run_dir).metrics)
    assert min(r["health/entropy_ratio"] for r in rows if "health/entropy_ratio" in r) < 0.3


def test_router_parts_moving_apart_are_reward_hacking(tmp_path):
    """The router trains on a format part that pays for answers ending in 0 or 5 and watches the math
    part at weight 0: the format part rises while the right answers fall."""
    run_dir = tmp_path / "run"
    run_cli(["judger=router", "judger.weights={format: 1.0, math: 0.0}", "judger.format_pattern='[0-9]*[05]'",
             "agent.sampling.temperature=0.5", "batch_size=32", "total_steps=30", "eval_every=0", "save_every=0",
             "eval.num_prompts=8", "logger.mode=disabled", "health.reward_hacking.window_steps=10",
             f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    fired = alarms(RunDir(run_dir).log().read_text())
    assert any(monitor == "reward_hacking" for _, monitor in fired), fired
    rows = read_metrics(RunDir(run_dir).metrics)
    assert rows[-1]["rollout/reward_format_mean"] > rows[1]["rollout/reward_format_mean"]
    assert rows[-1]["rollout/reward_math_mean"] < rows[1]["rollout/reward_math_mean"]


def test_an_async_run_that_drops_long_answers_says_so(tmp_path):
    """Token-mode expiry with max_staleness=0 drops what outlives a weight version: the long answers."""
    run_dir = tmp_path / "run"
    run_cli(["engine=sim", "backend=sim", "strategy=async", "max_staleness=0", "strategy.over_sample_threshold=1.0",
             "agent.sampling.max_tokens=96", "engine.mean_response_len=40", "engine.cv=1",
             "engine.time_per_token_s=0.002", "backend.step_time_s=0.15", "total_steps=20", "batch_size=8",
             "sampler.prompt_repeat_k=4", "eval_every=0", "eval.num_prompts=4", f"hydra.run.dir={run_dir}"],
            cwd=tmp_path)
    rows = [r for r in read_metrics(RunDir(run_dir).metrics) if r["step"] > 0]
    last = rows[-1]
    assert last["bias/dropped_by_len_bucket/72-96"] > 2 * last["bias/dropped_by_len_bucket/0-24"] > 0, last
    assert statistics.fmean(r["bias/trained_len_over_generated"] for r in rows) < 1.0
    assert sum(r["bias/dropped_samples"] for r in rows) > 0
    wandb_file = next((run_dir / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    for key in (b"bias/generated_len", b"bias/trained_len", b"bias/generated_reward", b"bias/trained_reward"):
        assert key in wandb_file
    assert b"histogram" in wandb_file
