"""How a run's tasks are wired: each task's entry, judger, agent loop and sampling.

A run has one task (`task` with `judger`, named by its task) or several (`tasks.<name>`, each
defaulting to the run's parts). `RunConf` (config/run.py) answers these questions: it inherits
`TaskWiring`.
"""

from __future__ import annotations

from dataclasses import replace

from rlharness.config import registry
from rlharness.config.schema import (AgentConf, JudgerConf, RuleJudgerConf, SamplingConf,
                                     TaskEntryConf)


class TaskWiring:
    """What `RunConf` knows about its tasks (the fields `tasks`, `task`, `judger`, `agent`). A task's
    staleness bound is the run's `StalenessPolicy`'s (`staleness_policy` in rlharness/launch/build.py)."""

    def task_entries(self) -> dict[str, TaskEntryConf]:
        """The run's tasks by name: `tasks`, or the single `task` (with `judger`) named by its task."""
        if self.tasks:
            return dict(self.tasks)
        return {self.task.name: TaskEntryConf(task=self.task, judger=self.judger)}

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

    def sampling_for(self, entry: TaskEntryConf) -> SamplingConf:
        return self.agent_for(entry).sampling

    def max_response_tokens(self) -> int:
        """The longest response any task may sample (Dr.GRPO's constant length)."""
        return max(self.sampling_for(e).max_tokens for e in self.task_entries().values())
