"""Learning curve and before/after answers of a reasoning-gym run (`python train.py experiment=smollm2_arith`),
from its run directory: eval accuracy by step with the elapsed time (steps and evals), the mean step
time, and the greedy answers of the starting model and of the run's last checkpoint to the first eval
prompts, each scored by the run's judger.

    python benchmarks/reasoning_gym_curve.py outputs/2026-11-24/10-30-00 --samples 8

The answers are generated here with `model.generate` (greedy, the run's eval budget) from the same
eval rows the run built (the config is composed again from the run's `.hydra/overrides.yaml`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chat_tools_curve import curve  # noqa: E402 - the same elapsed-time accounting

from rlharness.core.checkpoint import latest_checkpoint  # noqa: E402
from rlharness.logging_utils.metrics import read_metrics  # noqa: E402


def run_conf(run_dir: Path):
    import yaml
    from omegaconf import OmegaConf, open_dict

    from rlharness.launch.preflight import compose_checked

    overrides = [o for o in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
                 if not o.startswith("hydra.")]
    cfg = compose_checked(overrides)
    with open_dict(cfg):
        del cfg["hydra"]
    cfg.run_dir = str(run_dir)
    return OmegaConf.to_object(cfg)


def greedy_answers(model_dir: str, prompts: list[str], max_tokens: int) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # Chat templates already start with BOS: no second one (as the run's encoder).
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    return [tok.decode(o[enc.input_ids.shape[1]:], skip_special_tokens=True) for o in out]


def samples(run_dir: Path, n: int) -> list[dict]:
    from rlharness.data import build_task
    from rlharness.judger import build_judger
    from rlharness.model.load import load_tokenizer, resolve_model_path

    conf = run_conf(run_dir)
    entry = next(iter(conf.task_entries().values()))
    rows = build_task(entry.task, load_tokenizer(conf.model)).eval[:n]
    judger = build_judger(conf.judger_for(entry))
    budget = conf.eval.max_tokens or conf.sampling_for(entry).max_tokens
    step, ckpt = latest_checkpoint(run_dir)
    prompts = [r.prompt_text for r in rows]
    before = greedy_answers(str(resolve_model_path(conf.model.path)), prompts, budget)
    after = greedy_answers(str(ckpt / "backend"), prompts, budget)
    return [{"question": r.label["entry"]["question"], "answer": r.label["answer"], "before": b,
             "before_score": judger.score(b, r.label)["score"], "after": a,
             "after_score": judger.score(a, r.label)["score"], "step": step}
            for r, b, a in zip(rows, before, after)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--samples", type=int, default=8, help="eval prompts answered before and after")
    args = parser.parse_args()
    rows = read_metrics(args.run_dir / "metrics.jsonl")
    print("| step | elapsed (s) | eval accuracy (greedy) | train reward (sampled) |")
    print("|---:|---:|---:|---:|")
    for c in curve(rows):
        reward = "" if c["reward"] is None else f"{c['reward']:.3f}"
        print(f"| {c['step']} | {c['elapsed_s']:.0f} | {c['accuracy']:.3f} | {reward} |")
    steps = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    evals = [r["perf/eval_s"] for r in rows if "perf/eval_s" in r]
    if steps:
        print(f"\n{len(steps)} steps, mean step {sum(steps) / len(steps):.1f} s; {len(evals)} evals, "
              f"mean {sum(evals) / max(len(evals), 1):.1f} s")
    if args.samples:
        found = samples(args.run_dir, args.samples)
        print(f"\n| question | answer | step 0 (greedy) | step {found[0]['step']} (greedy) |")
        print("|---|---|---|---|")
        for s in found:
            cell = lambda text, score: f"`{text.strip()!r}` ({score:g})"  # noqa: E731
            print(f"| {s['question']} | {s['answer']} | {cell(s['before'], s['before_score'])} | "
                  f"{cell(s['after'], s['after_score'])} |")


if __name__ == "__main__":
    main()
