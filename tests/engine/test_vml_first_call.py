"""Issue 21's cause, closed: no MKL VML function's first call in a process runs on two threads at once.

oneMKL 2024.2 (inside torch 2.13) picks each VML function's kernel on its first call; when that call
runs on two intra-op threads at once, one of them can compute its chunk with the low-accuracy AVX2
"EP" kernel (pytorch/pytorch#188792). A resumed run's engine computed the rotary cos of its first
prefill that way for the last 16 requests: the defect's loss, to the last digit (docs/notes/resume_race.md).

scripts/vml_spy.c holds each function's first call, so that the other thread's call of the same
function, if the process makes one, lands inside it: the race window is made wide on purpose, on
any CPU (where MKL runs one kernel for every accuracy, as on AMD CPUs, the window is the same but
the values come out right). Before rlharness.core.vml_warmup these tests failed: the engine's first
prefill called vmsCos/vmsSin on two threads, a run's first optimizer step vmsSqrt.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import HANG_S, ROOT, load_script

vml_spy = load_script(ROOT / "scripts" / "vml_spy.py", "vml_spy")

pytestmark = [
    pytest.mark.skipif(platform.system() != "Linux" or shutil.which("gcc") is None,
                       reason="the spy is a preloaded shared library built with gcc (Linux)"),
    pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch has no MKL (no VML to race)"),
]

# Every VML function the spy watches (scripts/vml_spy.c), float and double.
SPIED = 2 * 16

# A fresh process as a run's processes start: two intra-op threads, a component built, then the
# first forward pass the run would make with it.
COMPONENT = """
import sys, torch
torch.set_num_threads(2)
from rlharness.config.schema import AlgoConf, HFEngineConf, ModelConf, TorchBackendConf
if sys.argv[1] == "engine":
    from rlharness.engine.hf import HFEngine
    model = HFEngine(HFEngineConf(), ModelConf(), seed=0).model
else:
    from rlharness.backend.learner import Learner
    model = Learner(TorchBackendConf(), ModelConf(), AlgoConf(), total_steps=1, seed=0).model
print("built", flush=True)
# A resumed step's first admission as the engine makes it: 32 prompts of 8 tokens in one prefill with
# a position id per row (its rotary cos/sin: 32 x 8 x 32 values, split in two chunks of 16 rows).
with torch.inference_mode():
    model(input_ids=torch.randint(3, 24, (32, 8)), attention_mask=torch.ones(32, 8, dtype=torch.long),
          position_ids=torch.arange(8).expand(32, 8))
"""


@pytest.fixture(scope="module")
def spy(tmp_path_factory) -> Path:
    return vml_spy.build(tmp_path_factory.mktemp("vml-spy"))


@pytest.mark.timeout(HANG_S + 60)
@pytest.mark.parametrize("component", ["engine", "trainer"])
def test_a_built_component_has_every_vml_function_picked_before_its_first_forward(spy, tmp_path, component):
    report = tmp_path / "report.txt"
    proc = subprocess.run([sys.executable, "-c", COMPONENT, component], cwd=ROOT, capture_output=True, text=True,
                          env=vml_spy.spy_env(spy, report, hold_ms=100), timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (seen,) = vml_spy.read_report(report).values()
    assert seen["concurrent"] == {}, f"first calls on two threads at once: {seen['concurrent']}"
    # Picked by a one-element call each (the warm-up), not by a forward pass's chunk.
    assert len(seen["first"]) == SPIED and set(seen["first"].values()) == {1}, seen["first"]


@pytest.mark.slow
@pytest.mark.timeout(2 * HANG_S + 60)
def test_a_run_and_its_resumed_life_make_no_two_thread_first_call(spy, tmp_path):
    """The issue's own sequence: a run, then a resumed life whose first step is its first forward pass
    after the engine's load (each process with its own report)."""
    run_dir = tmp_path / "run"
    args = ["save_every=1", "eval_every=0", "logger.mode=disabled", "batch_size=8", "sampler.prompt_repeat_k=4",
            f"hydra.run.dir={run_dir}"]
    for life, steps in (("first", 1), ("resumed", 2)):
        report = tmp_path / f"{life}.txt"
        env = vml_spy.spy_env(spy, report, hold_ms=100, base={**os.environ, "WANDB_MODE": "disabled"})
        proc = subprocess.run([sys.executable, str(ROOT / "train.py"), f"total_steps={steps}", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=HANG_S)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if life == "resumed":
            assert "holds a run: continuing it" in proc.stderr
        assert vml_spy.concurrent_first_calls(report) == {}, f"{life} life"
        assert vml_spy.read_report(report), f"{life} life: the spy saw no VML call (not preloaded?)"
