"""The on-policy guard: a step whose engine log-probs are not the trainer's is named, with its groups."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlharness.algo.losses import token_logprobs
from rlharness.trainer.batch import build_train_batch
from rlharness.trainer.onpolicy_guard import all_tokens_on_policy, onpolicy_gap_warning, weights_verdict
from tests.backend.test_torch_backend import backend, make_groups

pytestmark = pytest.mark.timeout(300)


def test_an_onpolicy_step_with_perturbed_groups_is_named_with_its_worst_token(tiny_model_dir):
    b = backend(tiny_model_dir)
    groups = make_groups(0, num_groups=4, k=2)
    # The rollout log-probs are the trainer's own (an exact engine), except groups 1 and 2 (+1e-3 and -3e-3 per
    # token: an engine that computed them on other weights), as the resume defect did.
    with torch.no_grad():
        for g, group in enumerate(groups):
            for s in group:
                ids = torch.tensor([s.prompt_ids + s.response_ids])
                lp = token_logprobs(b.model(input_ids=ids).logits, ids, 1.0)[0, len(s.prompt_ids):]
                s.response_logprobs = (lp + {1: 1e-3, 2: -3e-3}.get(g, 0.0)).tolist()
    batch, _ = build_train_batch(groups, b.algo, 0, train_step=1, max_response_len=8, temperature=1.0)
    metrics = asyncio.run(b.train_step(batch))
    assert metrics["train/logprob_diff_rollout_max"] == pytest.approx(3e-3, rel=1e-3)
    gaps = b.last_row_gaps
    assert [round(x, 5) for x in gaps] == [0.0, 0.0, 0.001, 0.001, 0.003, 0.003, 0.0, 0.0]
    assert all_tokens_on_policy(batch.model_steps, batch.response_mask, step=1)
    warning = onpolicy_gap_warning(1, groups, gaps, metrics["train/logprob_diff_rollout"], threshold=1e-5)
    assert warning.startswith("step 1: every sample is on-policy")
    assert "2 of 4 groups" in warning and "prompt 2 " in warning and "prompt 1 " in warning
    assert "prompt 0 " not in warning and "prompt 3 " not in warning
    assert warning.index("prompt 2 ") < warning.index("prompt 1 ")  # worst first


def test_the_guard_stays_quiet_below_its_threshold_and_off_policy():
    groups = make_groups(0, num_groups=2, k=2)
    assert onpolicy_gap_warning(3, groups, [6e-7] * 4, 6e-7, threshold=1e-5) is None  # rounding: the worst seen
    assert onpolicy_gap_warning(3, groups, [1e-3] * 4, 1e-3, threshold=0) is None  # switched off
    assert "does not report" in onpolicy_gap_warning(3, groups, None, 1e-3, threshold=1e-5)
    # bf16 kernels round engine and trainer apart by 1e-2..4e-2 on ordinary steps: no false alarm there.
    assert onpolicy_gap_warning(3, groups, [3e-2] * 4, 3e-2, threshold=1e-5, dtype="bfloat16") is None
    assert onpolicy_gap_warning(3, groups, [3e-2] * 4, 3e-2, threshold=1e-5, dtype="float32") is not None
    steps = torch.tensor([[2, 2, -1], [2, 1, -1]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert not all_tokens_on_policy(steps, mask, step=3)  # a token from version 1 at step 3: stale
    assert all_tokens_on_policy(steps[:1], mask[:1], step=3)


def test_the_verdict_tells_other_weights_from_another_computation(tiny_model_dir):
    """Checksums are exact: an engine one ulp off in one tensor is named; an equal one is cleared."""
    from rlharness.config.schema import HFEngineConf, ModelConf
    from rlharness.engine.hf import HFEngine

    b = backend(tiny_model_dir)
    engine = HFEngine(HFEngineConf(device="cpu"), ModelConf(path=tiny_model_dir))
    try:
        asyncio.run(engine.load_weights(b.get_weights_blocking(), 1))
        trained = b.weight_checksums()
        assert len(trained) == 20  # the tied head once
        assert "bit for bit" in weights_verdict(trained, engine.weight_checksums())
        norm = engine.model.model.norm.weight
        with torch.no_grad():
            norm[3] = torch.nextafter(norm[3], torch.tensor(10.0))
        verdict = weights_verdict(trained, engine.weight_checksums())
        assert "differ from the trained ones in 1 of 20 tensors (blocks of 1024 elements): " \
               "model.norm.weight (all of it)" in verdict
        # One page of a matrix apart from a whole matrix: the blocks that differ are named.
        gate = engine.model.model.layers[1].mlp.gate_proj.weight
        blocks = -(-gate.numel() // 1024)
        with torch.no_grad():
            gate.view(-1)[7 * 1024 + 5] += 1.0
            gate.view(-1)[9 * 1024] += 1.0
        verdict = weights_verdict(trained, engine.weight_checksums())
        assert f"model.layers.1.mlp.gate_proj.weight (blocks 7, 9 of {blocks})" in verdict, verdict
        assert "in 2 of 20 tensors" in verdict
    finally:
        asyncio.run(engine.close())
    assert weights_verdict(trained, None) == "" and weights_verdict(None, trained) == ""


def test_a_run_whose_engine_lost_a_weight_says_which(tmp_path, caplog, monkeypatch):
    """A whole sync run in which the engine's final norm goes back to the file's values right after its
    version-1 load (what docs/notes/resume_race.md's perturbed step looked like): step 2's warning names the
    groups and says which tensor the engine held other values of."""
    import logging

    from safetensors.torch import load_file

    from rlharness.engine.hf import HFEngine
    from tests.helpers import ROOT, run_in_process

    file_values = load_file(ROOT / "assets" / "tiny-arith" / "model.safetensors")
    load = HFEngine._load

    def load_then_revert(self, state, version):
        load(self, state, version)
        if version == 1:
            self._params["model.norm.weight"].copy_(file_values["model.norm.weight"])

    monkeypatch.setattr(HFEngine, "_load", load_then_revert)
    caplog.set_level(logging.WARNING)
    run_in_process(tmp_path / "run", ["total_steps=2", "eval_every=0", "save_every=0", "logger.mode=disabled",
                                      "batch_size=8", "sampler.prompt_repeat_k=4"])
    warnings = [r.getMessage() for r in caplog.records if "every sample is on-policy" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("step 2: "), warnings
    assert "differ from the trained ones in 1 of 20 tensors (blocks of 1024 elements): " \
           "model.norm.weight (all of it)" in warnings[0]
    # The step is kept for study offline: its batch, the engine's log-probs and both sides' checksums.
    from rlharness.core.checkpoint import load_state
    from rlharness.core.run_dir import RunDir

    evidence = RunDir(tmp_path / "run").onpolicy_evidence(2)
    assert str(evidence) in warnings[0]
    kept = load_state(evidence)
    assert kept["train_step"] == 2 and kept["input_ids"].shape == kept["rollout_logprobs"].shape
    assert len(kept["row_gaps"]) == kept["input_ids"].shape[0] == 32
    assert [k for k in kept["trained_checksums"]
            if not torch.equal(kept["trained_checksums"][k], kept["engine_checksums"][k])] == ["model.norm.weight"]
