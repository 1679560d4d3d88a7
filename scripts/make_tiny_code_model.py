"""Build the embedded code-tool model `assets/tiny-code/`: tiny-chat's recipe, warmed up to run Python.

The tokenizer, architecture, chat template and warm-up are those of `make_tiny_chat_model.py`
(byte-level BPE with Qwen2's pre-tokenizer, ChatML with a BOS, Qwen2, token-in/token-out targets
whose tool output is masked); only the task differs. Problems (GSM8K layout, `#### N` answers)
that need a computation too long for a model this size to do in its head, of four kinds:

- `What is 347 * 829?` (two 3-digit numbers)                 `print(347 * 829)`
- `What is the sum of the squares of the integers from 12 to 57?`
                                                            `print(sum(i * i for i in range(12, 57 + 1)))`
- `How many integers from 123 to 987 are divisible by 7?`    `print(sum(1 for i in range(123, 987 + 1) if i % 7 == 0))`
- `What is 7 to the power of 23, modulo 1000?`               `print(pow(7, 23, 1000))`

A `--tool-frac` of the warm-up targets run the program through the python tool
(`<tool>print(347 * 829)</tool>` -> `<output>287663</output>` -> `\\n#### 287663`), the rest answer
directly (`#### 287663`, which the model cannot compute: mostly wrong). The model starts out
calling the tool on few problems, so RL has something to discover. The starting figures are
measured with rlharness's own multi-turn loop, the python tool running each program in the
sandbox (rlharness/sandbox), and its evaluator.

    python scripts/make_tiny_code_model.py                # writes assets/tiny-code/
"""

from __future__ import annotations

import logging
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_chat_model as chat  # noqa: E402  (the shared recipe)

log = logging.getLogger("make_tiny_code_model")

PRODUCT = ["What is {a} * {b}?", "Compute {a} times {b}.", "Multiply {a} by {b}.",
           "What is the product of {a} and {b}?"]


def code_problem(rng: random.Random) -> dict:
    """A question, the program that answers it, and the answer."""
    kind = rng.choice(["product", "squares", "multiples", "power"])
    if kind == "product":
        a, b = rng.randint(101, 999), rng.randint(101, 999)
        return {"question": rng.choice(PRODUCT).format(a=a, b=b), "code": f"print({a} * {b})", "value": a * b}
    if kind == "squares":
        a = rng.randint(2, 40)
        b = a + rng.randint(10, 60)
        return {"question": f"What is the sum of the squares of the integers from {a} to {b}?",
                "code": f"print(sum(i * i for i in range({a}, {b} + 1)))",
                "value": sum(i * i for i in range(a, b + 1))}
    if kind == "multiples":
        a, b, d = rng.randint(100, 499), rng.randint(500, 999), rng.randint(3, 19)
        return {"question": f"How many integers from {a} to {b} are divisible by {d}?",
                "code": f"print(sum(1 for i in range({a}, {b} + 1) if i % {d} == 0))",
                "value": sum(1 for i in range(a, b + 1) if i % d == 0)}
    base, exp, mod = rng.randint(2, 19), rng.randint(10, 60), rng.choice([100, 1000, 997])
    return {"question": f"What is {base} to the power of {exp}, modulo {mod}?",
            "code": f"print(pow({base}, {exp}, {mod}))", "value": pow(base, exp, mod)}


def with_answer(row: dict) -> dict:
    return {**row, "answer": f"#### {row['value']}"}


def response_segments(row: dict, use_tool: bool) -> list[tuple[str, bool]]:
    """(text, trained) segments of the target response; the tool output is not trained."""
    if use_tool:
        return [(f"{chat.TOOL_START}{row['code']}{chat.TOOL_END}", True),
                (f"{chat.OUT_START}{row['value']}{chat.OUT_END}", False), (f"\n#### {row['value']}", True)]
    return [(f"#### {row['value']}", True)]


def corpus(rows: list[dict]) -> list[str]:
    texts = []
    for row in rows:
        texts.append(f"{chat.BOS}{chat.IM_START}user\n{row['question']}{chat.EOS}\n{chat.IM_START}assistant\n")
        texts += [text for use_tool in (False, True) for text, _ in response_segments(row, use_tool)]
    return texts


def measure(model, tok, eval_rows: list[dict], num_eval: int) -> dict[str, float]:
    from rlharness.config.schema import MultiTurnToolAgentConf, SamplingConf

    agent = MultiTurnToolAgentConf(sampling=SamplingConf(temperature=0.0, max_tokens=80), max_turns=2,
                                   tools=["python"])
    return chat.measure(model, tok, {"code": eval_rows}, num_eval, agents={"code": agent})


README = """# tiny-code: the embedded chat model warmed up to run Python through a tool

Made by `python scripts/make_tiny_code_model.py` (seeded, deterministic on CPU with
{threads} torch thread(s)); loads with `AutoModelForCausalLM` / `AutoTokenizer`. The recipe of
`assets/tiny-chat` (byte-level BPE, {vocab} tokens, ChatML template with a BOS; Qwen2, {layers}
layers, hidden {hidden}, {params:,} parameters), another task.

- Data (`data/code_train/eval.jsonl`, GSM8K layout, `#### N`): products of two 3-digit
  numbers, sums of squares over a range, counts of multiples in a range, powers modulo
  100/997/1000; too long to compute in the head of a model this size.
- Warm-up: {steps} steps of supervised training, batch {batch}, AdamW lr {lr:g}, seed {seed};
  loss on the tokens the model writes (tool outputs masked). {tool_frac:.0%} of the targets
  run a program (`<tool>print(347 * 829)</tool>` -> `<output>287663</output>` -> `\\n#### 287663`),
  the rest answer directly. Last training loss {loss:.4f}.
- Starting point (greedy, {num_eval} eval problems, rlharness's evaluator, each program run in
  the sandbox): accuracy **{acc:.1%}**, python tool called on **{tool_use:.1%}**, tool output =
  answer on **{tool_ok:.1%}**.

`python train.py experiment=code_tools` trains from here.
"""


def build(args) -> tuple:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    train, evals = chat.make_split(code_problem, rng, args.num_train, args.num_eval)
    train, evals = [with_answer(r) for r in train], [with_answer(r) for r in evals]
    tok = chat.train_tokenizer(corpus(train), args.vocab_size)
    model = chat.build_model(tok, args)

    def draw() -> tuple[str, list[tuple[str, bool]]]:
        row = rng.choice(train)
        return row["question"], response_segments(row, rng.random() < args.tool_frac)

    loss, figures, curve = chat.warm_up(model, tok, args, draw, lambda: measure(model, tok, evals, args.num_eval))
    return model, tok, {"code_train": train, "code_eval": evals}, loss, figures, curve


def write(out: Path, model, tok, splits, loss, figures, curve, args) -> None:
    readme = README.format(
        threads=args.threads, vocab=len(tok), layers=args.layers, hidden=args.hidden,
        params=sum(p.numel() for p in model.parameters()), steps=args.steps, batch=args.batch_size, lr=args.lr,
        seed=args.seed, tool_frac=args.tool_frac, loss=loss, num_eval=args.num_eval, acc=figures["code/accuracy"],
        tool_use=figures["code/tool_use_frac"], tool_ok=figures["code/tool_answer_frac"])
    chat.save(out, model, tok, splits, readme, chat.warmup_record(loss, figures, curve, args))


def parse_args(argv=None):
    parser = chat.argparse.ArgumentParser(description=__doc__,
                                          formatter_class=chat.argparse.RawDescriptionHelpFormatter)
    chat.add_model_args(parser, "tiny-code", num_train=4000, steps=600, eval_every=200)
    parser.add_argument("--tool-frac", type=float, default=0.3, help="share of targets that run a program")
    args = parser.parse_args(argv)
    chat.check_args(parser, args, ("tool_frac",))
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model, tok, splits, loss, figures, curve = build(args)
    write(out, model, tok, splits, loss, figures, curve, args)
    log.info("wrote %s (sha256 %s)", out, chat.digest(out))


if __name__ == "__main__":
    main()
