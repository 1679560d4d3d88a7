"""Non-finite values never train or get saved (issue 22, item 1).

- every float config value is finite (one generic check over the whole schema), refused in one line;
- a reward that is not a finite float32 fails its group, with the reason (router, remote, any judger);
- a step whose loss or gradient is non-finite is skipped and counted; `trainer.max_nonfinite_steps`
  in a row stop the run in one line naming the step and the likely cause, the last checkpoint kept;
- no checkpoint is written from non-finite weights; run files stay strict JSON.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from dataclasses import fields, is_dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlharness.backend.learner import Learner, NonFiniteWeights
from rlharness.core.checkpoint import latest_checkpoint
from rlharness.config.schema import (AlgoConf, ConfigError, ModelConf, RemoteJudgerConf, RouterJudgerConf,
                                     TorchBackendConf)
from rlharness.judger.base import Judger
from rlharness.judger.remote import RemoteJudger
from rlharness.judger.router import RouterJudger
from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import json_line
from rlharness.launch.preflight import compose_checked
from rlharness.core.run_dir import RunDir
from rlharness.core.types import Group, RolloutState, Status
from tests.faults.test_refused_input import refused
from tests.helpers import HANG_S, run_cli

pytestmark = [pytest.mark.timeout(300)]

# Group choices that between them hold every float key of the schema.
CHOICES = [
    [], ["strategy=async"], ["engine=sim", "backend=sim"], ["engine=vllm"], ["judger=router"], ["judger=remote"],
    ["backend=deepspeed", "cluster=local_ray", "engine=sim"], ["-m", "cluster=slurm"], ["experiment=arith_mix"],
]


def float_keys(obj, prefix: str = "") -> list[str]:
    """Dotted keys of every float value in a config object."""
    if is_dataclass(obj):
        items = [(f.name, getattr(obj, f.name)) for f in fields(obj)]
    elif isinstance(obj, dict):
        items = list(obj.items())
    else:
        return [prefix[:-1]] if isinstance(obj, float) else []
    return [k for name, value in items for k in float_keys(value, f"{prefix}{name}.")]


def test_every_float_config_value_must_be_finite():
    checked = set()
    for choice in CHOICES:
        overrides = [o for o in choice if not o.startswith("-")]
        cfg = compose_checked(overrides)
        OmegaConf.set_struct(cfg, False)
        del cfg["hydra"]
        cfg.run_dir = "x"
        conf = OmegaConf.to_object(cfg)
        for key in float_keys(conf):
            for bad in (float("nan"), float("inf"), float("-inf")):
                broken = cfg.copy()
                OmegaConf.update(broken, key, bad, merge=False)
                with pytest.raises(ConfigError) as err:
                    OmegaConf.to_object(broken)
                assert str(err.value).startswith(f"{key}=") and "finite" in str(err.value), (key, str(err.value))
            checked.add(key)
    # The keys the issue found, among the many covered.
    assert {"algo.lr", "algo.min_lr_ratio", "algo.kl_coef", "judger.weights.math", "eval.temperature",
            "strategy.over_sample_threshold", "tasks.padded.weight", "cluster.engine_cpus"} <= checked
    assert len(checked) > 40


def test_a_non_finite_value_is_refused_on_the_command_line(tmp_path):
    refused(["algo.lr=inf", "logger.mode=disabled"], tmp_path, ["algo.lr=inf", "finite"])
    assert not (tmp_path / "outputs").exists()


# ----------------------------------------------------------------------------- rewards
def group_of(n: int = 2) -> Group:
    label = {"answer": "42"}
    return Group.from_samples([
        RolloutState(uid=f"u{i}", group_id="g", task="t", prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[1],
                     response_ids=[2], response_logprobs=[-1.0], response_model_steps=[0], response_text="42",
                     label=label, status=Status.COMPLETED) for i in range(n)])


class FixedScore(Judger):
    """A user's judger whose scoring is cheap (inline) and returns a fixed score."""

    name = "fixed"

    def __init__(self, value: float):
        self.value = value

    def score(self, response_text, label):
        return {"score": self.value}

    score_inline = score


def judged(judger: Judger) -> Group:
    return asyncio.run(judger.judge_group(group_of(), timeout_s=HANG_S))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e39, -4e38])
def test_a_reward_outside_float32_fails_its_group(value):
    judger = FixedScore(value)
    group = judged(judger)
    assert all(s.status == Status.FAILED for s in group)
    assert "float32" in group.drop_reason and "fixed" in group.drop_reason
    assert judger.stats()["rewards_out_of_range"] == 1 and judger.stats()["groups_failed"] == 1


def test_a_float32_reward_is_kept():
    group = judged(FixedScore(-1e30))
    assert all(s.status == Status.COMPLETED and s.reward["score"] == -1e30 for s in group)


def test_router_composition_beyond_float32_fails_the_group():
    judger = RouterJudger(RouterJudgerConf(weights={"math": 1e300, "format": 0.0}))
    group = judged(judger)
    assert group.status == Status.FAILED and "float32" in group.drop_reason
    assert judger.stats()["rewards_out_of_range"] == 1


@pytest.fixture
def judge_replying():
    """A real HTTP judge on 127.0.0.1 that answers every POST with the given body."""
    servers = []

    def start(body: bytes) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/judge"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_remote_score_beyond_float32_fails_its_group(judge_replying):
    url = judge_replying(b'{"score": 1e39}')  # finite as a double: inf in float32
    judger = RemoteJudger(RemoteJudgerConf(url=url, max_retries=0))

    async def main():
        try:
            return await judger.judge_group(group_of(), timeout_s=HANG_S)
        finally:
            await judger.close()

    group = asyncio.run(main())
    assert group.status == Status.FAILED and "1e+39" in group.drop_reason
    assert judger.stats()["rewards_out_of_range"] == 1 and judger.stats()["groups_failed"] == 1


# ----------------------------------------------------------------------------- steps and checkpoints
def make_batch(advantage: float):
    from rlharness.core.types import TrainBatch

    ids = torch.tensor([[1, 5, 6, 7, 8], [1, 5, 9, 10, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 1, 1, 0]], dtype=torch.float32)
    return TrainBatch(input_ids=ids, attention_mask=attn, response_mask=mask,
                      advantages=mask * torch.tensor([[advantage], [-advantage]]),
                      rollout_logprobs=-3.0 * mask, model_steps=torch.where(mask > 0, 0, -1), train_step=1,
                      num_groups=1, max_response_len=3, temperature=1.0)


def weights(b: Learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in b.model.state_dict().items()}


def test_a_non_finite_gradient_skips_the_update_and_says_so(tiny_model_dir):
    b = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir),
                     AlgoConf(name="t", loss_agg="seq_mean_token_sum_norm"), total_steps=4, seed=0)
    before = weights(b)
    out = asyncio.run(b.train_step(make_batch(1e30)))  # Dr.GRPO-sized advantage: the gradient norm overflows
    assert out["train/skipped_updates"] == 1 and out["train/weights_finite"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in b.model.state_dict().items())
    out = asyncio.run(b.train_step(make_batch(1.0)))
    assert out["train/skipped_updates"] == 0 and math.isfinite(out["train/grad_norm"])


def test_no_checkpoint_is_written_from_non_finite_weights(tiny_model_dir, tmp_path):
    b = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir), AlgoConf(name="t"), total_steps=4, seed=0)
    b.save_blocking(str(tmp_path / "good"))  # finite weights save
    with torch.no_grad():
        next(b.model.parameters()).view(-1)[0] = float("nan")
    assert not b.weights_finite()
    with pytest.raises(NonFiniteWeights, match="non-finite"):
        b.save_blocking(str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()


def test_run_files_are_strict_json():
    line = json_line({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")}, "e": torch.tensor(2.5)})
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}")) == {
        "a": None, "b": [1.0, None], "c": {"d": None}, "e": 2.5}


def strict_rows(path: Path) -> list[dict]:
    return [json.loads(ln, parse_constant=lambda c: pytest.fail(f"{path}: bare {c}"))
            for ln in path.read_text().splitlines() if ln.strip()]


def test_non_finite_steps_in_a_row_stop_the_run_in_one_line(tmp_path):
    """Dr.GRPO (no std normalisation) with a router score of 1e30: the gradient norm overflows on every
    step whose group has signal; with max_nonfinite_steps=1 the first stops the run."""
    run_dir = tmp_path / "run"
    proc = run_cli(["algo=drgrpo", "judger=router", "judger.weights.math=0", "judger.weights.format=1e30",
                    "judger.format_pattern='(?s)[0-4].*'", "trainer.max_nonfinite_steps=1", "total_steps=8",
                    "batch_size=4", "sampler.prompt_repeat_k=8", "eval_every=0", "eval.num_prompts=2",
                    "save_every=1", "logger.mode=disabled", f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path, check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert lines[-1].startswith("error: step ") and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "trainer.max_nonfinite_steps=1" in lines[-1] and "non-finite gradient" in lines[-1], lines[-1]
    assert "rewards from 0 to 1e+30" in lines[-1] and "algo.advantage=drgrpo" in lines[-1], lines[-1]
    stopped_at = int(lines[-1].split()[2].rstrip(":"))
    # Every step before it was trained and saved; the step that stopped the run left nothing behind.
    found = latest_checkpoint(run_dir)
    assert (found[0] if found else 0) == stopped_at - 1
    rows = strict_rows(RunDir(run_dir).metrics)
    assert [r["step"] for r in rows] == list(range(stopped_at))
    trained, _ = read_ledger(run_dir)
    assert {r["train_step"] for r in trained} == set(range(1, stopped_at))


def test_non_finite_steps_are_counted_and_only_a_run_of_them_stops():
    from rlharness.trainer.nonfinite import NonFiniteGuard, NonFiniteTraining, step_problem

    guard = NonFiniteGuard(3, AlgoConf(name="t", lr=1e-3))
    bad = {"train/loss": float("nan"), "train/skipped_updates": 1.0, "train/num_updates": 1.0}
    good = {"train/loss": 0.5, "train/grad_norm": 1.0, "train/skipped_updates": 0.0}
    seen = [guard.record(s, step_problem(m), m, {}) for s, m in enumerate([bad, bad, good, bad, bad], start=1)]
    assert [r["train/nonfinite_steps"] for r in seen] == [1, 2, 2, 3, 4]
    assert [r["train/nonfinite_step"] for r in seen] == [1, 1, 0, 1, 1]
    with pytest.raises(NonFiniteTraining, match=r"step 6: 3 non-finite steps in a row .*algo.lr=0.001"):
        guard.record(6, step_problem(bad), bad, {})
    # Weights that went non-finite stop the run at once, and nothing may be saved from them.
    with pytest.raises(NonFiniteTraining, match="step 7: the weights are non-finite"):
        guard.record(7, None, {**good, "train/weights_finite": 0.0}, {})
    assert guard.weights_bad
