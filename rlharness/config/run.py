"""The run's configuration (`RunConf`): the parts (each its own schema in config/schema.py), the run's
own settings, and the checks across parts. What a run's tasks are wired to is `TaskWiring`
(config/tasks.py). What depends on installed packages (where a vLLM engine runs, reasoning-gym's
datasets) is checked in preflight (`check_installed`), not here."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

from omegaconf import MISSING, DictConfig, OmegaConf

from rlharness.config.schema import (
    MAX_OVER_SAMPLE, TASK_NAME_CHARS, VLLM_MAX_LORA_RANK, AgentConf, AlgoConf, BackendConf, ClusterConf,
    ConfigError, EngineConf, EvalConf, HealthConf, JudgerConf, LoggerConf, ModelConf, SamplerConf, SamplingConf,
    StrategyConf, TaskConf, TaskEntryConf, TrainerConf, _check, _one_of, check_prompt_repeat_k, non_finite_values)
from rlharness.config.tasks import TaskWiring

MAX_SAMPLES_PER_STEP = 1_000_000  # sequences generated in one step (or one eval): memory, not a setting


@dataclass
class RunConf(TaskWiring):
    strategy: StrategyConf = MISSING
    sampler: SamplerConf = field(default_factory=SamplerConf)
    agent: AgentConf = MISSING
    judger: JudgerConf = MISSING
    model: ModelConf = field(default_factory=ModelConf)
    engine: EngineConf = MISSING
    backend: BackendConf = MISSING
    algo: AlgoConf = MISSING
    task: TaskConf = MISSING
    cluster: ClusterConf = MISSING
    logger: LoggerConf = MISSING
    eval: EvalConf = field(default_factory=EvalConf)
    trainer: TrainerConf = field(default_factory=TrainerConf)
    health: HealthConf = field(default_factory=HealthConf)
    # Multi-task runs: name -> task entry (experiment=arith_mix). Empty = the single
    # task `task` with `judger`, named by its task (today's runs, unchanged).
    tasks: dict[str, TaskEntryConf] = field(default_factory=dict)

    # Seeds the data order and the per-sample sampling seeds; a run repeats for a seed on one machine.
    seed: int = 0
    mode: str = "colocate"  # colocate | disagg
    # How many weight versions a trained token may lag (0 = on-policy); strategy.max_staleness follows it.
    max_staleness: int = 0
    # Training steps (one batch each); resuming with a larger value extends the run.
    total_steps: int = 400
    batch_size: int = 64  # prompt groups per training step
    eval_every: int = 50  # 0 = only before and after training
    save_every: int = 50  # 0 = only at the end
    resume: str = "auto"  # auto | never | <run dir>
    # Sync the engines' weights every this many steps (eval steps always sync first).
    sync_weights_interval: int = 1
    # The newest complete checkpoints kept; older ones are deleted.
    keep_checkpoints: int = 2
    # Seconds any wait for a batch, a transfer or a pause may take before it is an error.
    timeout_s: float = 600.0
    # SIGTERM/SIGINT: seconds to stop (final checkpoint if it fits, W&B, actors) before exiting
    # regardless. Slurm sends SIGKILL 30 s (KillWait) after its SIGTERM.
    stop_timeout_s: float = 25.0
    # Print what the composed config means per step (rlharness/launch/explain.py) and exit: nothing starts,
    # no run directory is made.
    explain: bool = False
    # Set by the launcher from Hydra's output dir; users never need to.
    run_dir: str = ""

    def __post_init__(self) -> None:
        bad = non_finite_values(self)
        if bad:
            key, value = bad[0]
            raise ConfigError(f"{key}={value!r} is not allowed: expected a finite number")
        _one_of("mode", self.mode, ("colocate", "disagg"))
        # NumPy's seed sequences (data order, sampling) take only non-negative integers.
        _check(isinstance(self.seed, int) and 0 <= self.seed < 2**63, "seed", self.seed, "an integer >= 0")
        _check(self.total_steps >= 1, "total_steps", self.total_steps, ">= 1")
        _check(self.batch_size >= 1, "batch_size", self.batch_size, ">= 1")
        _check(self.max_staleness >= 0, "max_staleness", self.max_staleness, ">= 0")
        _check(self.eval_every >= 0, "eval_every", self.eval_every, ">= 0")
        _check(self.save_every >= 0, "save_every", self.save_every, ">= 0")
        _check(self.sync_weights_interval >= 1, "sync_weights_interval", self.sync_weights_interval, ">= 1")
        _check(self.keep_checkpoints >= 1, "keep_checkpoints", self.keep_checkpoints, ">= 1")
        _check(self.timeout_s > 0, "timeout_s", self.timeout_s, "> 0")
        _check(self.stop_timeout_s > 0, "stop_timeout_s", self.stop_timeout_s, "> 0")
        _check(self.resume in ("auto", "never") or bool(self.resume), "resume", self.resume,
               "auto, never or a run directory")
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Refuse combinations that cannot work, with the reason."""
        if self.backend.ranked and self.cluster.name == "local":
            raise ConfigError(
                f"backend={self.backend.name} runs its workers as Ray actors: use cluster=local_ray or cluster=slurm"
            )
        if self.mode == "disagg" and self.cluster.name == "local":
            raise ConfigError(
                "mode=disagg with cluster=local is not allowed: disaggregated rollout and training run as Ray "
                "actors; use cluster=local_ray (this machine) or cluster=slurm"
            )
        if (self.cluster.name == "slurm" and self.cluster.nodes > 1 and self.mode == "colocate"
                and not self.backend.ranked):
            raise ConfigError(
                f"cluster.nodes={self.cluster.nodes} with mode=colocate and backend={self.backend.name} is not allowed: "
                f"that run is one process on the first node and the other nodes would sit idle; use mode=disagg "
                f"(engines and trainers on their own nodes), backend=deepspeed or fsdp2, or cluster.nodes=1")
        lora = self.model.lora
        if self.engine.weight_delta == "on" and lora.enabled and lora.sync == "adapter":
            raise ConfigError("engine.weight_delta=on with model.lora.sync=adapter is not allowed: an adapter sync "
                              "sends the small A and B matrices whole; use engine.weight_delta=auto or off")
        # Resolved once here, so the engines and the weight channel agree on it.
        if self.engine.weight_delta == "auto":
            self.engine.weight_delta = "on" if self.engine.sends_deltas(self.model, self.backend.on_gpu) else "off"
        if lora.enabled and lora.sync == "adapter" and self.engine.name == "vllm" and lora.rank > VLLM_MAX_LORA_RANK:
            raise ConfigError(f"model.lora.sync=adapter with engine=vllm and model.lora.rank={lora.rank} is not allowed: "
                              f"vLLM serves adapters up to rank {VLLM_MAX_LORA_RANK}; use model.lora.sync=merged")
        self._check_tasks()
        if self.tasks and not any(e.task.num_eval for e in self.tasks.values()):
            raise ConfigError("every task has task.num_eval=0: at least one task needs an eval split "
                              f"(tasks.<name>.task.num_eval, tasks: {', '.join(self.tasks)})")
        for name, entry in self.task_entries().items():
            key = f"{self.task_key(name)}.num_eval"
            if self.tasks and entry.task.num_eval == 0:
                continue  # trained, not evaluated (eval/accuracy averages the tasks that are)
            if self.eval.num_prompts > entry.task.num_eval:
                raise ConfigError(f"eval.num_prompts={self.eval.num_prompts} exceeds {key}={entry.task.num_eval}")
        check_prompt_repeat_k(self.sampler.prompt_repeat_k, advantage=self.algo.advantage)
        self._check_teachers()
        samples = self.batch_size * self.sampler.prompt_repeat_k
        if samples > MAX_SAMPLES_PER_STEP:
            raise ConfigError(f"batch_size={self.batch_size} x sampler.prompt_repeat_k={self.sampler.prompt_repeat_k} = "
                              f"{samples} samples per step is not allowed: at most {MAX_SAMPLES_PER_STEP} (each is a "
                              f"sequence generated, held and trained in the step)")
        if self.eval.num_prompts * self.eval.n > MAX_SAMPLES_PER_STEP:
            raise ConfigError(f"eval.num_prompts={self.eval.num_prompts} x {self.eval.n} samples each is not allowed: "
                              f"at most {MAX_SAMPLES_PER_STEP} samples per evaluation")
        for name, entry in self.task_entries().items():
            max_tokens = self.sampling_for(entry).max_tokens
            if self.algo.overlong_buffer_len >= max_tokens:
                where = f"tasks.{name}'s max_tokens" if self.tasks else "agent.sampling.max_tokens"
                raise ConfigError(
                    f"algo.overlong_buffer_len={self.algo.overlong_buffer_len} must be < {where}="
                    f"{max_tokens} (the penalty ramps over the budget's last tokens)")
        if self.strategy.max_staleness != self.max_staleness:
            raise ConfigError(
                f"strategy.max_staleness={self.strategy.max_staleness} differs from max_staleness="
                f"{self.max_staleness}: they are one setting (strategy.max_staleness follows max_staleness); "
                f"set one of them")
        if self.eval.n > 1 and self.eval.temperature <= 0:
            raise ConfigError(f"eval.pass_k/num_samples > 1 needs eval.temperature > 0, got {self.eval.temperature} "
                              f"(greedy samples are identical)")

    def _check_teachers(self) -> None:
        """Each task's teacher (algo.teacher or tasks.<name>.teacher): its values, one where algo=opd needs it,
        none where the advantage cannot take a per-token term."""
        self.algo.teacher.check("algo.teacher")
        for name, entry in self.tasks.items():
            entry.teacher.check(f"tasks.{name}.teacher")
        for name, entry in self.task_entries().items():
            teacher, key = self.teacher_for(entry), self.teacher_key(name)
            if self.algo.advantage == "opd":
                if teacher is None:
                    where = (f" for task {name!r}: algo.teacher.path (or tasks.{name}.teacher.path)" if self.tasks
                             else ": algo.teacher.path")
                    raise ConfigError(f"algo=opd needs a teacher{where} is not set; set it to a causal-LM folder "
                                      f"(e.g. one exported with python -m rlharness.export)")
                if teacher.coef == 0:
                    raise ConfigError(f"{key}.coef=0 is not allowed with algo=opd: the teacher's signal is the "
                                      f"whole advantage, so nothing would be learned; expected > 0")
            elif teacher is not None and self.algo.advantage == "gae":
                raise ConfigError(f"{key}.path with algo.advantage=gae is not allowed: GAE's per-token advantages "
                                  f"are computed from the critic at train time, with no place for the teacher's "
                                  f"term; use a group advantage (algo=grpo, rloo, ...) or algo=opd")

    def _check_tasks(self) -> None:
        """Names usable as metric keys, weights > 0, one batch slot per task at least, one scoring temperature."""
        for name, entry in self.tasks.items():
            if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
                raise ConfigError(f"tasks.{name}: task names may use only {TASK_NAME_CHARS}")
            _check(entry.weight > 0 and math.isfinite(entry.weight), f"tasks.{name}.weight", entry.weight,
                   "a finite number > 0")
            _check(entry.over_sample_threshold is None or 0 <= entry.over_sample_threshold <= MAX_OVER_SAMPLE,
                   f"tasks.{name}.over_sample_threshold", entry.over_sample_threshold,
                   f"null or a number from 0 to {MAX_OVER_SAMPLE}")
            _check(entry.over_sample_threshold is None or self.strategy.name == "async",
                   f"tasks.{name}.over_sample_threshold", entry.over_sample_threshold,
                   f"null with strategy={self.strategy.name} (only strategy=async over-samples)")
            _check(entry.max_staleness is None or (isinstance(entry.max_staleness, int)
                                                   and 0 <= entry.max_staleness <= self.max_staleness),
                   f"tasks.{name}.max_staleness", entry.max_staleness,
                   f"null (the run's) or an integer from 0 to the run's max_staleness={self.max_staleness} "
                   f"(raise max_staleness to give a task more)")
            unknown = sorted(set(entry.sampling) - set(SamplingConf.__dataclass_fields__))
            _check(not unknown, f"tasks.{name}.sampling", unknown,
                   "keys among " + ", ".join(SamplingConf.__dataclass_fields__))
            temperature = self.sampling_for(entry).temperature
            if temperature != self.agent.sampling.temperature:
                raise ConfigError(
                    f"tasks.{name} samples at temperature {temperature}, the run at agent.sampling.temperature="
                    f"{self.agent.sampling.temperature}: every task must use the run's temperature (the trainer "
                    f"scores log-probs at one temperature)")
        if len(self.tasks) > self.batch_size:
            raise ConfigError(f"batch_size={self.batch_size} is smaller than the number of tasks "
                              f"({len(self.tasks)}: {', '.join(self.tasks)}): every task needs a slot")


def adopt_strategy_max_staleness(cfg: DictConfig, overrides: Sequence[str] = ()) -> None:
    """Make `strategy.max_staleness=N` given alone the run's bound (before `OmegaConf.to_object`).

    The strategy's value interpolates the top-level `max_staleness`, which the run's
    staleness policy is built from (producer/staleness.py; nothing at run time reads the
    strategy's copy). A user who sets the strategy's key replaces the
    interpolation: unless the top-level key was also given on the command line (even as
    its default, 0) or changed by an experiment, it takes the user's value; if both were
    set and differ, `RunConf` refuses the pair.
    """
    strategy = cfg.get("strategy")
    if strategy is None or "max_staleness" not in strategy or OmegaConf.is_interpolation(strategy, "max_staleness"):
        return
    top_level_given = any(o.lstrip("+~").split("=", 1)[0] == "max_staleness" for o in overrides)
    if cfg.max_staleness == RunConf.max_staleness and not top_level_given:
        cfg.max_staleness = strategy.max_staleness
