"""Careless and hostile agent programs cannot stop, freeze or corrupt a run (agent=openai_gateway).

Each program runs in a process of its own: whatever it does (`sys.exit`, `os._exit`, a blocking
`time.sleep`, an endless CPU loop, returning without calling the model, an unusable reward) fails
its own sample with the reason, for a reason that is not the policy's, while the others go on; the
run reaches total_steps and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from rlharness.core.run_dir import RunDir
from rlharness.core.types import Status
from rlharness.engine.hf import HFEngine
from tests.agent.gateway_helpers import (AGENTS, ASSET, ROWS, TOK, gateway, group_asking, make_loop,  # noqa: F401
                                         model, run_groups)
from tests.helpers import run_cli

pytestmark = pytest.mark.timeout(300)


def test_each_hostile_program_fails_only_its_own_sample_with_the_reason(model):
    """Groups run at once in one event loop: programs that exit, kill their process, block their thread
    or spin are stopped (at agent.timeout_s for the last two, their processes killed), one that never
    calls the model fails too, and an ordinary group beside them (another loop on the same gateway, with
    a timeout this loaded machine cannot reach) is served and judged meanwhile."""
    marks = {"EXIT": "raised SystemExit: 3", "KILL": "exit code 9", "BLOCK": "did not finish within agent.timeout_s=2",
             "SPIN": "did not finish within agent.timeout_s=2", "SILENT": "returned without calling the model"}
    hostile = [group_asking(f"{mark}: what is 2 * 3?", 2, index=i) for i, mark in enumerate(marks)]
    ordinary = group_asking(ROWS[0]["question"], 2, index=9, answer="3752")

    async def go():
        engine = HFEngine.from_model(model, TOK)
        loops = [make_loop(gateway(AGENTS + "hostile_on_marked_prompts", timeout_s=2.0), engine),
                 make_loop(gateway("examples.gateway_calculator_agent:run"), engine)]
        try:
            return loops, await asyncio.gather(*(loops[0].generate_group(g, True) for g in hostile),
                                               loops[1].generate_group(ordinary, True))
        finally:
            for lp in loops:
                await lp.close()
            await engine.close()

    loops, done = asyncio.run(go())
    for g, says in zip(done, marks.values()):
        for s in g:
            assert s.status == Status.COMPLETED and says in s.extra["infra_failure"], s.extra
    assert all("infra_failure" not in s.extra and s.reward is not None for s in done[-1])
    assert all(lp.hub is None and not lp._sessions for lp in loops)  # every process gone with the loops


@pytest.mark.parametrize("entrypoint, says", [("exits", "raised SystemExit: 3"), ("hard_exit", "exit code 7"),
                                              ("never_calls", "returned without calling the model")])
def test_a_program_that_ends_its_process_or_never_calls_fails_its_sample(model, entrypoint, says):
    _, (g,) = run_groups(model, gateway(AGENTS + entrypoint), [group_asking("what is 2 * 3?", 2)])
    assert all(s.status == Status.COMPLETED and says in s.extra["infra_failure"] for s in g)


def test_a_blocking_program_is_killed_at_its_timeout_after_its_call_is_recorded(model):
    # 10 s: the timeout must land after the program's one 4-token call, which a loaded machine can slow.
    _, (g,) = run_groups(model, gateway(AGENTS + "blocks", timeout_s=10.0), [group_asking("what is 2 * 3?", 2)])
    for s in g:
        assert "did not finish within agent.timeout_s=10" in s.extra["infra_failure"] and 0 < len(s.response_ids) <= 4


@pytest.mark.parametrize("reward, ok", [("nan", False), ("1e39", False), ("-inf", False), ("0.5", True)])
def test_an_agent_reward_passes_the_judged_rewards_range_check(model, reward, ok):
    """A NaN or float32-overflowing reward returned by the program fails its group, named (it was trained
    as eval accuracy 1.0, or stopped the run); an ordinary one is the reward."""
    _, (g,) = run_groups(model, gateway(AGENTS + "rewards"), [group_asking(f"REWARD {reward} please", 2)])
    if ok:
        assert g.status == Status.COMPLETED and [s.reward["score"] for s in g] == [0.5, 0.5]
    else:
        assert g.status == Status.FAILED
        assert "returned an unusable reward" in g.drop_reason and g.samples[0].uid in g.drop_reason
        assert math.isnan(float(reward)) or float(reward) != 0.5


def test_a_run_of_hostile_programs_reaches_total_steps_and_exits_0(tmp_path):
    """train.py with a program that, by prompt, exits, kills its process, blocks, spins or never calls the
    model: every such group is dropped with its members' reasons and tracebacks (rollouts/dropped.jsonl),
    the log says one line per failed sample and no traceback, metrics are written for every step, exit 0."""
    rows = [{"question": f"{mark}: what is 2 * 3?", "answer": "#### 6"}
            for mark in ("EXIT", "KILL", "BLOCK", "SPIN", "SILENT")] + ROWS[:2]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    proc = run_cli(["experiment=gateway_tools", f"agent.entrypoint={AGENTS}hostile_on_marked_prompts",
                    "agent.timeout_s=3", f"task.path={data}", f"task.eval_path={ASSET / 'data' / 'tools_eval.jsonl'}",
                    "eval.num_prompts=2", "total_steps=2", "batch_size=2", "sampler.prompt_repeat_k=2",
                    "eval_every=0", "logger.mode=disabled", f"hydra.run.dir={run}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "never retrieved" not in proc.stderr
    metrics = [json.loads(line) for line in RunDir(run).metrics.read_text().splitlines()]
    assert [m["step"] for m in metrics if "train/loss" in m] == [1, 2]
    dropped = [json.loads(line) for line in RunDir(run).dropped.read_text().splitlines()]
    hostile = [r for r in dropped if r["prompt_index"] < 5]
    assert hostile and all(r["infra_failure"] and r["reason"].startswith("infrastructure failures") for r in hostile)
    assert any("SystemExit" in r.get("agent_traceback", "") for r in hostile if "EXIT" in r["prompt"])
    log_lines = (run / "train.log").read_text().splitlines()
    logged = [ln.split(" sample ", 1)[1].split()[0] for ln in log_lines if "failed (not the policy's fault)" in ln]
    failed = [r["uid"] for r in dropped if r.get("infra_failure")]  # (an ordinary program may time out too, loaded)
    assert sorted(logged) == sorted(failed)  # one line each
    assert sum(m.get("rollout/members_failed_infra", 0) for m in metrics) == len(failed)
