"""Rule judgers score slow members in judging processes that are killed at their timeout.

A tower of exponents makes math-verify compute a 370-million-digit integer while holding the
interpreter lock (many minutes, longer the slower the machine: it never ends within a test); here
it must cost one timeout, leave the event loop free, and never outlive Ctrl-C. What must succeed
gets a bound only a hang reaches (tests/helpers.py HANG_S).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlharness.config.schema import ConfigError, MathJudgerConf, RouterJudgerConf
from rlharness.judger.math import MathJudger
from rlharness.judger.router import RouterJudger
from rlharness.core.types import Status, make_group
from tests.helpers import HANG_S, wait_until

TOWER = "\\boxed{9^{9^{9}}}"
ROOT = Path(__file__).resolve().parents[2]


def _group(texts: list[str], answer: str):
    group = make_group(task="t", prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[1],
                       label={"answer": answer}, k=len(texts))
    for s, text in zip(group, texts):
        s.response_text, s.status = text, Status.COMPLETED
    return group


@pytest.mark.timeout(HANG_S + 120)
def test_a_tower_fails_its_member_at_the_timeout_and_the_others_are_judged():
    """The member past its limit failed for a reason that is not the policy's (the group's other members
    judged; algo.failed_member_policy decides what training does), and a fresh process judges on."""
    async def main():
        j = MathJudger(MathJudgerConf(num_workers=1))
        try:
            # The other member is a plain number, scored inline: judged however long a process takes here.
            stuck = await j.judge_group(_group([TOWER, "\\boxed{0.5}"], "0.5"), timeout_s=1.5)
            after = await j.judge_group(_group(["\\boxed{\\frac{1}{2}}", "\\boxed{1/3}"], "0.5"), timeout_s=HANG_S)
            return stuck, after, j.stats()
        finally:
            await j.close()

    stuck, after, stats = asyncio.run(main())
    assert all(s.status == Status.COMPLETED for s in stuck)
    assert stuck.samples[0].extra["infra_failure"] == ("judger math: JudgeLimitExceeded: timeout after 1.5 s "
                                                       "(judging process replaced)")
    assert "infra_failure" not in stuck.samples[1].extra and stuck.samples[1].reward["score"] == 1.0
    assert [s.reward["score"] for s in after] == [1.0, 0.0]  # a fresh process took over
    assert stats["timeouts"] == 1 and stats["groups_failed"] == 0 and stats["processes_replaced"] == 1


@pytest.mark.timeout(HANG_S + 120)
def test_a_tower_label_scores_zero_with_on_timeout_zero_and_the_event_loop_keeps_running():
    """The label is the tower: every member goes to math-verify. While they are stuck, a ticker
    on the same event loop keeps ticking (judging does not hold this interpreter)."""
    tower_label = _group(["\\boxed{3}", "4"], "9^{9^{9}}")

    async def main():
        j = MathJudger(MathJudgerConf(num_workers=2, on_timeout="zero"))
        await j.judge_group(_group(["\\boxed{\\frac{1}{2}}"], "0.5"), timeout_s=HANG_S)  # processes up
        # The loop ticks 20 times while the tower is judged (it never ends by itself): a judger holding
        # this interpreter's lock would allow no tick before the tower ends.
        stuck = asyncio.ensure_future(j.judge_group(tower_label, timeout_s=HANG_S))
        for _ in range(20):
            await asyncio.sleep(0.01)
        still_judging = not stuck.done()
        stuck.cancel()  # kills the judging processes it holds
        # The timeout, on the same judgement: each member scores 0.
        group = await j.judge_group(_group(["\\boxed{3}", "4"], "9^{9^{9}}"), timeout_s=2)
        await j.close()
        return group, still_judging, j.stats()

    group, still_judging, stats = asyncio.run(main())
    assert still_judging
    assert [s.status for s in group] == [Status.COMPLETED] * 2 and [s.reward for s in group] == [{"score": 0.0}] * 2
    assert all("timeout after 2 s" in s.judge_limit for s in group)
    assert stats["scored_zero_on_timeout"] == 2 and stats["groups_failed"] == 0


@pytest.mark.timeout(HANG_S)
def test_router_with_math_uses_judging_processes_too():
    async def main():
        r = RouterJudger(RouterJudgerConf(weights={"math": 1.0, "format": 0.5}, format_pattern=r".*", num_workers=1))
        try:
            return await r.judge_group(_group([TOWER], "1"), timeout_s=1)
        finally:
            await r.close()

    group = asyncio.run(main())
    assert "timeout after 1 s" in group.samples[0].extra["infra_failure"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_of(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                pass
    return out


@pytest.mark.timeout(3 * HANG_S)  # start-up (imports, forkserver) is slow on a loaded 2-core box
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_during_judging_stops_the_process_and_its_judging_processes(tmp_path):
    script = tmp_path / "judge_forever.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio, multiprocessing.forkserver as fs, signal
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with it ignored
        from rlharness.config.schema import MathJudgerConf
        from rlharness.judger.math import MathJudger
        from rlharness.core.types import Status, make_group

        async def main():
            j = MathJudger(MathJudgerConf(num_workers=1))
            g = make_group(task="t", prompt_index=0, epoch=0, prompt_text="p", prompt_ids=[1],
                           label={{"answer": "1"}}, k=1)
            g.samples[0].response_text, g.samples[0].status = {TOWER!r}, Status.COMPLETED
            task = asyncio.ensure_future(j.judge_group(g, timeout_s=600))
            while j.__dict__.get("_pool") is None:
                await asyncio.sleep(0.05)
            print("JUDGING", fs._forkserver._forkserver_pid, flush=True)
            await task

        if __name__ == "__main__":
            asyncio.run(main())
    """))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("JUDGING"), proc.stderr.read()
    forkserver = int(line.split()[1])
    workers = _children_of(forkserver)
    assert workers  # the judging process
    # Busy with the tower: it has used a second of CPU (an idle worker uses none).
    wait_until(lambda: _cpu_s(workers[0]) >= 1.0, "the judging process to work on the tower")
    proc.send_signal(signal.SIGINT)
    # A judger holding this interpreter's lock would leave the signal unhandled until the tower ends
    # (never, within the test): far more than the exit takes, however loaded the machine.
    _, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    # The processes exit asynchronously (they die with their parent).
    wait_until(lambda: not any(_alive(p) for p in [forkserver, *workers]), "the judging processes to exit")


def test_bad_process_settings_are_refused_with_the_key():
    with pytest.raises(ConfigError, match=r"judger.on_timeout='skip' is not allowed: expected one of fail, zero"):
        MathJudgerConf(on_timeout="skip")
    with pytest.raises(ConfigError, match=r"judger.num_workers=0"):
        MathJudgerConf(num_workers=0)


def test_closing_stops_every_judging_process_before_their_channel_goes():
    """pebble unlinks its channel's semaphores when the pool stops: a worker still starting then (one of
    several when the first answered, or a replacement) failed to unpickle them and printed a traceback
    into a refused run's stderr (CI, under load). Checked at that moment: no worker is alive."""
    from rlharness.judger.pool import JudgePool

    pool = JudgePool(MathJudger(), num_workers=3, memory_mb=2048)
    pool.start()
    workers = pool._pool._pool_manager.worker_manager
    started = list(workers.workers.values())
    alive_at_unlink = []
    close_channels = workers.close_channels

    def close_channels_watched():
        alive_at_unlink.extend(p.pid for p in started if p.is_alive())
        close_channels()

    workers.close_channels = close_channels_watched
    pool.close()
    assert len(started) == 3 and alive_at_unlink == []
