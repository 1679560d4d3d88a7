"""On-policy distillation's teacher: a frozen causal LM that scores the student's sampled tokens.

`rlharness.launch.build.build_teachers` makes one `Teacher` per distinct teacher
configuration (algo.teacher, tasks.<name>.teacher) and says which task each scores for; the producer
calls `teacher.score_or_fail(group)` once a group is generated and judged (rlharness/producer/context.py);
`rlharness.algo.distill` turns the scores into per-token advantages when the batch is built.
"""

from __future__ import annotations

from rlharness.teacher.client import Teacher

__all__ = ["Teacher"]
