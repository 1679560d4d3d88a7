"""The teacher's scores (rlharness/teacher/model.py) equal a plain full-vocabulary log-softmax of the same
model, whatever the chunking (`logprob_chunk_tokens`), the rows batched together (right padding) and
the temperature; bfloat16 weights stay close."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlharness.config.schema import TeacherConf
from rlharness.teacher.model import TeacherModel
from tests.helpers import ROOT

TEACHER = str(ROOT / "assets" / "tiny-arith-teacher")
ROWS = [([3, 5, 7, 4, 9, 11, 2], 4), ([6, 8, 10, 12, 3, 4, 5, 6, 7, 2], 3), ([4, 4], 1)]


def reference(temperature: float) -> list[list[float]]:
    model = AutoModelForCausalLM.from_pretrained(TEACHER, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids, prompt_len in ROWS:
            logits = model(torch.tensor([ids])).logits[0, :-1].float() / temperature
            lp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
            out.append(lp[prompt_len - 1:].tolist())
    return out


@pytest.mark.parametrize("chunk, rows", [(1, 1), (2, 2), (1024, 16)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scores_equal_a_full_log_softmax(chunk, rows, temperature):
    model = TeacherModel(TeacherConf(path=TEACHER, logprob_chunk_tokens=chunk, batch_rows=rows))
    assert model.packing  # several rows score as packed rows, each equal to its own forward
    got = model.logprobs(ROWS, temperature)
    want = reference(temperature)
    assert [len(g) for g in got] == [len(ids) - p for ids, p in ROWS]
    for g, w in zip(got, want):
        assert torch.allclose(torch.tensor(g), torch.tensor(w), atol=1e-5), (g, w)


def test_bfloat16_weights_stay_close():
    got = TeacherModel(TeacherConf(path=TEACHER, dtype="bfloat16")).logprobs(ROWS, 1.0)
    for g, w in zip(got, reference(1.0)):
        assert torch.allclose(torch.tensor(g), torch.tensor(w), atol=0.1)


def test_a_row_without_a_prompt_token_or_outside_the_vocabulary_is_refused():
    model = TeacherModel(TeacherConf(path=TEACHER))
    with pytest.raises(ValueError, match="prompt length 0"):
        model.logprobs([([3, 4], 0)], 1.0)
    with pytest.raises(ValueError, match="outside the teacher's vocabulary"):
        model.logprobs([([3, 400], 1)], 1.0)
