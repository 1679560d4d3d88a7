"""Assemble the components of a run from `RunConf`: the one place that reads all of it.

Every component gets only its own sub-config (plus a few scalars); this module is
where they are handed out.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable

from rlharness.config.run import RunConf
from rlharness.model.load import text_codec
from rlharness.trainer.components import Components

log = logging.getLogger(__name__)


def validate_data(conf: RunConf, task_data: dict[str, Any]) -> None:
    """Refuse, before anything starts, data the run cannot use (names the values)."""
    from rlharness.config.schema import ConfigError

    entries = conf.task_entries()
    for name, data in task_data.items():
        label = f"tasks.{name}" if conf.tasks else f"task={conf.task.name}"
        if len(data.train) == 0:
            raise ConfigError(f"{label}: the training split is empty")
        if not data.eval and not conf.tasks:
            raise ConfigError(f"{label}: the eval split is empty")
    if conf.tasks and not any(d.eval for d in task_data.values()):
        raise ConfigError(f"no task has an eval split (tasks {', '.join(task_data)}): at least one must")
    # Without roll-over, a task's data may run out: it then leaves the mix, unless every task
    # would (the run could not reach total_steps).
    if not any(_rollover(conf, e) for e in entries.values()):
        n = sum(len(d.train) for d in task_data.values())
        if conf.batch_size * conf.total_steps > n:
            what = f"task={conf.task.name} has {n}" if not conf.tasks else f"the tasks have {n} together"
            raise ConfigError(
                f"batch_size={conf.batch_size} x total_steps={conf.total_steps} needs "
                f"{conf.batch_size * conf.total_steps} prompts but {what} and "
                f"sampler.allow_epoch_rollover=false"
            )


def check_judger_fits(name: str, task_name: str, judger_name: str, required: tuple[str, ...],
                      label: dict[str, Any], key: str) -> None:
    """A judger that needs label fields the task's rows lack cannot score that task."""
    from rlharness.config.schema import ConfigError

    missing = [k for k in required if k not in label]
    if missing:
        raise ConfigError(
            f"{key}={judger_name} cannot score task {name!r} ({task_name}): it needs label field(s) "
            f"{', '.join(missing)}, the task's rows have {', '.join(sorted(label)) or 'none'}")


def _rollover(conf: RunConf, entry) -> bool:
    return conf.sampler.allow_epoch_rollover if entry.allow_epoch_rollover is None else entry.allow_epoch_rollover


def _load_task(conf: RunConf, name: str, entry, tokenizer):
    """A task's data, prompts fitted; in a multi-task run a refusal names the task's keys
    (`tasks.<name>.task.path`, not `task.path`)."""
    from rlharness.config.schema import ConfigError
    from rlharness.data import build_task
    from rlharness.data.jsonl import DataFileError

    try:
        return fit_prompt_lengths(conf, entry, build_task(entry.task, tokenizer), tokenizer)
    except (ConfigError, DataFileError) as exc:
        if not conf.tasks:
            raise
        msg = str(exc)
        raise type(exc)(f"tasks.{name}.{msg}" if msg.startswith("task.") else f"tasks.{name}: {msg}") from exc


def fit_prompt_lengths(conf: RunConf, entry, task_data, tokenizer):
    """Prompts over `task.max_prompt_tokens` refused or dropped at load (rlharness/data/prompt_length.py)."""
    from rlharness.data.prompt_length import fit_prompts, model_positions
    from rlharness.model.load import load_model_config

    encode, _ = text_codec(tokenizer)
    response_tokens = conf.sampling_for(entry).max_tokens
    return fit_prompts(
        task_data, max_prompt_tokens=entry.task.max_prompt_tokens, policy=entry.task.long_prompts,
        positions=model_positions(load_model_config(conf.model)),
        train_response_tokens=response_tokens, eval_response_tokens=conf.eval.max_tokens or response_tokens,
        encode=encode, longest_token_chars=max(map(len, tokenizer.get_vocab()), default=1))


def build_engine_for(conf: RunConf, tokenizer, decode):
    from rlharness.engine import build_engine
    from rlharness.logging_utils.progress import phase

    if conf.engine.name == "sim":
        return build_engine(conf.engine, conf.model, conf.seed, vocab_size=len(tokenizer),
                            eos_token_id=tokenizer.eos_token_id, decode=decode)
    with phase(f"starting engine={conf.engine.name} with {conf.model.path}"):  # vLLM: ~30 s on a CPU
        return build_engine(conf.engine, conf.model, conf.seed)


def check_model_weights(conf: RunConf) -> None:
    """The model folders a run loads (the policy, PPO's critic) hold readable weights that fit their
    config.json: refused in one line naming the file, before any engine or trainer loads them."""
    from rlharness.config.schema import ConfigError
    from rlharness.model.load import resolve_model_path
    from rlharness.model.weight_files import WeightFileError, check_weights

    folders = {"model": conf.model.path}
    if conf.algo.advantage == "gae" and conf.algo.critic.path is not None:
        folders["algo.critic"] = conf.algo.critic.path
    for key, path in folders.items():
        try:
            check_weights(resolve_model_path(path, key), trust_remote_code=conf.model.trust_remote_code)
        except WeightFileError as exc:
            raise ConfigError(f"{key}.path={path!r}: {exc}") from None


def load_task_data(conf: RunConf, check_data: Callable[[RunConf, dict[str, Any]], None]):
    """(tokenizer, task data) of every task: data fitted, then `check_data`, then the prompts' token ids."""
    from rlharness.model.load import check_token_ids, load_tokenizer

    tokenizer = load_tokenizer(conf.model)
    if conf.engine.name != "sim" or conf.backend.name != "sim":  # the model is loaded: its files must fit
        check_model_weights(conf)
    entries = conf.task_entries()
    task_data = {name: _load_task(conf, name, e, tokenizer) for name, e in entries.items()}
    check_data(conf, task_data)
    encode, _ = text_codec(tokenizer)
    check_token_ids(conf.model, tokenizer, {
        f"tasks.{name}" if conf.tasks else f"task={conf.task.name}": [r.prompt_text for r in (*d.train, *d.eval)]
        for name, d in task_data.items()}, encode)
    return tokenizer, task_data


def load_tasks(conf: RunConf, loaded: tuple[Any, dict[str, Any]]):
    """(tokenizer, task data, judgers) of every task: the data (`loaded`, from `load_task_data`), then each
    judger checked against its task's rows. What training and `evaluate.py` both start from."""
    from rlharness.judger import build_judger

    tokenizer, task_data = loaded
    entries = conf.task_entries()
    judgers = {}
    try:
        for name, entry in entries.items():
            judger_conf = conf.judger_for(entry)
            judgers[name] = build_judger(judger_conf)
            rows = task_data[name].train or task_data[name].eval
            key = f"tasks.{name}.judger" if conf.tasks else "judger"
            if rows:
                check_judger_fits(name, entry.task.name, judger_conf.name, judgers[name].label_keys, rows[0].label,
                                  key)
                judgers[name].check_sample(rows[0].prompt_text, rows[0].label, conf.agent_for(entry).judge_timeout_s,
                                           key, f"the first prompt of task {name}")
    except BaseException:  # refused: the judging processes a check started go too
        import asyncio

        for judger in judgers.values():
            asyncio.run(judger.close())
        raise
    return tokenizer, task_data, judgers


def verifiable_judgers(conf: RunConf, judgers: dict[str, Any]) -> dict[str, Any]:
    """The judgers eval scores with: a task trained on a learned reward (judger=reward_model, llm, or
    a router with such a part) is evaluated by its task's own rule judger, so `eval/accuracy` stays
    the verifiable accuracy; other tasks by their training judger."""
    from rlharness.config import registry
    from rlharness.judger import build_judger
    from rlharness.judger.router import LEARNED

    out = dict(judgers)
    for name, entry in conf.task_entries().items():
        judger = conf.judger_for(entry)
        if judger.name in LEARNED or (judger.name == "router" and set(judger.weights) & set(LEARNED)):
            out[name] = build_judger(registry.schema_of("judger", entry.task.default_judger)())
    return out


def agent_loop_factory(conf: RunConf, engine, judgers: dict[str, Any], tokenizer, decode):
    """`make(task name, temperature=None, max_tokens=None)` -> that task's agent loop."""
    from rlharness.agent import build_agent_loop

    entries = conf.task_entries()

    # Text the agent loop inserts mid-response (tool output) must not get a BOS of its own.
    def agent_loop_with(name: str, temperature: float | None = None, max_tokens: int | None = None):
        agent = conf.agent_for(entries[name])
        sampling = agent.sampling
        if temperature is not None:
            sampling = replace(sampling, temperature=temperature, max_tokens=max_tokens or sampling.max_tokens)
        return build_agent_loop(replace(agent, sampling=sampling), engine, judgers[name], decode,
                                encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
                                tokenizer=tokenizer)

    return agent_loop_with


def build_evaluator(conf: RunConf, task_data: dict[str, Any], encode, agent_loop_with):
    """The run's evaluator: one task's, or every evaluated task's (`MultiTaskEvaluator`)."""
    from rlharness.trainer.evaluator import Evaluator, MultiTaskEvaluator

    entries = conf.task_entries()
    evaluators = {}
    for name, entry in entries.items():
        if not task_data[name].eval:  # a multi-task run's task without eval split: trained, not evaluated
            log.info("task %s has no eval split: it is trained, not evaluated", name)
            continue
        eval_tokens = conf.eval.max_tokens or conf.sampling_for(entry).max_tokens
        evaluators[name] = Evaluator(
            conf.eval, name, task_data[name].eval, encode,
            greedy_loop=agent_loop_with(name, temperature=0.0, max_tokens=eval_tokens),
            sampled_loop=agent_loop_with(name, conf.eval.temperature, eval_tokens) if conf.eval.n > 1 else None,
            seed=conf.seed)
    return evaluators[next(iter(evaluators))] if not conf.tasks else MultiTaskEvaluator(
        evaluators, {name: e.weight for name, e in entries.items() if name in evaluators})


# Prompts per task whose ids the teacher's tokenizer must reproduce (bounds the start-up check on big data sets).
TEACHER_CHECK_PROMPTS = 2000


def check_teachers_fit(conf: RunConf, tokenizer, task_data: dict[str, Any]) -> None:
    """Each task's distillation teacher (rlharness/teacher/checks.py): its folder, a causal LM, the student's
    vocabulary, and the student's token ids on the task's prompts. Before anything starts (the Ray actors
    of mode=disagg too): a teacher refused here costs no start-up."""
    from rlharness.teacher.checks import check_teacher_encodes_alike, check_teacher_folder, check_teacher_vocabulary

    for name, entry in conf.task_entries().items():
        teacher = conf.teacher_for(entry)
        if teacher is None:
            continue
        key = conf.teacher_key(name)
        check_teacher_folder(teacher, key)
        check_teacher_vocabulary(teacher, key, conf.model)
        label = f"tasks.{name}" if conf.tasks else f"task={conf.task.name}"
        rows = [*task_data[name].train, *task_data[name].eval][:TEACHER_CHECK_PROMPTS]
        check_teacher_encodes_alike(teacher, key, tokenizer, {label: [r.prompt_text for r in rows]})


def load_checked_data(conf: RunConf):
    """(tokenizer, task data) a run trains on, checked with what reads it (the teachers): the launcher
    calls it before Ray and its actors start, and hands the result to `build_components`."""
    loaded = load_task_data(conf, validate_data)
    check_teachers_fit(conf, *loaded)
    return loaded


def build_teachers(conf: RunConf) -> dict[str, Any]:
    """task name -> the distillation teacher that scores its groups (tasks without one are not named):
    one `Teacher` per distinct teacher configuration (checked by `check_teachers_fit`). Colocated it runs
    in this process, with mode=disagg as a Ray actor of its own."""
    from rlharness.logging_utils.progress import phase
    from rlharness.teacher import Teacher

    built: dict[str, Any] = {}  # one per conf.teacher_identity
    out = {}
    for name, entry in conf.task_entries().items():
        teacher = conf.teacher_for(entry)
        if teacher is None:
            continue
        same = conf.teacher_identity(teacher)
        if same not in built:
            with phase(f"loading the teacher {teacher.path} ({teacher.dtype}, "
                       f"{'Ray actor' if conf.mode == 'disagg' else teacher.device})"):
                built[same] = Teacher(teacher, conf.agent.sampling.temperature, on_ray=conf.mode == "disagg")
        out[name] = built[same]
    return out


def staleness_policy(conf: RunConf):
    """The run's one staleness policy, handed to the replay buffer, the strategy, the contexts
    and the manager (producer/staleness.py)."""
    from rlharness.producer.staleness import StalenessPolicy

    return StalenessPolicy(max_staleness=conf.max_staleness, sync_weights_interval=conf.sync_weights_interval,
                           mode=conf.strategy.staleness_mode,
                           task_bounds={name: e.max_staleness for name, e in conf.task_entries().items()
                                        if e.max_staleness is not None})


def build_components(conf: RunConf, remote=None, loaded=None) -> Components:
    """Build everything; the parts on Ray actors were started first (`remote`, a `RemoteParts`), the
    data loaded and checked before them (`loaded`, from `load_checked_data`; loaded here without it)."""
    from rlharness.backend import build_backend
    from rlharness.distributed.weight_channel import IN_PROCESS, build_weight_channel
    from rlharness.weights.delta import WeightEncoding
    from rlharness.logging_utils.progress import phase
    from rlharness.producer.manager import AgentLoopManager
    from rlharness.producer.strategies import build_strategy
    from rlharness.producer.replay_buffer import ReplayBuffer
    from rlharness.producer.sampler import Sampler

    tokenizer, task_data, judgers = load_tasks(conf, loaded or load_checked_data(conf))
    teachers = build_teachers(conf)
    encode, decode = text_codec(tokenizer)
    entries = conf.task_entries()
    engine, backend = (remote.engine, remote.backend) if remote is not None else (None, None)
    if engine is None:
        engine = build_engine_for(conf, tokenizer, decode)
    if backend is None:
        with phase(f"loading {conf.model.path} into backend={conf.backend.name}"):
            backend = build_backend(conf.backend, conf.model, conf.algo, conf.total_steps, conf.seed)
    weights = build_weight_channel(backend, engine, remote.weight_route if remote is not None else IN_PROCESS,
                                   conf.timeout_s, WeightEncoding(conf.model.engine_weights_dtype,
                                                                  conf.engine.sends_deltas(conf.model)))  # resolved

    staleness = staleness_policy(conf)
    replay_buffer = ReplayBuffer(staleness)
    agent_loop_with = agent_loop_factory(conf, engine, judgers, tokenizer, decode)

    tasks = {}
    for name, entry in entries.items():
        sampler_conf = replace(conf.sampler, allow_epoch_rollover=_rollover(conf, entry))
        sampler = Sampler(sampler_conf, name, task_data[name].train, encode, replay_buffer, conf.seed)
        tasks[name] = (sampler, agent_loop_with(name))
    manager = AgentLoopManager(
        tasks=tasks,
        strategy=build_strategy(conf.strategy, staleness),
        replay_buffer=replay_buffer,  # with the staleness policy
        batch_size=conf.batch_size,
        weights={name: e.weight for name, e in entries.items()},
        over_sample_thresholds={name: e.over_sample_threshold for name, e in entries.items()
                                if e.over_sample_threshold is not None},
        last_step=conf.total_steps,
        teachers=teachers,
        failed_member_policy=conf.algo.failed_member_policy,
    )
    eval_judgers = verifiable_judgers(conf, judgers)
    evaluator = build_evaluator(conf, task_data, encode, agent_loop_with if eval_judgers == judgers else
                                agent_loop_factory(conf, engine, eval_judgers, tokenizer, decode))
    return Components(tokenizer, encode, decode, task_data, judgers, engine, manager, backend, weights, evaluator,
                      {k: j for k, j in eval_judgers.items() if j is not judgers[k]}, teachers)
