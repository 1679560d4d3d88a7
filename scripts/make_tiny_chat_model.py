"""Build the embedded chat model `assets/tiny-chat/`: byte-level BPE, ChatML template, tool calls.

A second embedded model that looks like a real chat checkpoint, so the paths real
users hit run on CPU in seconds:

- Tokenizer: byte-level BPE trained with `tokenizers` on text this script generates,
  Qwen2's pre-tokenizer (single digits, letters with one leading symbol), ChatML
  special tokens (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`) and a BOS
  (`<|startoftext|>`, as Yi's ChatML models) that the tokenizer adds and the chat
  template writes too: so "chat template applied once" is a real check. The template
  lives in tokenizer_config.json; `apply_chat_template` works as for Qwen.
- Model: Qwen2 architecture (GQA, q/k/v bias, RoPE, tied embeddings), fp32.
- Data (written to `data/`, GSM8K layout `question` / `answer` ending `#### N`):
  `math_*`: one- and two-step word problems on 2-digit numbers, answered with the
  working (`23 + 45 = 68` ... `#### 68`); `tools_*`: products of a 2-digit and a 2- or
  3-digit number, which a model this size cannot do in its head.
- Warm-up: supervised on both TRAIN splits, token-in/token-out exactly as the
  multi-turn loop builds a response: each segment the model writes is tokenized on
  its own, the tool output `<output>N</output>` is tokenized on its own and masked from
  the loss, the response ends with `<|im_end|>`. A `--tool-frac` of the product
  problems show the calculator call (`<tool>47*382</tool>`), the rest answer directly
  (and are mostly wrong): the model starts out calling the tool on few problems, so
  RL has something to discover. A `--work-frac` of the word problems show column working
  (`47 + 38: 7 + 8 = 15, 4 + 3 + 1 = 8, so 85`), the rest `47 + 38 = 85`: two answer
  styles of different length for RL to choose between. Trained for a fixed `--steps` (deterministic); the
  starting figures are measured with rlharness's own agent loops and evaluator.

    python scripts/make_tiny_chat_model.py                # writes assets/tiny-chat/
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

log = logging.getLogger("make_tiny_chat_model")

IGNORE = -100
BOS, EOS, PAD, IM_START = "<|startoftext|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>"
SPECIAL = [PAD, BOS, IM_START, EOS]
# Qwen2's pre-tokenizer pattern: digits one by one, a letter run with one leading symbol.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOL_START, TOOL_END, OUT_START, OUT_END = "<tool>", "</tool>", "<output>", "</output>"

NAMES = ["Ann", "Ben", "Cal", "Dora", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kim", "Lena", "Max", "Nia",
         "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vic", "Wen", "Yara", "Zoe"]
ITEMS = ["apples", "books", "pens", "cards", "coins", "shells", "stamps", "marbles", "cookies", "stickers",
         "eggs", "plums", "beads", "rocks", "toys"]
PRODUCT_QUESTIONS = ["What is {a} * {b}?", "Compute {a} times {b}.", "Multiply {a} by {b}.",
                     "How much is {a} x {b}?", "What is the product of {a} and {b}?"]


# ----------------------------------------------------------------------------- problems
def word_problem(rng: random.Random) -> dict:
    """A one- or two-step word problem; the answer shows the working, GSM8K layout."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(10, 59), rng.randint(10, 39)
    kind = rng.choice(["add", "sub", "two"])
    if kind == "add":
        q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        return {"question": q, "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
    if kind == "sub":
        a += b  # a result >= 10
        q = f"{name} had {a} {item} and gave away {b}. How many {item} are left?"
        return {"question": q, "answer": f"{a} - {b} = {a - b}\n#### {a - b}"}
    c = rng.randint(1, min(a + b - 1, 29))
    q = (f"{name} has {a} {item}, buys {b} more and then gives {c} to a friend. "
         f"How many {item} does {name} have?")
    return {"question": q, "answer": f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}\n#### {a + b - c}"}


def column_add(a: int, b: int) -> str:
    """`47 + 38: 7 + 8 = 15, 4 + 3 + 1 = 8, so 85`: one digit at a time, the carry always written."""
    ones = a % 10 + b % 10
    tens = a // 10 + b // 10 + ones // 10
    return f"{a} + {b}: {a % 10} + {b % 10} = {ones}, {a // 10} + {b // 10} + {ones // 10} = {tens}, so {a + b}"


def column_sub(a: int, b: int) -> str:
    """`74 - 39: 14 - 9 = 5, 7 - 3 - 1 = 3, so 35`: the borrow always written."""
    borrow = int(a % 10 < b % 10)
    ones = a % 10 + 10 * borrow - b % 10
    tens = a // 10 - b // 10 - borrow
    return f"{a} - {b}: {a % 10 + 10 * borrow} - {b % 10} = {ones}, {a // 10} - {b // 10} - {borrow} = {tens}, so {a - b}"


def worked_answer(row: dict) -> str:
    """The word problem's answer with column working instead of `a + b = c` lines."""
    lines = []
    for line in row["answer"].split("\n")[:-1]:
        left, _ = line.split(" = ")
        a, op, b = left.split()
        lines.append((column_add if op == "+" else column_sub)(int(a), int(b)))
    return "\n".join(lines) + "\n" + row["answer"].split("\n")[-1]


def product_problem(rng: random.Random) -> dict:
    a = rng.randint(11, 99)
    b = rng.randint(11, 99) if rng.random() < 0.5 else rng.randint(100, 999)
    q = rng.choice(PRODUCT_QUESTIONS).format(a=a, b=b)
    return {"question": q, "answer": f"{a} * {b} = {a * b}\n#### {a * b}", "a": a, "b": b}


def make_split(make, rng: random.Random, num_train: int, num_eval: int) -> tuple[list[dict], list[dict]]:
    """Distinct questions; eval questions never appear in train."""
    seen, rows = set(), []
    while len(rows) < num_train + num_eval:
        row = make(rng)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return rows[:num_train], rows[num_train:]


# ----------------------------------------------------------------------------- responses
def response_segments(row: dict, use_tool: bool) -> list[tuple[str, bool]]:
    """(text, trained) segments of the target response; untrained ones are tool outputs.
    `use_tool` is the product problems' calculator call, the word problems' column working."""
    answer = row["answer"].rsplit("####", 1)[1].strip()
    if "a" in row and use_tool:
        return [(f"{TOOL_START}{row['a']}*{row['b']}{TOOL_END}", True), (f"{OUT_START}{answer}{OUT_END}", False),
                (f"\n#### {answer}", True)]
    if "a" not in row and use_tool:
        return [(worked_answer(row), True)]
    return [(row["answer"], True)]


def chat_prompt(tok, question: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                   add_generation_prompt=True)


def encode_example(tok, question: str, segments: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """(input ids, labels): the prompt as `text_codec` encodes it (the template's BOS, no
    second one), then each segment tokenized on its own, as the multi-turn loop appends them."""
    ids = tok.encode(chat_prompt(tok, question), add_special_tokens=False)
    labels = [IGNORE] * len(ids)
    for text, trained in segments:
        seg = tok.encode(text, add_special_tokens=False)
        ids += seg
        labels += seg if trained else [IGNORE] * len(seg)
    ids.append(tok.eos_token_id)
    labels.append(tok.eos_token_id)
    return ids, labels


# ----------------------------------------------------------------------------- tokenizer
def corpus(rows: list[dict]) -> list[str]:
    texts = []
    for row in rows:
        texts.append(f"{BOS}{IM_START}user\n{row['question']}{EOS}\n{IM_START}assistant\n")
        texts += [text for use_tool in (False, True) for text, _ in response_segments(row, use_tool)]
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer=trainer)
    bos_id = core.token_to_id(BOS)
    # The tokenizer adds BOS (add_special_tokens=True), as Llama/Yi tokenizers do.
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                        special_tokens=[(BOS, bos_id)])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                  additional_special_tokens=[IM_START], clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    return tok


# ----------------------------------------------------------------------------- model
def build_model(tok, args):
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=args.max_positions, tie_word_embeddings=True, rope_theta=10000.0,
        use_sliding_window=False, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, attn_implementation="eager",
    )
    model = Qwen2ForCausalLM(config)
    # Like Qwen's chat checkpoints: generation stops at <|im_end|> or <|endoftext|>.
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id,
                                               eos_token_id=[tok.eos_token_id, tok.pad_token_id])
    return model


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    length = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    for i, (x, y) in enumerate(examples):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
        mask[i, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# ----------------------------------------------------------------------------- evaluation
def measure(model, tok, eval_rows: dict[str, list[dict]], num_prompts: int,
            agents: dict | None = None) -> dict[str, float]:
    """Greedy accuracy (and tool use) on the eval splits with rlharness's own loops and evaluator:
    the figures `python train.py experiment=chat_math / chat_tools` starts from. `agents`: split name ->
    agent config (default: `math` single-turn, `tools` with the calculator)."""
    from rlharness.agent import build_agent_loop
    from rlharness.model.load import text_codec
    from rlharness.config.schema import (EvalConf, JsonlTaskConf, MathJudgerConf, MultiTurnToolAgentConf,
                                         SamplingConf, SingleTurnAgentConf)
    from rlharness.data.jsonl import _rows_to_prompts
    from rlharness.engine.hf import HFEngine
    from rlharness.trainer.evaluator import Evaluator
    from rlharness.judger.math import MathJudger

    encode, decode = text_codec(tok)
    insert = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    agents = agents or {"math": SingleTurnAgentConf(sampling=SamplingConf(temperature=0.0, max_tokens=96)),
                        "tools": MultiTurnToolAgentConf(sampling=SamplingConf(temperature=0.0, max_tokens=48),
                                                        max_turns=2)}

    async def run() -> dict[str, float]:
        engine = HFEngine.from_model(model, tok)
        out = {}
        try:
            for name, agent in agents.items():
                rows = _rows_to_prompts(eval_rows[name][:num_prompts], JsonlTaskConf(path="-"), tok)
                loop = build_agent_loop(agent, engine, MathJudger(MathJudgerConf(fallback_last_number=False)),
                                        decode, encode=insert)
                ev = Evaluator(EvalConf(num_prompts=len(rows)), name, rows, encode, loop, None, seed=0)
                out.update({f"{name}/{k.split('/', 1)[1]}": v for k, v in (await ev.evaluate()).items()})
        finally:
            await engine.close()
        return out

    was_training = model.training
    model.eval()
    try:
        return asyncio.run(run())
    finally:
        model.train(was_training)


# ----------------------------------------------------------------------------- main
README = """# tiny-chat: an embedded chat model with a byte-level BPE tokenizer and tool calls

Made by `python scripts/make_tiny_chat_model.py` (seeded, deterministic on CPU with
{threads} torch thread(s)); loads with `AutoModelForCausalLM` / `AutoTokenizer`.

- Tokenizer: byte-level BPE trained with `tokenizers` on the generated text, {vocab}
  tokens, Qwen2's pre-tokenizer (digits one by one). Special tokens `<|endoftext|>`
  (pad), `<|startoftext|>` (BOS, added by the tokenizer), `<|im_start|>`, `<|im_end|>`
  (EOS). ChatML chat template in tokenizer_config.json:
  `<|startoftext|><|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`.
- Model: Qwen2 architecture, {layers} layers, hidden {hidden}, 4 heads / 2 KV heads, FFN
  {ffn}, tied embeddings, fp32 ({params:,} parameters).
- Data (`data/`, GSM8K layout): `math_train/eval.jsonl` (word problems, answers with the
  working then `#### N`), `tools_train/eval.jsonl` (a 2-digit times a 2- or 3-digit number).
- Warm-up: {steps} steps of supervised training, batch {batch}, AdamW lr {lr:g}, seed {seed},
  on both train splits; loss on the tokens the model writes (tool outputs masked). Of the
  product problems {tool_frac:.0%} show a calculator call
  (`<tool>47*382</tool>` -> `<output>17954</output>` -> `\\n#### 17954`), the rest answer
  directly; of the word problems {work_frac:.0%} show column working
  (`47 + 38: 7 + 8 = 15, 4 + 3 + 1 = 8, so 85`), the rest `47 + 38 = 85`. Last training
  loss {loss:.4f}.
- Starting point (greedy, {num_eval} eval problems each, rlharness's evaluator):
  word problems **{math_acc:.1%}**; products with the calculator **{tools_acc:.1%}**,
  tool called on **{tool_use:.1%}** of them, tool output = answer on **{tool_ok:.1%}**.

`python train.py experiment=chat_math` and `experiment=chat_tools` train from here.
"""


def warm_up(model, tok, args, draw, evaluate) -> tuple[float, dict, list[dict]]:
    """Supervised warm-up for `args.steps` steps of `args.batch_size` examples, `draw()` -> (question,
    segments) each; `evaluate()` -> figures every `args.eval_every` steps and at the end.
    Returns (last loss, final figures, the curve)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    curve, loss, started = [], float("nan"), time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = [encode_example(tok, *draw()) for _ in range(args.batch_size)]
        lr = args.lr * min(1.0, step / 50)  # short linear warm-up
        for group in opt.param_groups:
            group["lr"] = lr
        loss_t = model(**collate(batch, tok.pad_token_id)).loss
        opt.zero_grad(set_to_none=True)
        loss_t.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = loss_t.item()
        if step % 100 == 0:
            log.info("step %d loss %.4f (%.1f s)", step, loss, time.perf_counter() - started)
        if args.eval_every and step % args.eval_every == 0 and step < args.steps:
            figures = evaluate()
            curve.append({"step": step, "loss": loss, **figures})
            log.info("step %d %s", step, figures)
    figures = evaluate()
    curve.append({"step": args.steps, "loss": loss, **figures})
    log.info("final %s", figures)
    return loss, figures, curve


def build(args) -> tuple:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    math_train, math_eval = make_split(word_problem, rng, args.num_train, args.num_eval)
    tools_train, tools_eval = make_split(product_problem, rng, args.num_train, args.num_eval)
    tok = train_tokenizer(corpus(math_train + tools_train), args.vocab_size)
    model = build_model(tok, args)

    def draw() -> tuple[str, list[tuple[str, bool]]]:
        row = rng.choice(math_train if rng.random() < 0.5 else tools_train)
        frac = args.tool_frac if "a" in row else args.work_frac
        return row["question"], response_segments(row, rng.random() < frac)

    loss, figures, curve = warm_up(model, tok, args, draw, lambda: measure(
        model, tok, {"math": math_eval, "tools": tools_eval}, args.num_eval))
    splits = {"math_train": math_train, "math_eval": math_eval, "tools_train": tools_train, "tools_eval": tools_eval}
    return model, tok, splits, loss, figures, curve


def save(out: Path, model, tok, splits: dict[str, list[dict]], readme: str, warmup: dict) -> None:
    """The model folder, written beside `out` and renamed into place: weights, tokenizer (the chat
    template inside tokenizer_config.json, as Qwen ships it), data/<split>.jsonl, README.md, warmup.json."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    tmp.chmod(0o755)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp, save_jinja_files=False)
    (tmp / "data").mkdir()
    for name, rows in splits.items():
        with open(tmp / "data" / f"{name}.jsonl", "w") as fh:
            for row in rows:
                fh.write(json.dumps({"question": row["question"], "answer": row["answer"]}) + "\n")
    (tmp / "README.md").write_text(readme)
    (tmp / "warmup.json").write_text(json.dumps(warmup, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def write(out: Path, model, tok, splits, loss, figures, curve, args) -> None:
    readme = README.format(
        threads=args.threads, vocab=len(tok), layers=args.layers, hidden=args.hidden, ffn=4 * args.hidden,
        params=sum(p.numel() for p in model.parameters()), steps=args.steps, batch=args.batch_size, lr=args.lr,
        seed=args.seed, tool_frac=args.tool_frac, work_frac=args.work_frac, loss=loss, num_eval=args.num_eval,
        math_acc=figures["math/accuracy"], tools_acc=figures["tools/accuracy"],
        tool_use=figures["tools/tool_use_frac"], tool_ok=figures["tools/tool_answer_frac"])
    save(out, model, tok, splits, readme, warmup_record(loss, figures, curve, args))


def warmup_record(loss: float, figures: dict, curve: list[dict], args) -> dict:
    return {"final": figures, "train_loss": loss, "curve": curve, **{k: v for k, v in vars(args).items() if k != "out"}}


def digest(path: Path) -> str:
    """sha256 over the files that define the model (weights, tokenizer, data)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.name not in ("README.md", "warmup.json"):
            h.update(p.relative_to(path).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def add_model_args(parser, name: str, num_train: int, steps: int, eval_every: int) -> None:
    """The options both embedded chat models share (`name`: the asset folder)."""
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "assets" / name))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--max-positions", type=int, default=256)
    parser.add_argument("--num-train", type=int, default=num_train, help="train problems per task")
    parser.add_argument("--num-eval", type=int, default=200, help="eval problems per task")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-every", type=int, default=eval_every, help="0 = only at the end")


def check_args(parser, args, fractions: tuple[str, ...]) -> None:
    for frac in fractions:
        if not 0 <= getattr(args, frac) <= 1:
            parser.error(f"--{frac.replace('_', '-')}={getattr(args, frac)}: expected 0..1")
    if args.steps < 1 or args.batch_size < 1 or args.num_train < 1 or args.num_eval < 1:
        parser.error("--steps, --batch-size, --num-train and --num-eval must be >= 1")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser, "tiny-chat", num_train=2000, steps=750, eval_every=250)
    parser.add_argument("--tool-frac", type=float, default=0.3,
                        help="share of product problems whose target shows the calculator call")
    parser.add_argument("--work-frac", type=float, default=0.3,
                        help="share of word problems whose target shows the column working")
    args = parser.parse_args(argv)
    check_args(parser, args, ("tool_frac", "work_frac"))
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model, tok, splits, loss, figures, curve = build(args)
    write(out, model, tok, splits, loss, figures, curve, args)
    log.info("wrote %s (sha256 %s)", out, digest(out))


if __name__ == "__main__":
    main()
