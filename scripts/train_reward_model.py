"""Train a small reward model for the default arithmetic task; save it as an HF sequence-classification folder.

    python scripts/train_reward_model.py                      # -> outputs/reward_models/tiny-arith-rm
    python train.py judger=reward_model judger.path=outputs/reward_models/tiny-arith-rm

Pairs: for each training prompt of `task=arithmetic` ("042+917="), the right answer ("959")
against a wrong one drawn from the mistakes a weak adder makes: off by 1-9, by 10 or 100 (a
dropped or extra carry), one digit changed, two digits swapped, a digit dropped or repeated,
an unrelated number of the same width. The text scored is exactly what the judger scores:
prompt_text + response_text (rlharness/judger/reward_model.py).

Model: the policy's own checkpoint (`--base`, default assets/tiny-arith) with a fresh one-label
`score` head (LlamaForSequenceClassification), trained with the Bradley-Terry loss
-log sigmoid(r_right - r_wrong), AdamW. Measured on the EVAL split's prompts (never trained on):
pairwise accuracy (r_right > r_wrong) per kind of mistake. The folder's `rm_report.json` holds
them and the mean/std of its logits on eval texts (right and wrong alike), from which
`judger.reward_shift=-mean judger.reward_scale=1/std` normalises the reward.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MISTAKES = ("off_by_small", "carry", "digit_changed", "digits_swapped", "digit_dropped_or_repeated", "unrelated")


def wrong_answer(answer: str, kind: str, rng: random.Random) -> str:
    """A wrong answer of `kind` for the right `answer` (a non-negative integer's digits)."""
    n = int(answer)
    for _ in range(100):
        if kind == "off_by_small":
            out = str(max(0, n + rng.choice([-1, 1]) * rng.randint(1, 9)))
        elif kind == "carry":
            out = str(max(0, n + rng.choice([-1, 1]) * rng.choice([10, 100])))
        elif kind == "digit_changed":
            i = rng.randrange(len(answer))
            out = answer[:i] + rng.choice("0123456789") + answer[i + 1:]
        elif kind == "digits_swapped" and len(answer) > 1:
            i = rng.randrange(len(answer) - 1)
            out = answer[:i] + answer[i + 1] + answer[i] + answer[i + 2:]
        elif kind == "digit_dropped_or_repeated":
            i = rng.randrange(len(answer))
            out = answer[:i] + answer[i + 1:] if rng.random() < 0.5 and len(answer) > 1 else answer[:i + 1] + answer[i:]
        else:
            out = str(rng.randint(10 ** (len(answer) - 1) if len(answer) > 1 else 0, 10 ** len(answer) - 1))
        if out and out != answer:
            return out
    return str(n + 1)


def pairs(rows, per_prompt: int, rng: random.Random) -> list[tuple[str, str, str, str]]:
    """(prompt, right, wrong, kind) for each row, `per_prompt` wrong answers each."""
    out = []
    for row in rows:
        answer = row.label["answer"]
        for _ in range(per_prompt):
            kind = rng.choice(MISTAKES)
            out.append((row.prompt_text, answer, wrong_answer(answer, kind, rng), kind))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="assets/tiny-arith", help="policy checkpoint the backbone starts from")
    ap.add_argument("--out", default="outputs/reward_models/tiny-arith-rm")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-pairs", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--train-prompts", type=int, default=20000)
    ap.add_argument("--eval-pairs-per-prompt", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForSequenceClassification

    from rlharness.model.load import text_codec
    from rlharness.config.schema import ArithmeticTaskConf, ModelConf
    from rlharness.data.arithmetic import make_arithmetic_task
    from rlharness.model.load import load_tokenizer, resolve_model_path

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    data = make_arithmetic_task(ArithmeticTaskConf())
    base = resolve_model_path(args.base)
    tokenizer = load_tokenizer(ModelConf(path=str(base)))
    encode = text_codec(tokenizer)[0]
    model = AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    def logits(texts: list[str]) -> torch.Tensor:
        tokenizer.padding_side = "right"
        enc = tokenizer.pad({"input_ids": [encode(t) for t in texts]}, return_tensors="pt")
        return model(**enc).logits[:, 0]

    train_rows = data.train[: args.train_prompts]
    eval_pairs = pairs(data.eval, args.eval_pairs_per_prompt, random.Random(args.seed + 1))

    def evaluate() -> dict:
        model.eval()
        with torch.no_grad():
            right = logits([p + r for p, r, _, _ in eval_pairs])
            wrong = logits([p + w for p, _, w, _ in eval_pairs])
        model.train()
        won = (right > wrong).tolist()
        per_kind = {k: statistics.fmean(w for w, (_, _, _, kk) in zip(won, eval_pairs) if kk == k) for k in MISTAKES}
        scores = torch.cat([right, wrong])
        return {"pairwise_accuracy": statistics.fmean(won), "per_mistake": per_kind,
                "logit_mean": float(scores.mean()), "logit_std": float(scores.std()),
                "right_logit_mean": float(right.mean()), "wrong_logit_mean": float(wrong.mean())}

    t0 = time.time()
    before = evaluate()
    print(f"step 0: held-out pairwise accuracy {before['pairwise_accuracy']:.3f}", flush=True)
    curve = [(0, before["pairwise_accuracy"])]
    for step in range(1, args.steps + 1):
        batch = pairs(rng.sample(train_rows, args.batch_pairs), 1, rng)
        r = logits([p + a for p, a, _, _ in batch] + [p + w for p, _, w, _ in batch])
        loss = -F.logsigmoid(r[: len(batch)] - r[len(batch):]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 250 == 0 or step == args.steps:
            acc = evaluate()["pairwise_accuracy"]
            curve.append((step, acc))
            print(f"step {step}: loss {loss.item():.4f}, held-out pairwise accuracy {acc:.3f}", flush=True)
    after = evaluate()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    report = {"base": str(args.base), "steps": args.steps, "batch_pairs": args.batch_pairs, "lr": args.lr,
              "seed": args.seed, "eval_pairs": len(eval_pairs), "train_s": round(time.time() - t0, 1),
              "before": before, "after": after, "curve": curve,
              "normalise": {"judger.reward_shift": -after["logit_mean"], "judger.reward_scale": 1 / after["logit_std"]}}
    (out / "rm_report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("after", "normalise", "train_s")}, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
