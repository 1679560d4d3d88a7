"""The embedded chat model `assets/tiny-chat` (byte-level BPE, ChatML template, tool calls)
through the real paths: chat template once, stop strings inside and across BPE tokens,
token-in/token-out single- and multi-turn rollouts whose trained ids are the generated
ids and whose trainer log-probs are the engine's, and the ledger's turns."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from rlharness.agent import build_agent_loop
from rlharness.algo.losses import token_logprobs
from rlharness.model.load import text_codec
from rlharness.config.schema import (AlgoConf, JsonlTaskConf, MathJudgerConf, ModelConf, MultiTurnToolAgentConf,
                                     SamplingConf, SingleTurnAgentConf, TorchBackendConf)
from rlharness.data import build_task
from rlharness.engine.base import GenerateRequest, GenerateResult, RolloutEngine, SamplingParams
from rlharness.engine.hf import HFEngine
from rlharness.judger.math import MathJudger
from rlharness.model.load import PROJECT_ROOT, load_model, load_tokenizer
from rlharness.core.run_dir import RunDir
from rlharness.trainer.batch import build_train_batch
from rlharness.core.types import Status, make_group

pytestmark = pytest.mark.timeout(180)

ASSET = PROJECT_ROOT / "assets" / "tiny-chat"
MODEL = ModelConf(path=str(ASSET))
TOK = load_tokenizer(MODEL)
ENCODE, DECODE = text_codec(TOK)


def insert(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def chat(question: str) -> str:
    return TOK.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                   add_generation_prompt=True)


def rows(name: str, n: int) -> list[dict]:
    lines = (ASSET / "data" / f"{name}.jsonl").read_text().splitlines()[:n]
    return [json.loads(line) for line in lines]


class Recording(RolloutEngine):
    """Passes requests to the real engine and keeps each (request, result)."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine, self.calls = engine, []

    @property
    def version(self) -> int:
        return self.engine.version

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await self.engine.generate(request)
        self.calls.append((request, result))
        return result

    async def abort_all(self) -> int:
        return await self.engine.abort_all()

    async def load_weights(self, state, version: int) -> None:
        await self.engine.load_weights(state, version)


# ----------------------------------------------------------------------------- the asset
def test_the_asset_loads_like_a_hub_checkpoint_and_is_small():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ASSET)
    model = AutoModelForCausalLM.from_pretrained(ASSET)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)
    assert 256 <= len(tok) <= 4096
    assert (tok.bos_token, tok.eos_token) == ("<|startoftext|>", "<|im_end|>")
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert sum(p.stat().st_size for p in ASSET.rglob("*") if p.is_file()) < 8 * 2**20
    # Byte-level BPE: any text round-trips, and tokens span several characters.
    text = "Ünïcode → 47 * 382 = 17954 </tool>"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert any(len(tok.decode([i])) > 2 for i in tok.encode("How many apples are left?", add_special_tokens=False))


def test_chat_template_applied_once_no_double_bos_on_the_gsm8k_layout_jsonl_task():
    conf = JsonlTaskConf(path="assets/tiny-chat/data/math_train.jsonl",
                         eval_path="assets/tiny-chat/data/math_eval.jsonl")  # relative: the project root
    task = build_task(conf, tokenizer=TOK)
    first = rows("math_train", 1)[0]
    row = task.train[0]
    assert row.prompt_text == chat(first["question"])
    assert row.label == {"answer": first["answer"].rsplit("####", 1)[1].strip()}
    ids = ENCODE(row.prompt_text)
    assert ids.count(TOK.bos_token_id) == 1 and ids[0] == TOK.bos_token_id
    # The same ids apply_chat_template gives when it tokenizes itself.
    want = TOK.apply_chat_template([{"role": "user", "content": first["question"]}], tokenize=True,
                                   add_generation_prompt=True)
    assert ids == list(want["input_ids"] if hasattr(want, "keys") else want)
    # Plain text still gets the tokenizer's one BOS.
    assert ENCODE("hi")[0] == TOK.bos_token_id and ENCODE("hi").count(TOK.bos_token_id) == 1


# ----------------------------------------------------------------------------- engine
def first_stop_at(pieces: list[str], j: int, stop: str) -> bool:
    """`stop` first appears in the decoded tokens once token j is in (not before)."""
    return stop not in "".join(pieces[:j]) and stop in "".join(pieces[: j + 1])


def test_stop_strings_inside_and_across_bpe_tokens():
    """A stop string ending inside a multi-character token stops at that token (text = decode of
    the tokens, so the text runs past the stop string); one spanning tokens stops at its last."""
    model = load_model(MODEL)
    prompt = ENCODE(chat(rows("math_eval", 1)[0]["question"]))

    async def go():
        engine = HFEngine.from_model(model, TOK, eos_token_ids=[])
        try:
            ref = await engine.generate(GenerateRequest("ref", prompt, SamplingParams(greedy=True, max_tokens=40)))
            pieces = [DECODE([t]) for t in ref.token_ids]
            cases = []
            for j in range(1, len(pieces)):  # ends inside token j: its first character only
                stop = "".join(pieces[:j])[-3:] + pieces[j][:1]
                if len(pieces[j]) >= 2 and len(stop) >= 2 and first_stop_at(pieces, j, stop):
                    cases.append((j, stop))
                    break
            for j in range(1, len(pieces)):  # spans tokens j-1 and j, ends at the end of j
                stop = pieces[j - 1][-2:] + pieces[j]
                if pieces[j - 1] and pieces[j] and first_stop_at(pieces, j, stop):
                    cases.append((j, stop))
                    break
            assert len(cases) == 2, pieces
            outs = []
            for j, stop in cases:
                params = SamplingParams(greedy=True, max_tokens=40, stop=["never", stop])
                outs.append(await engine.generate(GenerateRequest(stop, prompt, params)))
            return ref.token_ids, cases, outs
        finally:
            await engine.close()

    ref, ((inside, stop_inside), (across, stop_across)), (r_in, r_across) = asyncio.run(go())
    assert r_in.finish_reason == "stop" and r_in.token_ids == ref[: inside + 1]
    assert r_in.text == DECODE(r_in.token_ids) and stop_inside in r_in.text and not r_in.text.endswith(stop_inside)
    assert r_across.finish_reason == "stop" and r_across.token_ids == ref[: across + 1]
    assert r_across.text == DECODE(r_across.token_ids) and r_across.text.endswith(stop_across)


# ----------------------------------------------------------------------------- rollouts = training
def rollout(agent_conf, data: str, k: int = 4, n: int = 4):
    model = load_model(MODEL)
    judger = MathJudger(MathJudgerConf(fallback_last_number=False))

    async def go():
        engine = Recording(HFEngine.from_model(model, TOK))
        try:
            loop = build_agent_loop(agent_conf, engine, judger, DECODE, encode=insert)
            groups = []
            for i, row in enumerate(rows(data, n)):
                g = make_group(task=data, prompt_index=i, epoch=0, prompt_text=chat(row["question"]),
                               prompt_ids=ENCODE(chat(row["question"])),
                               label={"answer": row["answer"].rsplit("####", 1)[1].strip()}, k=k, seed=5)
                groups.append(await loop.generate_group(g, enable_partial_rollout=True))
            return loop, engine.calls, groups
        finally:
            await engine.engine.close()

    return asyncio.run(go())


def check_trained_equals_generated(calls, groups, max_tokens: int) -> None:
    """Every request was the sample's own tokens so far (never re-tokenized text), each result's
    tokens sit in the response as generated, and the trainer's log-probs on the batch are the
    engine's."""
    from rlharness.backend.learner import Learner

    seqs = [s.prompt_ids + s.response_ids for g in groups for s in g]

    def placed(request, result, seq) -> bool:
        """The request is `seq`'s own prefix and the result's tokens follow it, all of them or
        (a call's tail past its end marker is dropped) up to a complete call."""
        start = len(request.prompt_ids)
        if seq[:start] != request.prompt_ids:
            return False
        got = seq[start: start + len(result.token_ids)]
        n = next((i for i, (a, b) in enumerate(zip(got, result.token_ids)) if a != b), len(got))
        return n == len(result.token_ids) or (n > 0 and "</tool>" in DECODE(result.token_ids[:n]))

    for request, result in calls:
        assert any(placed(request, result, seq) for seq in seqs), (request.request_id, result.token_ids)
    backend = Learner(TorchBackendConf(), MODEL, AlgoConf(name="grpo"), total_steps=1, seed=0)
    batch, _ = build_train_batch(groups, backend.algo, TOK.pad_token_id, 1, max_tokens, 1.0)
    with torch.no_grad():
        logits = backend.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    trainer = token_logprobs(logits, batch.input_ids)
    for b, s in enumerate(s for g in groups for s in g):
        n = len(s.prompt_ids) + len(s.response_ids)
        assert batch.input_ids[b, :n].tolist() == s.prompt_ids + s.response_ids
        p, m = len(s.prompt_ids), s.loss_mask()
        assert batch.response_mask[b, p:n].tolist() == m
        model_pos = [p + i for i, keep in enumerate(m) if keep]
        torch.testing.assert_close(trainer[b, model_pos], batch.rollout_logprobs[b, model_pos], atol=2e-4, rtol=0)


def test_single_turn_trained_ids_and_logprobs_are_the_engines():
    conf = SingleTurnAgentConf(sampling=SamplingConf(max_tokens=40))
    _, calls, groups = rollout(conf, "math_eval")
    assert all(s.status == Status.COMPLETED for g in groups for s in g)
    assert any(s.finish_reason == "stop" for g in groups for s in g)  # <|im_end|> ends responses
    check_trained_equals_generated(calls, groups, 40)


def test_multi_turn_tool_output_tokenized_once_masked_and_the_rest_is_the_engines():
    conf = MultiTurnToolAgentConf(sampling=SamplingConf(max_tokens=32), max_turns=2)
    loop, calls, groups = rollout(conf, "tools_eval", k=6)
    assert loop.tool_calls > 0, "the warmed-up model calls the calculator on some samples"
    called = [s for g in groups for s in g if s.extra["tool_calls"]]
    for s in called:
        m = s.loss_mask()
        start = m.index(0)
        end = start + m[start:].index(1) if 1 in m[start:] else len(m)
        # The turn before the output ends at the token completing "</tool>"; the output is the
        # calculator's answer, tokenized on its own and appended as is.
        turn = DECODE(s.response_ids[:start])
        assert "</tool>" in turn and "</tool>" not in DECODE(s.response_ids[: start - 1])
        call = turn[turn.index("<tool>") + len("<tool>"): turn.index("</tool>")]
        from rlharness.agent.tools import ToolError, calculator
        try:
            expected = calculator(call)
        except ToolError as exc:
            expected = f"error: {exc}"
        assert s.response_ids[start:end] == insert(f"<output>{expected}</output>")[: end - start]
        assert [t["role"] for t in s.extra["turns"]][:2] == ["assistant", "tool"]
        assert s.extra["turns"][1]["text"] == expected
        assert "".join(t["text"] if t["role"] == "assistant" else f"<output>{t['text']}</output>"
                       for t in s.extra["turns"]) == s.response_text
    check_trained_equals_generated(calls, groups, 32)


# ----------------------------------------------------------------------------- train.py
@pytest.mark.timeout(600)
def test_train_py_experiment_chat_tools_records_turns_in_the_ledger(tmp_path):
    from rlharness.logging_utils.ledger import read_ledger
    from rlharness.logging_utils.metrics import read_metrics
    from tests.helpers import QUICK, run_in_process

    run_dir = tmp_path / "run"
    run_in_process(run_dir, ["experiment=chat_tools", *QUICK, "total_steps=2", "eval_every=0",
                             "eval.num_prompts=8"])
    metrics = read_metrics(RunDir(run_dir).metrics)
    assert [r["step"] for r in metrics if "train/loss" in r] == [1, 2]
    evals = [r for r in metrics if "eval/accuracy" in r]
    assert evals and all("eval/tool_use_frac" in r and "eval/tool_answer_frac" in r for r in evals)
    trained, _ = read_ledger(run_dir)
    assert trained and all(r["prompt"].startswith("<|startoftext|><|im_start|>user\n") for r in trained)
    assert all(r["tool_calls"] == sum(t["role"] == "tool" for t in r["turns"]) for r in trained)
    assert any(r["tool_calls"] for r in trained)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("script_name", ["make_tiny_chat_model.py", "make_tiny_code_model.py"])
def test_make_tiny_chat_model_is_deterministic_on_a_reduced_size(tmp_path, script_name):
    """The build script twice with the same seed: byte-identical weights, tokenizer and data (tiny-chat,
    and tiny-code, which shares its recipe and runs its measurements' programs in the sandbox)."""
    import importlib.util
    import subprocess
    import sys

    script = PROJECT_ROOT / "scripts" / script_name
    small = ["--steps", "4", "--num-train", "40", "--num-eval", "4", "--vocab-size", "300", "--batch-size", "8"]
    for name in ("a", "b"):
        subprocess.run([sys.executable, str(script), "--out", str(tmp_path / name), *small], check=True,
                       capture_output=True, timeout=300)
    spec = importlib.util.spec_from_file_location("make_tiny_chat_model", script.parent / "make_tiny_chat_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.digest(tmp_path / "a") == module.digest(tmp_path / "b")
    assert json.loads((tmp_path / "a" / "warmup.json").read_text())["final"] == \
        json.loads((tmp_path / "b" / "warmup.json").read_text())["final"]
