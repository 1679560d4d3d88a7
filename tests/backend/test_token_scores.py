"""The trainer scores response tokens chunk by chunk (rlharness/backend/token_scores.py) on a model with a
large vocabulary: same log-probs, entropy, loss and update as the plain full-logits computation, and no
[rows, tokens, vocab] tensor anywhere in a training step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlharness.algo.losses import token_entropy, token_logprobs
from rlharness.backend.learner import Learner
from rlharness.backend.token_scores import head_reproduces_logits
from rlharness.backend.torch_runner import TorchRunner
from rlharness.config.schema import AlgoConf, ConfigError, ModelConf, TorchBackendConf
from rlharness.model.tiny import DEFAULT_CHARS, save_tiny_model
from rlharness.trainer.batch import build_train_batch
from tests.backend.test_torch_backend import make_groups

pytestmark = pytest.mark.timeout(120)

VOCAB_CHARS = DEFAULT_CHARS + "".join(chr(0x4E00 + i) for i in range(1000))  # a 1024-token vocabulary


@pytest.fixture(scope="module")
def wide_vocab_model(tmp_path_factory) -> str:
    """A tiny Llama whose vocabulary is much wider than its hidden size (as a real model's is)."""
    return str(save_tiny_model(tmp_path_factory.mktemp("wide") / "model", chars=VOCAB_CHARS, hidden=32, ffn=64,
                               heads=2, layers=2))


class PlainScores(Learner):
    """The computation the trainer replaced: the model's logits for every position, full log-softmax."""

    def _token_scores(self, runner, mb, temperature, entropy):
        logits = runner.logits(mb["input_ids"], mb["attention_mask"])
        lp = token_logprobs(logits, mb["input_ids"], temperature)
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            ent = token_entropy(logits, temperature)
        return lp, ent


def batch_for(algo: AlgoConf, seed: int = 0, temperature: float = 1.0):
    groups = make_groups(seed, num_groups=3, k=4, vocab=len(VOCAB_CHARS) + 4)
    return build_train_batch(groups, algo, pad_token_id=0, train_step=1, max_response_len=8,
                             temperature=temperature)[0]


def make(cls, model_dir: str, algo: AlgoConf, **conf_kw) -> Learner:
    return cls(TorchBackendConf(**conf_kw), ModelConf(path=model_dir), algo, total_steps=10, seed=0)


def tensors(batch) -> dict[str, torch.Tensor]:
    return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
            "response_mask": batch.response_mask}


@pytest.mark.parametrize("entropy", ["detached", "grad"])
def test_scores_equal_the_full_logits_computation(wide_vocab_model, entropy):
    b = make(Learner, wide_vocab_model, AlgoConf(name="grpo"), logprob_chunk_tokens=5)
    assert b.head_split  # a Llama: lm_head(decoder(x)) is its logits, so only response rows are projected
    batch = batch_for(b.algo)
    mb, mask = tensors(batch), batch.response_mask > 0
    lp, ent = b._token_scores(b.policy, mb, 0.7, entropy)
    logits = b.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    torch.testing.assert_close(lp[mask], token_logprobs(logits, batch.input_ids, 0.7)[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent[mask], token_entropy(logits, 0.7)[mask], rtol=1e-5, atol=1e-5)
    assert lp[~mask].abs().sum() == 0 and ent[~mask].abs().sum() == 0  # prompt and padding: not computed
    assert ent.requires_grad == (entropy == "grad")


@pytest.mark.parametrize("algo_kw", [
    {},  # token_mean, entropy a metric only
    {"entropy_coef": 0.01, "kl_coef": 0.05, "loss_agg": "seq_mean_token_mean", "micro_batch_size": 5},
])
def test_train_step_equals_plain_scoring(wide_vocab_model, algo_kw):
    """Loss, metrics and the updated weights: chunked (3 tokens a chunk, recomputed in backward,
    with gradient checkpointing) against the full-logits trainer."""
    algo = AlgoConf(name="grpo", lr=1e-3, **algo_kw)
    chunked = make(Learner, wide_vocab_model, algo, logprob_chunk_tokens=3, gradient_checkpointing=True)
    plain = make(PlainScores, wide_vocab_model, algo)
    batch = batch_for(algo, temperature=0.8)
    got, want = chunked.train_step_blocking(batch), plain.train_step_blocking(batch)
    for key in ("train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/grad_norm",
                "train/logprob_diff_rollout", "train/response_tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    for (name, p), q in zip(chunked.model.named_parameters(), plain.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


class ScaledLogits(TorchRunner):
    """A model that scales its logits after the head (as some do)."""

    def logits(self, ids, attn):
        return 2.0 * super().logits(ids, attn)


class LargestVocabRows(TorchDispatchMode):
    """Records the largest number of rows of any op output whose last dimension is the vocabulary
    (the [hidden, vocab] transposed head weight excepted)."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.vocab, self.hidden, self.rows, self.three_d = vocab, hidden, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == self.vocab:
                if t.dim() >= 3:
                    self.three_d.append(tuple(t.shape))
                if tuple(t.shape) == (self.hidden, self.vocab):
                    continue
                self.rows = max(self.rows, t.numel() // self.vocab)
        return out


def test_train_step_never_builds_a_rows_tokens_vocab_tensor(wide_vocab_model):
    algo = AlgoConf(name="grpo", kl_coef=0.05, mini_batches=2)  # + old log-probs pass and the reference model
    b = make(Learner, wide_vocab_model, algo, logprob_chunk_tokens=8)
    batch = batch_for(algo)
    with LargestVocabRows(b.model.config.vocab_size, b.model.config.hidden_size) as seen:
        b.train_step_blocking(batch)
    assert seen.three_d == []
    assert seen.rows == 8  # one chunk of response tokens at a time (the tied embedding is [vocab, hidden])
    assert batch.input_ids.numel() > 3 * 8


def test_models_whose_logits_are_not_the_head_are_scored_from_logits(wide_vocab_model):
    b = make(Learner, wide_vocab_model, AlgoConf(name="grpo"))
    assert head_reproduces_logits(b.policy)
    assert not head_reproduces_logits(ScaledLogits(b.model))
    b.head_split = False
    batch = batch_for(b.algo)
    mask = batch.response_mask > 0
    lp, _ = b._token_scores(b.policy, tensors(batch), 1.0, "none")
    logits = b.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    torch.testing.assert_close(lp[mask], token_logprobs(logits, batch.input_ids)[mask], rtol=1e-5, atol=1e-5)


def test_logprob_chunk_tokens_must_be_positive():
    with pytest.raises(ConfigError, match="backend.logprob_chunk_tokens=0"):
        dataclasses.replace(TorchBackendConf(), logprob_chunk_tokens=0)
