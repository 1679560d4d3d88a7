"""Worst case first (`trainer.probe_longest`): step 0 trains one micro-batch of the longest sample before
any data is consumed, leaves the run exactly as it was, and turns an out-of-memory into one line naming
the settings to lower."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from rlharness.logging_utils.metrics import read_metrics
from rlharness.launch.preflight import compose_typed
from rlharness.core.run_dir import RunDir
from rlharness.trainer.memory_estimate import ModelShape
from rlharness.trainer.probe import PROBE_AUTO_MIN_PARAMS, probe_on
from tests.helpers import ROOT, run_in_process

pytestmark = [pytest.mark.timeout(600)]

RUN = ["batch_size=4", "sampler.prompt_repeat_k=4", "total_steps=3", "eval_every=0", "save_every=0",
       "eval.num_prompts=8", "logger.mode=disabled"]


def test_the_probe_trains_nothing_that_stays(tmp_path):
    run_in_process(tmp_path / "probed", [*RUN, "trainer.probe_longest=true"])
    run_in_process(tmp_path / "plain", [*RUN, "trainer.probe_longest=false"])
    probed = read_metrics(RunDir(tmp_path / "probed").metrics)
    plain = read_metrics(RunDir(tmp_path / "plain").metrics)
    # Step 0 says what was probed: one micro-batch of all 16 rows at the longest prompt (8 tokens) + 8.
    assert probed[0]["probe/rows"] == 16 and probed[0]["probe/tokens"] == 16 and probed[0]["perf/probe_s"] > 0
    assert "perf/probe_s" not in plain[0]
    for a, b in zip(probed[1:], plain[1:], strict=True):  # the same samples, losses and gradients
        for key in ("rollout/reward_mean", "train/loss", "train/grad_norm", "train/entropy", "train/lr"):
            assert a[key] == b[key], (a["step"], key)


def test_on_by_default_for_real_models_only():
    _, tiny = compose_typed([])
    assert not probe_on(tiny)  # the embedded model: 0.5M parameters
    smollm2 = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
               "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True}
    assert ModelShape.from_config(smollm2).parameters == pytest.approx(134.5e6, rel=0.01)
    assert ModelShape.from_config(smollm2).parameters >= PROBE_AUTO_MIN_PARAMS
    _, forced = compose_typed(["trainer.probe_longest=true"])
    assert probe_on(forced)


OOM_SCRIPT = textwrap.dedent("""
    import asyncio, json, resource, sys
    import psutil, torch
    from rlharness.backend.torch_backend import TorchBackend
    from rlharness.config.schema import ConfigError
    from rlharness.launch.preflight import compose_typed
    from rlharness.trainer import probe

    torch.set_num_threads(1)
    _, conf = compose_typed(sys.argv[1:])
    backend = TorchBackend(conf.backend, conf.model, conf.algo, conf.total_steps, conf.seed)
    # 512 rows x (4000 + 8) tokens need tens of GB; allow this process 1 GB more than it has.
    limit = psutil.Process().memory_info().vms + 2**30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    probe.probe_shape = lambda conf, data, encode: (512, 4000, 8)
    try:
        asyncio.run(probe.probe_longest(conf, backend, {}, None))
    except ConfigError as exc:
        print(json.dumps({"error": str(exc)}))
""")


def test_out_of_memory_is_one_line_naming_the_settings_to_lower():
    done = subprocess.run([sys.executable, "-c", OOM_SCRIPT, "algo.micro_batch_size=512"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert error.startswith("trainer.probe_longest: one training micro-batch of the longest sample this config "
                            "allows (512 rows x 4008 tokens"), error
    for key in ("algo.micro_batch_size", "agent.sampling.max_tokens", "task.max_prompt_tokens",
                "backend.gradient_checkpointing=true", "trainer.probe_longest=false"):
        assert key in error, error
    assert "\n" not in error
