"""Two reasoning-gym datasets in one run (`tasks.<name>` mixing) through the real `train.py`, each scored
by its dataset's own score_answer; resumed from its checkpoint it trains like the run left alone (the
data regenerated from the seed); a bad dataset name is refused before anything starts."""

from __future__ import annotations

import pytest

from rlharness.config.schema import ReasoningGymJudgerConf, ReasoningGymTaskConf
from rlharness.data import build_task
from rlharness.judger.reasoning_gym import ReasoningGymJudger
from rlharness.logging_utils.ledger import read_ledger
from rlharness.logging_utils.metrics import read_metrics
from rlharness.core.run_dir import RunDir
from tests.faults.test_refused_input import refused
from tests.helpers import run_cli
from tests.resume.test_kill_resume import assert_trains_like

SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
PRODUCTS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
# tiny-chat: 256 positions; its answers are mostly wrong, the plumbing is what is checked.
MIX = ["model.path=assets/tiny-chat", "batch_size=4", "sampler.prompt_repeat_k=4", "eval.num_prompts=8",
       "eval_every=2", "save_every=1", "logger.mode=disabled", "agent.sampling.max_tokens=12",
       "+task@tasks.sums.task=reasoning_gym", "tasks.sums.task.dataset=chain_sum",
       "+tasks.sums.task.dataset_config={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}",
       "tasks.sums.task.num_eval=8", "tasks.sums.task.num_train=40", "tasks.sums.weight=0.5",
       "+task@tasks.products.task=reasoning_gym", "tasks.products.task.dataset=products",
       "+tasks.products.task.dataset_config={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}",
       "tasks.products.task.num_eval=8", "tasks.products.task.num_train=40", "tasks.products.weight=0.5",
       "tasks.products.task.instruction=Give only the final number.",
       "+judger@tasks.products.judger=reasoning_gym", "tasks.products.judger.extract=response"]


@pytest.mark.timeout(900)
def test_two_reasoning_gym_datasets_train_together_resume_exactly_and_are_judged_by_their_own_scorers(tmp_path):
    reference = tmp_path / "reference"
    run_cli([*MIX, "total_steps=3", f"hydra.run.dir={reference}"], cwd=tmp_path)
    trained, _ = read_ledger(reference)
    assert {r["task"] for r in trained} == {"sums", "products"}
    judgers = {"sums": ReasoningGymJudger(), "products": ReasoningGymJudger(ReasoningGymJudgerConf(extract="response"))}
    tasks = {name: build_task(ReasoningGymTaskConf(dataset=ds, dataset_config=cfg, num_eval=8, num_train=40,
                                                   instruction=instr))
             for name, ds, cfg, instr in (("sums", "chain_sum", SUMS, ""),
                                          ("products", "products", PRODUCTS, "Give only the final number."))}
    for r in trained:
        row = tasks[r["task"]].train[r["prompt_index"]]
        assert r["prompt"].endswith("<|im_start|>assistant\n") and row.label["entry"]["question"] in r["prompt"]
        assert r["reward"] == judgers[r["task"]].score(r["response"], row.label)["score"], r
    last = read_metrics(RunDir(reference).metrics)[-1]
    assert "eval/sums/accuracy" in last and "eval/products/accuracy" in last

    resumed = tmp_path / "resumed"
    run_cli([*MIX, "total_steps=2", f"hydra.run.dir={resumed}"], cwd=tmp_path)
    run_cli([f"resume={resumed}", "total_steps=3"], cwd=tmp_path)
    assert_trains_like(resumed, reference, total_steps=3)


def test_an_unknown_dataset_or_config_key_is_refused_in_one_line_naming_the_key_before_the_run_starts(tmp_path):
    line = refused(["task=reasoning_gym", "task.dataset=chainsum", "model.path=assets/tiny-chat"], tmp_path,
                   ["task.dataset='chainsum'", "valid: ", "chain_sum"])
    assert "basic_arithmetic" in line
    refused(["task=reasoning_gym", "task.dataset=chain_sum", "+task.dataset_config.max_term=2"], tmp_path,
            ["unknown key(s) max_term", "valid: min_terms, max_terms"])
    refused(["+task@tasks.sums.task=reasoning_gym", "tasks.sums.task.dataset=chain_sum",
             "+tasks.sums.task.dataset_config.max_term=2"], tmp_path,
            ["tasks.sums.task.dataset_config has unknown key(s) max_term"])
