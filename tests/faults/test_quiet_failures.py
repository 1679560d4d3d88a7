"""Failures say what matters and nothing else (issue 22, item 11): refused judge replies leave no
"Task exception was never retrieved" tracebacks; a reply nested 10^5 deep is a counted malformed
reply; a full disk during a checkpoint names the file and says the previous checkpoint is intact."""

from __future__ import annotations

import asyncio
import errno
import gc

import pytest

from rlharness.core.checkpoint import CheckpointWriteError, complete_checkpoints, load_state
from rlharness.config.schema import RemoteJudgerConf
from rlharness.judger.base import gather_fail_fast
from rlharness.judger.remote import RemoteJudgeError, RemoteJudger
from rlharness.core.run_dir import RunDir
from tests.faults.test_judging_faults import judge_server  # noqa: F401 - fixture
from tests.faults.test_refused_input import SIM
from tests.helpers import run_in_process


class Refused(Exception):
    pass


async def _member(ev: asyncio.Event, first: bool) -> None:
    """Every member of a group gets its refused reply in the same turn of the event loop (an order
    of loop turns, not of time: the same on any machine)."""
    await asyncio.sleep(0)
    if first:
        ev.set()
    else:
        await ev.wait()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    raise Refused()


def test_members_refused_together_leave_no_unretrieved_task_exceptions():
    async def main() -> list[str]:
        said: list[str] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: said.append(ctx["message"]))
        for _ in range(10):
            ev = asyncio.Event()
            with pytest.raises(Refused):
                # As RemoteJudger.score_slow: each member under wait_for (a bound no member comes near),
                # the first failure cancels the rest.
                await gather_fail_fast([asyncio.wait_for(_member(ev, i == 0), 3600) for i in range(8)])
        while len(asyncio.all_tasks()) > 1:  # every cancelled member has ended (turns, not a sleep)
            await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
        return said

    assert asyncio.run(main()) == []


def test_a_reply_nested_too_deep_is_a_counted_malformed_reply(judge_server):  # noqa: F811
    base, stats = judge_server("by_label")
    judger = RemoteJudger(RemoteJudgerConf(url=f"{base}/judge", max_retries=0))
    with pytest.raises(RemoteJudgeError, match="nested too deeply"):
        judger.score("1", {"answer": "D1"})
    with pytest.raises(RemoteJudgeError, match="not JSON"):
        judger.score("1", {"answer": "M1"})
    assert judger.stats()["malformed_replies"] == 2
    assert stats()["deep"] == 1


def test_a_full_disk_during_a_checkpoint_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    import rlharness.trainer.trainer as trainer_module

    real_save_state = trainer_module.save_state

    def full_disk_at_step_4(state, path):
        if state["step"] == 4:
            with open(path, "wb") as fh:
                fh.write(b"\0" * 100)  # the disk fills mid-file
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save_state(state, path)

    monkeypatch.setattr(trainer_module, "save_state", full_disk_at_step_4)
    run_dir = tmp_path / "run"
    with pytest.raises(CheckpointWriteError) as info:
        run_in_process(run_dir, [*SIM, "total_steps=4", "save_every=2"])
    message = str(info.value)
    assert "checkpoint of step 4 not saved" in message
    assert "trainer.pt: No space left on device" in message and ".tmp-step_00000004" in message
    kept = RunDir(run_dir).checkpoint(2)
    assert f"the previous checkpoint {kept} is intact" in message
    assert [s for s, _ in complete_checkpoints(run_dir)] == [2]
    assert load_state(kept / "trainer.pt")["step"] == 2
    assert sorted(p.name for p in RunDir(run_dir).checkpoints.iterdir()) == ["step_00000002"]  # space given back


def test_safetensors_full_disk_error_is_named(tmp_path, monkeypatch, tiny_model_dir):
    """safetensors' error on a full disk names no path (its message as it writes it, raised by the
    writer transformers calls): the checkpoint's file is named."""
    from safetensors import SafetensorError

    from rlharness.backend.learner import Learner
    from rlharness.config.schema import AlgoConf, ModelConf, TorchBackendConf

    def full_disk(tensors, filename, metadata=None):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')

    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", full_disk)
    backend = Learner(TorchBackendConf(), ModelConf(path=tiny_model_dir), AlgoConf(name="t"), 4, 0)
    with pytest.raises(CheckpointWriteError, match=f"cannot write {tmp_path / 'b' / 'model.safetensors'}: "
                                                   f"no space left on device"):
        backend.save_blocking(str(tmp_path / "b"))
