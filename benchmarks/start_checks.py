"""What the checks a start makes before any work cost, and what judging user code in a process costs.

    python benchmarks/start_checks.py [--repeats 5] [--out benchmarks/results/start_checks.json]

- `check_weights` (rlharness/model/weight_files.py) on the embedded tiny model and on SmolLM2-135M
  (if fetched): the first call in a process (imports transformers' model classes, which the run's
  model load would import next anyway) and the next ones (headers and a meta-device model).
- `probe_dataset` (rlharness/data/reasoning_gym.py): a few reasoning-gym items in a process of their
  own, from a fresh forkserver (what a reasoning-gym start pays once; the judging processes reuse it).
- an llm judge's template rendered and its score read in a judging process (`JudgePool.call`) against
  the same in this process: the price of making them killable, per judged member.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "assets" / "smollm2-135m-instruct"


def timed(fn, repeats: int) -> tuple[float, float]:
    """(first call s, best of the next `repeats` s)."""
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times[0], min(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--members", type=int, default=200)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "start_checks.json")
    args = ap.parse_args()

    from rlharness.config.schema import LLMJudgerConf
    from rlharness.data.reasoning_gym import probe_dataset
    from rlharness.judger.llm import JudgeTemplate
    from rlharness.judger.pool import JudgePool
    from rlharness.model.weight_files import check_weights

    result: dict = {"load_avg": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d")}
    for name, folder in (("tiny-arith", ROOT / "assets" / "tiny-arith"), ("smollm2-135m", SMOLLM2)):
        if folder.is_dir():
            first, then = timed(lambda: check_weights(folder), args.repeats)
            result[f"check_weights {name}"] = {"first_s": round(first, 3), "then_s": round(then, 4)}
    t0 = time.perf_counter()
    probe_dataset("basic_arithmetic", {"max_terms": 2})
    result["probe_dataset basic_arithmetic (fresh forkserver) s"] = round(time.perf_counter() - t0, 2)

    template = JudgeTemplate(LLMJudgerConf(path="unused"))
    row = ("What is 1+1?", "2", {"answer": "2"})
    pool = JudgePool(template, 1, 1024)
    pool.start()

    async def in_process_pool() -> float:
        t = time.perf_counter()
        for _ in range(args.members):
            await pool.call("render", row, 10.0)
            await pool.call("parse", ("Score: 7",), 10.0)
        return (time.perf_counter() - t) / args.members

    try:
        per_member = asyncio.run(in_process_pool())
    finally:
        pool.close()
    t = time.perf_counter()
    for _ in range(args.members):
        template.render(*row)
        template.parse("Score: 7")
    here = (time.perf_counter() - t) / args.members
    result["llm judge render+parse ms per member"] = {"judging process": round(1e3 * per_member, 3),
                                                      "this process": round(1e3 * here, 4)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":  # the judging processes start from a forkserver, which re-imports this file
    main()
