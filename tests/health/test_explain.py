"""`python train.py ... explain=true` (rlharness/launch/explain.py): what the config means per step, printed
without starting work or creating a directory, and the same numbers as a real run then logs."""

from __future__ import annotations

import pytest

from rlharness.launch.explain import explain
from rlharness.logging_utils.metrics import read_metrics
from rlharness.launch.preflight import compose_typed
from rlharness.core.run_dir import RunDir
from tests.helpers import run_cli, run_in_process

pytestmark = [pytest.mark.timeout(600)]

# A small real run whose batch arithmetic has something to count: 2 mini-batches of 12 rows, micro-batches
# of 5 rows (3 per mini-batch), weights synced every 2 steps and before the eval at step 3.
RUN = ["batch_size=6", "sampler.prompt_repeat_k=4", "algo.mini_batches=2", "algo.micro_batch_size=5",
       "total_steps=4", "eval_every=3", "sync_weights_interval=2", "save_every=0", "eval.num_prompts=8",
       "logger.mode=disabled"]


def test_explain_prints_and_starts_nothing(tmp_path):
    done = run_cli([*RUN, "explain=true"], cwd=tmp_path)
    out = done.stdout
    assert "per step: 6 prompt groups x 4 samples = 24 samples" in out, out
    assert "= 2 optimizer step(s) per batch" in out and "6 micro-batch(es) per step" in out, out
    assert "weight syncs: 3 over 4 steps" in out and "staleness: 1" in out, out
    assert "memory of one training micro-batch of the longest sample (5 rows x 128 tokens" in out, out
    assert "suspicious: nothing found" in out, out
    assert list(tmp_path.iterdir()) == [], "explain=true created something"


def test_explain_matches_what_a_run_logs(tmp_path):
    _, conf = compose_typed(RUN)
    said = explain(conf)
    run_in_process(tmp_path / "run", RUN)
    rows = read_metrics(RunDir(tmp_path / "run").metrics)
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == conf.total_steps
    for r in steps:
        assert r["rollout/num_samples"] == said.samples_per_step
        assert r["train/num_updates"] == said.optimizer_steps
        assert said.micro_batches_exact and r["train/micro_batches"] == said.micro_batches_per_rank
        assert r["rollout/tokens_generated"] <= said.tokens_generated_at_most
        assert r["staleness/max"] <= said.max_staleness
    assert max(r["staleness/max"] for r in steps) == said.max_staleness == 1  # reached at step 2
    assert sum(r["perf/weight_sync_bytes"] > 0 for r in steps) == said.weight_syncs == 3
    assert sum("eval/accuracy" in r for r in rows) == said.evals == 3


@pytest.mark.parametrize("overrides, expect", [
    (["algo.mini_batches=600", "batch_size=8", "sampler.prompt_repeat_k=4"],
     "algo.mini_batches=600 > 32 samples per step: 568 mini-batch(es) are empty (gradient accumulation of zero)"),
    (["eval_every=500", "total_steps=100"], "eval_every=500 > total_steps=100: only the final eval runs"),
    (["task.max_prompt_tokens=125"], "task.max_prompt_tokens=125 + agent.sampling.max_tokens=8 = 133 is above the "
                                     "model's 128 positions"),
    (["agent.sampling.temperature=0"], "agent.sampling.temperature=0 (greedy) with algo.advantage=grpo"),
    (["agent=openai_gateway", "task.apply_chat_template=false", "experiment=chat_math", "agent.timeout_s=5"],
     "agent.judge_timeout_s=10 is longer than agent.timeout_s=5"),
    (["judger=remote", "judger.timeout_s=5", "agent.judge_timeout_s=10"],
     "judger.timeout_s=5 x (max_retries=3 + 1) plus back-offs (23.5 s) exceed agent.judge_timeout_s=10"),
    (["algo.warmup_steps=400"], "algo.warmup_steps=400 >= total_steps=400"),
])
def test_legal_but_suspicious_settings_are_named(overrides, expect):
    _, conf = compose_typed(overrides)
    found = explain(conf).suspicious
    assert any(expect in s for s in found), found


def test_a_sweep_is_explained_point_by_point_and_not_run(tmp_path):
    done = run_cli(["-m", "explain=true", "batch_size=4,8", "logger.mode=disabled"], cwd=tmp_path)
    assert "== sweep point 0: explain=True batch_size=4" in done.stdout, done.stdout
    assert "per step: 8 prompt groups x 8 samples = 64 samples" in done.stdout, done.stdout
    assert list(tmp_path.iterdir()) == []
