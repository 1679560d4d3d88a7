"""Build the embedded default model `assets/tiny-arith/`: so `python train.py` needs no download.

A character tokenizer and a 2-layer Llama (hidden 128, 4 heads, FFN 512, tied
embeddings, fp32, eager attention) from `rlharness.model.tiny`, then a short supervised
warm-up on the arithmetic task's TRAIN split (loss on answer tokens + EOS only).
Greedy held-out accuracy jumps steeply between 300 and 400 warm-up steps
(ENVIRONMENT.md), so the script evaluates every `--eval-every` steps after
`--min-steps` and stops at the first greedy exact-match accuracy >= `--target-acc`
on the EVAL split: a start that is clearly above zero and far below the ceiling,
leaving RL room to show progress.

    python scripts/make_tiny_model.py            # writes assets/tiny-arith/
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
from pathlib import Path

import torch

from rlharness.config.schema import ArithmeticTaskConf
from rlharness.data.arithmetic import make_arithmetic_task
from rlharness.data.base import PromptRow
from rlharness.model.tiny import build_char_tokenizer, build_tiny_llama

log = logging.getLogger("make_tiny_model")

IGNORE = -100


def encode_examples(tok, rows: list[PromptRow]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + EOS) per row, tokenized as the rollout engine does (no BOS)."""
    out = []
    for row in rows:
        prompt = tok(row.prompt_text)["input_ids"]
        answer = tok(row.label["answer"])["input_ids"] + [tok.eos_token_id]
        out.append((prompt, answer))
    return out


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded inputs; labels are IGNORE on prompt and padding (loss on the answer only)."""
    length = max(len(p) + len(a) for p, a in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    for i, (p, a) in enumerate(examples):
        seq = p + a
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(p): len(seq)] = torch.tensor(a)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@torch.no_grad()
def greedy_accuracy(model, tok, rows: list[PromptRow], max_new_tokens: int = 6) -> float:
    """Exact match of the greedy answer (text before EOS) against the label."""
    model.eval()
    prompts = [tok(r.prompt_text)["input_ids"] for r in rows]
    width = max(map(len, prompts))
    # Left-pad so every prompt ends at the same column (arithmetic prompts are equal length anyway).
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    correct = 0
    for row, gen in zip(rows, out[:, width:].tolist()):
        if tok.eos_token_id in gen:
            gen = gen[: gen.index(tok.eos_token_id)]
        correct += tok.decode(gen, skip_special_tokens=True).strip() == row.label["answer"]
    model.train()
    return correct / len(rows)


def warm_up(args) -> tuple:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    task = make_arithmetic_task(ArithmeticTaskConf())
    tok = build_char_tokenizer()
    model = build_tiny_llama(len(tok), seed=args.seed, pad_token_id=tok.pad_token_id,
                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model.train()
    train = encode_examples(tok, task.train)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    acc = 0.0
    for step in range(1, args.max_steps + 1):
        batch = collate(rng.sample(train, args.batch_size), tok.pad_token_id)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0:
            log.info("step %d loss %.4f", step, loss.item())
        if step >= args.min_steps and step % args.eval_every == 0:
            acc = greedy_accuracy(model, tok, task.eval)
            log.info("step %d greedy eval accuracy %.3f", step, acc)
            if acc >= args.target_acc:
                return model, tok, step, acc, loss.item()
    raise RuntimeError(
        f"warm-up never reached --target-acc={args.target_acc} within --max-steps={args.max_steps} "
        f"(last accuracy {acc:.3f})"
    )


README = """# tiny-arith: the embedded default model

Made by `python scripts/make_tiny_model.py` (seeded, deterministic on CPU with
{threads} torch thread(s)).

- Tokenizer: one token per character (`rlharness.model.tiny.build_char_tokenizer`), {vocab} tokens,
  no BOS added; responses end with `<eos>`.
- Model: Llama architecture, 2 layers, hidden 128, 4 heads, FFN 512, tied embeddings,
  fp32, eager attention ({params:,} parameters).
- Warm-up: supervised on the TRAIN split of `task=arithmetic` (default config: 3-digit
  addition, zero-padded, `042+917=` -> `959<eos>`), loss on answer tokens only,
  AdamW lr {lr:g}, batch {batch}, seed {seed}; stopped at the first evaluation (every
  {eval_every} steps from step {min_steps}) with greedy accuracy >= {target:.0%}.
- Stopped after **{steps} steps**, last training loss {loss:.4f}.
- Starting accuracy: **{acc:.1%}** greedy exact match on the {num_eval} EVAL-split problems.

It is deliberately weak: RL from here has room to show progress (ENVIRONMENT.md's
calibration: GRPO raised a similar checkpoint from 22% to 43-47% in two minutes on CPU).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "assets" / "tiny-arith"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--min-steps", type=int, default=250)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--target-acc", type=float, default=0.15)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    model, tok, steps, acc, loss = warm_up(args)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    num_eval = len(make_arithmetic_task(ArithmeticTaskConf()).eval)
    (out / "README.md").write_text(README.format(
        threads=args.threads, vocab=len(tok), params=sum(p.numel() for p in model.parameters()),
        lr=args.lr, batch=args.batch_size, seed=args.seed, eval_every=args.eval_every,
        min_steps=args.min_steps, target=args.target_acc, steps=steps, loss=loss, acc=acc,
        num_eval=num_eval))
    (out / "warmup.json").write_text(json.dumps(
        {"steps": steps, "greedy_eval_accuracy": acc, "train_loss": loss,
         **{k: v for k, v in vars(args).items() if k != "out"}}, indent=2) + "\n")
    log.info("wrote %s (%d steps, greedy eval accuracy %.3f)", out, steps, acc)


if __name__ == "__main__":
    main()
