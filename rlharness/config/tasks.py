"""How a run's tasks are wired: each task's entry, judger, agent loop and sampling.

A run has one task (`task` with `judger`, named by its task) or several (`tasks.<name>`, each
defaulting to the run's parts). `RunConf` (config/run.py) answers these questions: it inherits
`TaskWiring`.
"""

from __future__ import annotations

from dataclasses import replace

from rlharness.config import registry
from rlharness.config.schema import (AgentConf, JudgerConf, RuleJudgerConf, SamplingConf,
                                     TaskEntryConf, TeacherConf)


class TaskWiring:
    """What `RunConf` knows about its tasks (the fields `tasks`, `task`, `judger`, `agent`, `algo`). A task's
    staleness bound is the run's `StalenessPolicy`'s (`staleness_policy` in rlharness/launch/build.py)."""

    def task_entries(self) -> dict[str, TaskEntryConf]:
        """The run's tasks by name: `tasks`, or the single `task` (with `judger`) named by its task."""
        if self.tasks:
            return dict(self.tasks)
        return {self.task.name: TaskEntryConf(task=self.task, judger=self.judger)}

    def task_key(self, name: str) -> str:
        """Where a task is configured (the key a refusal names): `tasks.<name>.task`, or `task`."""
        return f"tasks.{name}.task" if self.tasks else "task"

    def judger_for(self, entry: TaskEntryConf) -> JudgerConf:
        """The judger config a task is scored with; `auto` (or none given) = the task's own."""
        judger = entry.judger
        if judger is None or judger.name == "auto":
            schema = registry.schema_of("judger", entry.task.default_judger)
            if isinstance(judger, RuleJudgerConf) and issubclass(schema, RuleJudgerConf):  # judger=auto's settings
                return schema(num_workers=judger.num_workers, worker_memory_mb=judger.worker_memory_mb,
                              on_timeout=judger.on_timeout)
            return schema()
        return judger

    def agent_for(self, entry: TaskEntryConf) -> AgentConf:
        """The agent config a task runs with: its own or the run's, with its own sampling if set."""
        agent = entry.agent if entry.agent is not None else self.agent
        if not entry.sampling:
            return agent
        return replace(agent, sampling=replace(agent.sampling, **entry.sampling))

    def teacher_for(self, entry: TaskEntryConf) -> TeacherConf | None:
        """The distillation teacher a task's samples are scored by: its own, or the run's; None without one."""
        teacher = entry.teacher if entry.teacher.enabled else self.algo.teacher
        return teacher if teacher.enabled else None

    @staticmethod
    def teacher_identity(teacher: TeacherConf) -> str:
        """What makes teachers one: their configuration, coef aside (that weighs a task's advantage; one loaded
        teacher serves every task that names the same one)."""
        return repr(replace(teacher, coef=0.0))

    def distinct_teachers(self) -> dict[str, TeacherConf]:
        """The run's teachers, one per `teacher_identity` (each is loaded once: a Ray actor in mode=disagg)."""
        return {self.teacher_identity(t): t for e in self.task_entries().values()
                if (t := self.teacher_for(e)) is not None}

    def teacher_key(self, name: str) -> str:
        """Where a task's teacher is configured (the key a refusal names)."""
        return f"tasks.{name}.teacher" if self.tasks and self.tasks[name].teacher.enabled else "algo.teacher"

    def sampling_for(self, entry: TaskEntryConf) -> SamplingConf:
        return self.agent_for(entry).sampling

    def max_response_tokens(self) -> int:
        """The longest response any task may sample (Dr.GRPO's constant length)."""
        return max(self.sampling_for(e).max_tokens for e in self.task_entries().values())
