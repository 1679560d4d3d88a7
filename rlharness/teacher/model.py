"""The teacher's forward pass: log pi_teacher of each response token of prompt + response ids.

A teacher scores, it never generates: one forward pass over the rows a call brings (right-padded,
`batch_rows` at a time, no gradient), and only the response positions are projected onto the
vocabulary, chunk by chunk, with the training backends' helpers (rlharness/backend/token_scores.py):
no [rows, tokens, vocab] tensor. Scored at the rollout temperature, as the trainer scores the student.

`TeacherModel` runs where its caller put it: in the driver (colocated, in a worker thread) or as a
Ray actor of its own (mode=disagg; rlharness/teacher/client.py).
"""

from __future__ import annotations

import logging

import torch

from rlharness.backend.packing import PackedRows, honours_packing

from rlharness.backend.token_scores import head_reproduces_logits, response_token_scores
from rlharness.backend.torch_runner import TorchRunner
from rlharness.config.schema import TeacherConf
from rlharness.model.load import load_model

log = logging.getLogger(__name__)

# A row: (prompt ids + response ids, prompt length). Its scores: one log-prob per response token.
Row = tuple[list[int], int]


class TeacherModel:
    def __init__(self, conf: TeacherConf, torch_threads: int | None = None):
        if torch_threads:  # an actor of its own (the driver keeps the trainer's setting)
            torch.set_num_threads(torch_threads)
        self.conf = conf
        self.device = torch.device(conf.device)
        self.model = load_model(conf.model_conf(), device=conf.device).eval()
        self.model.requires_grad_(False)  # frozen: no optimizer ever sees it
        self.vocab_size = int(self.model.config.get_text_config().vocab_size)
        self.runner = TorchRunner(self.model)  # frozen (no optimizer): the trainer's forward and scoring paths
        self.head_split = head_reproduces_logits(self.runner)
        # Packed rows (rlharness/backend/packing.py) where the teacher's attention keeps samples apart.
        self.packing = honours_packing(self.runner.forward, self.vocab_size, self.device)
        self.forward_passes = 0

    def ready(self) -> bool:
        return True

    def logprobs(self, rows: list[Row], temperature: float) -> list[list[float]]:
        """Per row, the teacher's log-prob of each response token, `batch_rows` rows per forward pass."""
        out: list[list[float]] = []
        for start in range(0, len(rows), self.conf.batch_rows):
            out.extend(self._score(rows[start: start + self.conf.batch_rows], temperature))
        return out

    @torch.inference_mode()
    def _score(self, rows: list[Row], temperature: float) -> list[list[float]]:
        width = max(len(ids) for ids, _ in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        response = torch.zeros((len(rows), width), dtype=torch.float32)
        for b, (seq, prompt_len) in enumerate(rows):
            if not 1 <= prompt_len <= len(seq):
                raise ValueError(f"row {b}: prompt length {prompt_len} of {len(seq)} ids (a response token needs "
                                 f"a prompt token before it)")
            if seq and max(seq) >= self.vocab_size:
                raise ValueError(f"token id {max(seq)} is outside the teacher's vocabulary ({self.vocab_size} "
                                 f"tokens, {self.conf.path})")
            ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attn[b, : len(seq)] = 1
            response[b, prompt_len: len(seq)] = 1.0
        ids, attn, response = ids.to(self.device), attn.to(self.device), response.to(self.device)

        packed = PackedRows.pack_if_denser(ids, attn) if self.packing else None

        def rows_fn(positions: torch.Tensor):
            return self.runner.response_rows(ids, attn, positions, self.head_split, packed)

        lp, _ = response_token_scores(rows_fn, ids, response, temperature=temperature, entropy="none",
                                      chunk_tokens=self.conf.logprob_chunk_tokens)
        self.forward_passes += 1
        lp = lp.float().cpu()
        return [lp[b, prompt_len: len(seq)].tolist() for b, (seq, prompt_len) in enumerate(rows)]
