"""What `train.py` checks before Hydra creates or touches a run directory.

Hydra makes the run directory (and writes `.hydra/` and `train.log` into it) before the
task function runs, so anything refused there would leave a new directory behind or
change an existing run. `preflight(argv)` composes the same config first and refuses,
with one line naming key, value and what is allowed. Every entry form goes through the
same checks: the command line is parsed by Hydra's own parser, and the config is composed
from the same search path Hydra builds (`--config-dir`, `--config-name`, `--config-path`).

- a config that does not compose or validate (unknown keys, `+algo.lrr=...` typos
  included, bad values, impossible combinations), every point of a `-m` sweep;
- `cluster=slurm` without `-m` (hydra-submitit-launcher only launches multiruns), and a
  `cluster=slurm` request the partition can never hold (more nodes, GPUs or CPUs per node
  than it has: `rlharness.launch.slurm_capacity`, asked through sinfo);
- Ray actors that do not fit the cluster config (`check_placement`: `cluster.num_cpus`, or a
  Slurm node's CPUs and GPUs) and reasoning-gym datasets or dataset keys the installed
  reasoning-gym does not have (`check_task_datasets`), vLLM missing from this Python where a run uses it
  (`check_vllm`), a CUDA device this machine does not have or an attention implementation a model
  cannot run on its device (`rlharness.launch.devices`), `logger.mode=online` without W&B credentials
  (all through `check_installed`);
- the model folder (`check_model`): missing, a GGUF file, code of its own (`auto_map`) without
  `model.trust_remote_code=true`, no chat template while a task's `apply_chat_template=true`;
- a JSONL/Parquet task's `path` or `eval_path` (`check_task_files`): no such file, or a type it does not
  read (the rows are checked as the job loads them, before anything is trained);
- agents (`check_agent_entrypoints`): a gateway agent's program, and the python tool's needs (a chat
  model, and a sandbox this machine can run: bubblewrap and user namespaces, or the weaker mode);
- `resume=never` into a directory that holds a run;
- any start in a directory that holds a run (`hydra.run.dir=<run>`) is a resume: it is
  rewritten exactly as `resume=<dir>` and passes the same checks (model/task/seed fixed,
  `.hydra/` kept, the new config saved under `.hydra/resumed-<time>/`); a fixed key is
  compared by value with the run's first `.hydra/config.yaml`, so an edited experiment
  file or another `--config-dir` cannot change it either;
- `-m` with `resume=<dir>` (a sweep continues by running the same command again);
- a directory another live process holds (`rlharness.launch.run_lock`, taken here, before Hydra
  writes anything, and held until the process ends);
- a resume with nothing left to train (`total_steps` at or below the checkpoint's step)
  ends here with one line (`Finished`).

`RunDirGuard` covers what can only be found once the job runs (a data file, a
tokenizer, a checkpoint file): it puts the directory back as it was (a new directory is
removed; in an existing run the new `.hydra/resumed-*` and the appended log are undone).
"""

from __future__ import annotations

import difflib
import os
import shutil
import sys
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from rlharness.launch import run_lock
from rlharness.config.run import adopt_strategy_max_staleness
from rlharness.config.schema import ConfigError, JsonlTaskConf, LocalRayClusterConf, ReasoningGymTaskConf
from rlharness.launch.slurm_capacity import check_capacity
from rlharness.distributed.placement_plan import check_fits
from rlharness.launch.overrides import FROZEN_ON_RESUME, override_key, override_value, path_override, prepare_resume_argv
from rlharness.core.run_dir import HYDRA, HYDRA_YAML, RESUMED_PREFIX, RunDir, first_missing, output_path_problem

# Hydra's flags after which it does not run the job (help, printing the config, completion,
# a rerun of a pickled config): nothing is checked, `resume=<dir>` is still rewritten.
_NO_RUN = ("help", "hydra_help", "cfg", "info", "shell_completion", "experimental_rerun")
# More sweep points than this are not each composed up front (each costs ~0.1 s).
MAX_SWEEP_POINTS_CHECKED = 64
TRAIN_PY = Path(__file__).resolve().parents[2] / "train.py"


class Finished(Exception):
    """Nothing to do (a resumed run is already at its total_steps); the message says so."""


class Explained(Exception):
    """`explain=true`: the message is what the config means per step (rlharness/launch/explain.py); nothing starts."""


@dataclass(frozen=True)
class ConfigSource:
    """Where Hydra composes the config from: train.py's `conf/` (or `--config-path`), the primary
    config (`--config-name`), and an extra directory searched first (`--config-dir`)."""

    config_path: str = "conf"
    config_name: str = "config"
    config_dir: str | None = None


def parse_command_line(args: list[str]):
    """Hydra's own parser (flags and their values apart from the overrides). Flags may come after
    overrides (Hydra's argv is rebuilt flags first); a bad flag is one ConfigError line."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def refuse(message: str):
        raise ConfigError(f"{' '.join(args)}: {message} (see python train.py --help)")

    parser.error = refuse  # type: ignore[method-assign]
    return parser.parse_intermixed_args(args)


def hydra_argv(argv0: str, ns, overrides: list[str]) -> list[str]:
    """The command line for Hydra: the parsed flags as `--flag=value`, then the overrides."""
    out = [argv0]
    for attr, flag in (("help", "--help"), ("hydra_help", "--hydra-help"), ("resolve", "--resolve"),
                       ("run", "--run"), ("multirun", "--multirun"), ("shell_completion", "--shell-completion")):
        if getattr(ns, attr):
            out.append(flag)
    for attr, flag in (("cfg", "--cfg"), ("package", "--package"), ("info", "--info"),
                       ("config_path", "--config-path"), ("config_name", "--config-name"),
                       ("config_dir", "--config-dir"), ("experimental_rerun", "--experimental-rerun")):
        if getattr(ns, attr) is not None:
            out.append(f"{flag}={getattr(ns, attr)}")
    return out + list(overrides)


def preflight(argv: list[str]) -> tuple[list[str], list[str], RunDirGuard | None]:
    """Check the command line; returns (argv for Hydra, overrides applied on resume, guard).

    Every entry form goes through here: plain, `--config-dir`/`-cd`, `--config-name`/`-cn`,
    `--config-path`/`-cp`, `-m`/`--multirun`, `hydra.run.dir=`, `resume=`."""

    ns = parse_command_line(argv[1:])
    if ns.config_dir is not None:
        ns.config_dir = os.path.abspath(ns.config_dir)  # as Hydra does; the same on resume from elsewhere
        if not os.path.isdir(ns.config_dir):
            raise ConfigError(f"--config-dir={ns.config_dir} is not allowed: no such directory")
    overrides = list(ns.overrides)
    if any(getattr(ns, a) for a in _NO_RUN):
        new_argv, applied = prepare_resume_argv([argv[0], *overrides])
        return hydra_argv(argv[0], ns, new_argv[1:]), applied, None
    explicit_resume = _resume_target(overrides)
    if explicit_resume is not None:
        _adopt_saved_source(ns, explicit_resume)
    source = ConfigSource(ns.config_path or "conf", ns.config_name or "config", ns.config_dir)
    if ns.multirun:
        return _preflight_multirun(argv[0], ns, overrides, source)

    applied: list[str] = []
    given_dir = next((override_value(o) for o in reversed(overrides) if override_key(o) == "hydra.run.dir"), None)
    if explicit_resume is not None:
        new_argv, applied = prepare_resume_argv([argv[0], *overrides])
        overrides = new_argv[1:]
        run_dir = explicit_resume
    else:
        # The run directory without composing when it is given: a start in a run's directory is a
        # resume, and overrides of keys of that run's experiment only compose once merged with its own.
        run_dir = Path(given_dir if given_dir is not None else str(compose_checked(overrides, source).hydra.run.dir))
        refuse_output_path(run_dir)
        run_dir = run_dir.expanduser().resolve()
        never = any(override_key(o) == "resume" and o.split("=", 1)[1] == "never" for o in overrides)
        holds_run = RunDir(run_dir).holds_run()
        if never and holds_run:
            raise ConfigError(f"resume=never with hydra.run.dir={run_dir} is not allowed: that directory holds "
                              f"a run; choose a new directory (or remove that run yourself)")
        if holds_run and given_dir is None:
            raise ConfigError(f"hydra.run.dir={run_dir} is not allowed: the default directory of this start "
                              f"already holds a run (another run started in the same second?); start again, or "
                              f"pass resume=<that run> to continue it")
        if holds_run:
            # Starting in a run's directory is a resume, whatever route led there.
            _adopt_saved_source(ns, run_dir)
            source = ConfigSource(ns.config_path or "conf", ns.config_name or "config", ns.config_dir)
            rest = [o for o in overrides if override_key(o) not in ("hydra.run.dir", "resume")]
            new_argv, applied = prepare_resume_argv([argv[0], f"resume={run_dir}", *rest], require_checkpoint=False)
            print(f"note: hydra.run.dir={run_dir} holds a run: continuing it as resume={run_dir}", file=sys.stderr)
            overrides = new_argv[1:]
            explicit_resume = run_dir
        elif given_dir is None:
            overrides = [*overrides, path_override("hydra.run.dir", run_dir)]  # Hydra's `now` must not move it
    cfg, conf = compose_typed(overrides, source)
    if conf.explain:  # before anything is checked against the machine or written
        raise Explained(explain_text(conf))
    check_installed(conf)
    if cfg.cluster.name == "slurm":
        raise ConfigError("cluster=slurm without -m is not allowed: Slurm jobs are submitted by "
                          "hydra-submitit-launcher, which Hydra runs only for -m (--multirun); use "
                          "`python train.py -m cluster=slurm ...` (one job per sweep point)")
    if explicit_resume is not None:
        check_fixed_values(run_dir, cfg)
    _refuse_if_finished(run_dir, cfg.total_steps)
    check_model(conf)
    check_task_files(conf)
    check_agent_entrypoints(conf)
    # Hydra names the job (and its log file) after the script.
    guard = RunDirGuard.record(run_dir, str(cfg.hydra.output_subdir), Path(argv[0]).stem)
    run_lock.acquire(run_dir)  # before Hydra writes anything there; held until this process ends
    return hydra_argv(argv[0], ns, overrides), applied, guard


def explain_text(conf) -> str:
    from rlharness.launch.explain import explain

    return explain(conf).text()


def refuse_output_path(run_dir: Path) -> None:
    """A run directory that cannot be one (a file, a dangling symbolic link, a folder not writable), refused
    before Hydra tries to make it."""
    problem = output_path_problem(run_dir)
    if problem is not None:
        raise ConfigError(f"hydra.run.dir={run_dir} is not allowed: {problem}; choose another directory")


def _resume_target(overrides: list[str]) -> Path | None:
    values = [override_value(o) for o in overrides if override_key(o) == "resume"]
    if not values or values[-1] in ("auto", "never"):
        return None
    return Path(values[-1]).expanduser().resolve()


def _adopt_saved_source(ns, run_dir: Path) -> None:
    """A resume composes from where the run was composed: its `--config-name` and `--config-dir`
    (from its newest life's `hydra.yaml`) unless given again; another primary config is refused."""
    import yaml

    try:
        saved = (yaml.safe_load((RunDir(run_dir).newest_hydra() / HYDRA_YAML).read_text()) or {}).get("hydra", {})
    except (OSError, yaml.YAMLError):
        return  # prepare_resume_argv says what is wrong with the directory
    name = (saved.get("job") or {}).get("config_name")
    if name and ns.config_name is not None and ns.config_name != name:
        raise ConfigError(f"--config-name={ns.config_name} is not allowed: the run in {run_dir} was composed "
                          f"from config {name!r}, and its primary config is fixed for a run")
    if name and name != "config" and ns.config_name is None:
        ns.config_name = name
    sources = (saved.get("runtime") or {}).get("config_sources") or []
    extra = next((s.get("path") for s in sources if s.get("provider") == "command-line"), None)
    if extra and ns.config_dir is None:
        if not os.path.isdir(extra):
            raise ConfigError(f"the run in {run_dir} was composed with --config-dir={extra}, which no longer "
                              f"exists: pass --config-dir=<where those files are now>")
        ns.config_dir = extra
        print(f"note: composing with the run's --config-dir={extra}", file=sys.stderr)


def _preflight_multirun(argv0: str, ns, overrides: list[str], source: ConfigSource):

    new_argv, applied = prepare_resume_argv([argv0, *overrides])
    overrides = new_argv[1:]
    points = sweep_points(overrides)
    if applied or _resume_target(ns.overrides) is not None:
        raise ConfigError("-m with resume=<run dir> is not allowed: a sweep starts new runs; continue a run "
                          "without -m (python train.py resume=<run dir>)")
    asked: set[tuple] = set()
    checked: set[tuple] = set()
    explained = []
    for point in points[:MAX_SWEEP_POINTS_CHECKED]:
        cfg, conf = compose_typed(point, source)
        if conf.explain:
            explained.append(f"== sweep point {len(explained)}: {' '.join(point)}\n{explain_text(conf)}")
            continue
        check_installed(conf)
        if cfg.cluster.name != "slurm":  # a Slurm job's model.path may be on its nodes' file systems only
            check_model(conf, checked)
            check_task_files(conf)
        check_agent_entrypoints(conf, with_model=cfg.cluster.name != "slurm")
        if cfg.cluster.name == "slurm":
            c = cfg.cluster
            request = (c.partition, c.nodes, c.gpus_per_node, c.cpus_per_task, c.constraint)
            if request not in asked:  # one sinfo per distinct request
                asked.add(request)
                check_capacity(c)
    if explained:
        raise Explained("\n\n".join(explained))
    # A sweep into a directory that holds its runs is allowed: the same command run again resumes each
    # point in its own directory (resume=auto; docs/how-to/slurm.md), as a preempted Slurm sweep is continued.
    return hydra_argv(argv0, ns, overrides), applied, None


def check_installed(conf) -> None:
    """What a config asks of the installed packages and this machine, refused before work starts: vLLM
    where an engine or a judge runs on it (`check_vllm`), its models' devices and attention
    implementations (`rlharness.launch.devices`), where its Ray actors go (`check_placement`), the
    reasoning-gym datasets its tasks name and W&B credentials for logger.mode=online. Not part of RunConf:
    config validity must not depend on an installed package or this machine. `launcher.run` asks again
    (jobs that skip this preflight, and a Slurm job on its node)."""
    from rlharness.launch.devices import check_attention, check_devices
    from rlharness.logging_utils.wandb_logger import check_credentials

    check_vllm(conf)
    check_devices(conf)
    check_placement(conf)
    check_task_datasets(conf)
    check_attention(conf)
    check_credentials(conf.logger)


def check_vllm(conf) -> None:
    """vLLM is installed in this Python where the engine or a judge runs on it: else one line naming the setting,
    which Python to run instead and how to set it up."""
    from rlharness.judger import learned_judgers

    on_vllm = (["engine=vllm"] if conf.engine.name == "vllm" else []) + [
        f"{key}.engine=vllm" for key, judge in learned_judgers(conf) if getattr(judge, "engine", None) == "vllm"]
    if on_vllm:
        from rlharness.engine.vllm import require_vllm

        require_vllm(on_vllm[0])


def check_task_datasets(conf) -> None:
    """Each reasoning-gym task names a dataset of the installed reasoning-gym, with keys and values it takes."""
    from rlharness.data.reasoning_gym import check_dataset

    for name, entry in conf.task_entries().items():
        if isinstance(entry.task, ReasoningGymTaskConf):
            check_dataset(entry.task.dataset, entry.task.dataset_config, conf.task_key(name),
                          entry.task.probe_timeout_s)


def check_task_files(conf) -> None:
    """Each file-backed task's data file (and held-out file) is there and of a type it reads; its rows are
    checked when the job loads them. Not for Slurm: a job's data may be on its nodes' file systems only."""
    from rlharness.data.jsonl import data_files

    for name, entry in conf.task_entries().items():
        if isinstance(entry.task, JsonlTaskConf):
            for field in ("path", "eval_path"):
                if getattr(entry.task, field):
                    data_files(getattr(entry.task, field), f"{conf.task_key(name)}.{field}")


def check_placement(conf) -> None:
    """The run's Ray actors fit what its cluster config gives them: `cluster.num_cpus` on this machine
    (cluster=local_ray), each node's CPUs and GPUs on Slurm (`placement_plan.check_fits`). Not part of
    RunConf: where a vLLM engine runs is decided by the installed vLLM build, and config validity must
    not depend on an installed package."""
    cluster = conf.cluster
    if conf.mode == "disagg" and isinstance(cluster, LocalRayClusterConf):
        workers = conf.backend.workers
        # Each distinct teacher is an actor of its own, with teacher.num_cpus reserved.
        teacher_cpus = sum(t.num_cpus for t in conf.distinct_teachers().values())
        need = conf.engine.num_engines * cluster.engine_cpus + workers * cluster.trainer_cpus + teacher_cpus
        if need > cluster.num_cpus:
            raise ConfigError(
                f"mode=disagg needs {need:g} CPUs for {conf.engine.num_engines} engine(s) x "
                f"cluster.engine_cpus={cluster.engine_cpus:g} + {workers} training worker(s) x "
                f"cluster.trainer_cpus={cluster.trainer_cpus:g}"
                + (f" + the teacher's algo.teacher.num_cpus={teacher_cpus:g}" if teacher_cpus else "")
                + f", but cluster.num_cpus={cluster.num_cpus}")
    check_fits(conf)


def check_fixed_values(run_dir: Path, cfg) -> None:
    """Refuse a resume whose composed config changes a fixed key, however it changed (an override,
    an edited experiment file, another `--config-dir`): the run's first `.hydra/config.yaml` decides."""
    from omegaconf import OmegaConf


    saved_path = RunDir(run_dir).config
    if not saved_path.is_file():
        return
    saved = OmegaConf.load(saved_path)
    absent = object()  # a key one side lacks (another version of the code), unlike one set to null
    for key in FROZEN_ON_RESUME:
        old, new = OmegaConf.select(saved, key, default=absent), OmegaConf.select(cfg, key, default=absent)
        if old is absent or new is absent:
            continue
        for path, was, now in _differences(_plain(old), _plain(new), key):
            raise ConfigError(f"{path}={now!r} is not allowed on resume: the run in {run_dir} has {path}={was!r} "
                              f"and {key} is fixed for a run (start a new run instead)")


def _plain(node):
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(node, resolve=False) if isinstance(node, (DictConfig, ListConfig)) else node


def _differences(old, new, prefix: str):
    """(key, old, new) where both sides have the key and differ (a key only one side has is a default
    added or removed by another version of the code, not a change of the run)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in old.keys() & new.keys():
            yield from _differences(old[k], new[k], f"{prefix}.{k}")
    elif old != new:
        yield prefix, old, new


def _refuse_if_finished(run_dir: Path, total_steps: int) -> None:
    from rlharness.core.checkpoint import latest_checkpoint

    found = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if found is not None and found[0] >= total_steps:
        raise Finished(f"{run_dir} is already at step {found[0]} (total_steps={total_steps}): nothing to train; "
                       f"pass total_steps=N with N > {found[0]} to extend it")


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """Every point of a `-m` sweep (Hydra's basic sweeper's expansion), or the overrides as one point
    when the sweep syntax is one only another sweeper understands."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        return BasicSweeper.split_arguments(parsed, None)[0]
    except HydraException:
        return []


def compose_checked(overrides: list[str], source: ConfigSource = ConfigSource()):
    """Compose and validate like the job will; every failure is one ConfigError line."""
    return compose_typed(overrides, source)[0]


def compose_typed(overrides: list[str], source: ConfigSource = ConfigSource()):
    """(composed config with `hydra`, the typed RunConf) as the job will have them (the same search
    path as Hydra builds for train.py, `--config-dir` included); failures as one ConfigError line."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from rlharness.config.store import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        search_path = create_automatic_config_search_path(str(TRAIN_PY), None, source.config_path)
        if source.config_dir is not None:
            search_path.prepend(provider="command-line", path=f"file://{source.config_dir}",
                                anchor=SearchPathQuery(provider="schema"))
        hydra = Hydra.create_main_hydra2(task_name=TRAIN_PY.stem, config_search_path=search_path)
        cfg = hydra.compose_config(source.config_name, list(overrides), run_mode=RunMode.RUN,
                                   with_log_configuration=False)
        job = cfg.copy()
        with open_dict(job):
            del job["hydra"]
        check_known_keys(job)
        job.run_dir = "preflight"
        adopt_strategy_max_staleness(job, overrides)  # as train.py
        conf = OmegaConf.to_object(job)  # the schemas' __post_init__ checks
        refuse_parts_no_task_uses(conf, overrides)
        if conf.model.lora.enabled:  # its targets exist in model.path (reads the model's layout)
            from rlharness.model.lora import check_model_conf

            check_model_conf(conf.model)
    except ConfigError as exc:
        raise nested_judger_key(exc, job) from None
    except (HydraException, OmegaConfBaseException, ValueError, TypeError) as exc:
        raise ConfigError(one_line(exc, list(overrides))) from None
    finally:
        GlobalHydra.instance().clear()
    return cfg, conf


def refuse_parts_no_task_uses(conf, overrides: list[str]) -> None:
    """With several tasks (`tasks.<name>`) each task has its own task config and judger: a run-level
    `task=` or `judger=` (or a key under them) would be silently ignored, so it is refused."""
    if not conf.tasks:
        return
    experiment = next((override_value(o) for o in reversed(overrides) if override_key(o) == "experiment"), None)
    source = f" (from experiment={experiment})" if experiment else ""
    for o in overrides:
        part = override_key(o).split(".", 1)[0]
        if part in ("task", "judger"):
            raise ConfigError(
                f"{o} is not allowed: this run has several tasks{source}, {', '.join(conf.tasks)}, each with its own "
                f"task and judger, so a run-level {part} applies to none of them; set it per task: "
                f"{part}@tasks.<name>.{part}=<option> or tasks.<name>.{part}.<key>=<value>")


def nested_judger_key(exc: ConfigError, job) -> ConfigError:
    """A judger's conf names its keys `judger.<field>` (it knows only its group's name); one nested under
    judger=router (judger.reward_model, judger.llm) or a task (tasks.<name>.judger) gets the whole key:
    the nested config that refuses the same value on its own is the one named."""
    from omegaconf import DictConfig, OmegaConf

    message = str(exc)
    if not message.startswith("judger."):
        return exc
    tasks = OmegaConf.select(job, "tasks") or {}
    for judger in [f"tasks.{name}.judger" for name in tasks] + ["judger"]:
        for path in (f"{judger}.reward_model", f"{judger}.llm", judger):
            node = OmegaConf.select(job, path)
            if path == "judger" or not isinstance(node, DictConfig):
                continue
            try:
                OmegaConf.to_object(node)
            except ConfigError as inner:
                if str(inner) == message:
                    return ConfigError(path + message[len("judger"):])
    return exc


def check_model(conf, checked: set[tuple] | None = None) -> None:
    """The model folder before the job loads it (rlharness/model/load.py): there, no GGUF file, no code of
    its own without model.trust_remote_code, and a chat template where a task asks for one.
    `checked`: what a sweep's earlier points already passed (each distinct model is checked once)."""
    from rlharness.judger import check_learned_judgers
    from rlharness.model.load import check_model_files, load_tokenizer, require_chat_template

    check_learned_judgers(conf)  # cheap (config.json and tensor names): every sweep point
    check_teachers(conf)
    asking = [f"{conf.task_key(name)}.apply_chat_template" for name, entry in conf.task_entries().items()
              if getattr(entry.task, "apply_chat_template", None) is True]  # tasks that render chat prompts
    key = (conf.model.path, conf.model.trust_remote_code, bool(asking),
           conf.algo.critic.path if conf.algo.advantage == "gae" else None)
    if checked is not None and key in checked:
        return
    check_model_files(conf.model)
    if conf.algo.advantage == "gae" and conf.algo.critic.path is not None:  # the critic's own folder
        from dataclasses import replace

        # Loaded with the policy's settings (backend/critic.py): model.trust_remote_code applies.
        check_model_files(replace(conf.model, path=conf.algo.critic.path), "algo.critic", "model.trust_remote_code")
        check_critic_tokenizer(conf)
    if asking:
        require_chat_template(load_tokenizer(conf.model), asking[0], conf.model.path)
    if checked is not None:
        checked.add(key)


def check_teachers(conf) -> None:
    """Each task's distillation teacher folder (rlharness/teacher/checks.py): there, no GGUF file, no code of
    its own without trust_remote_code, a causal LM, the student's vocabulary. Its encoding of the task's text
    is compared with the student's once the job has loaded the data, before anything starts
    (rlharness/launch/build.py: load_checked_data)."""
    from rlharness.teacher.checks import check_teacher_folder, check_teacher_vocabulary

    for name, entry in conf.task_entries().items():
        teacher = conf.teacher_for(entry)
        if teacher is not None:
            check_teacher_folder(teacher, conf.teacher_key(name))
            check_teacher_vocabulary(teacher, conf.teacher_key(name), conf.model)


def check_critic_tokenizer(conf) -> None:
    """PPO's critic reads the policy's token ids: a critic folder whose tokenizer gives ids other meanings
    (or whose embedding lacks rows for them) would learn values of other tokens, or crash at step 1."""
    from rlharness.model.load import resolve_model_path
    from rlharness.model.tokenizer_match import tokenizer_differences

    policy = resolve_model_path(conf.model.path)
    critic = resolve_model_path(conf.algo.critic.path, "algo.critic")
    differences = tokenizer_differences(policy, critic, trust_remote_code=conf.model.trust_remote_code)
    if differences:
        raise ConfigError(
            f"algo.critic.path={conf.algo.critic.path!r} is not allowed with model.path={conf.model.path!r}: the "
            f"critic reads the policy's token ids, but their tokenizers differ ({'; '.join(differences[:3])}); use a "
            f"critic of the policy's model family (the same tokenizer), or leave algo.critic.path unset (the "
            f"policy's checkpoint)")


def check_agent_entrypoints(conf, with_model: bool = True) -> None:
    """`agent=openai_gateway`: the agent program imports and is callable (rlharness/agent/entrypoint.py), and
    (`with_model`: the model folder is readable here) the model has a chat template. `agent.tools=[python]`:
    a chat model too (the tool is for models that write programs in a chat turn), and a sandbox this
    machine can run (`rlharness.sandbox.check_available`: bubblewrap, user namespaces)."""
    from rlharness.agent.entrypoint import load_entrypoint
    from rlharness.model.load import load_tokenizer
    from rlharness.sandbox import SandboxUnavailable, check_available

    for name, entry in conf.task_entries().items():
        agent = conf.agent_for(entry)
        key = f"tasks.{name}.agent" if conf.tasks else "agent"
        if agent.name == "openai_gateway":
            load_entrypoint(agent.entrypoint, f"{key}.entrypoint")
            if with_model and not getattr(load_tokenizer(conf.model), "chat_template", None):  # it renders messages
                raise ConfigError(f"{key}=openai_gateway is not allowed with model.path={conf.model.path!r}: "
                                  f"its tokenizer has no chat template to render the agent's messages")
        if agent.name == "multi_turn_tool" and "python" in agent.tools and with_model:  # (on this machine)
            if not getattr(load_tokenizer(conf.model), "chat_template", None):
                raise ConfigError(f"{key}.tools={list(agent.tools)} is not allowed with "
                                  f"model.path={conf.model.path!r}: its tokenizer has no chat template (the python "
                                  f"tool is for chat models that write programs in their turn; e.g. model=tiny_code)")
            try:
                check_available(agent.sandbox)
            except SandboxUnavailable as exc:
                raise ConfigError(str(exc).replace("agent.sandbox.", f"{key}.sandbox.")) from None


def check_known_keys(cfg) -> None:
    """Refuse keys a schema does not have (`+algo.lrr=1e-6` adds one; OmegaConf would keep it)."""
    from omegaconf import DictConfig, OmegaConf

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, DictConfig):
            return
        schema = OmegaConf.get_type(node)
        allowed = {f.name for f in fields(schema)} if schema is not None and is_dataclass(schema) else None
        for key in node.keys():
            path = f"{prefix}{key}"
            if allowed is not None and key not in allowed:
                close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
                value = OmegaConf.to_container(node, resolve=False).get(key)
                raise ConfigError(f"{path}={value!r} is not allowed: {schema.__name__} has no key {key!r}"
                                  + (f" (did you mean {prefix}{close[0]}?)" if close else
                                     f"; its keys are {', '.join(sorted(allowed))}"))
            walk(node._get_node(key), path + ".")

    walk(cfg, "")


# Characters Hydra's override grammar reads as syntax when a value is not quoted.
HYDRA_SPECIAL_CHARS = "()[]{},:=\\'\" "


def one_line(exc: BaseException, overrides: list[str]) -> str:
    """Hydra/OmegaConf errors span lines and hide the cause: say key, value and what is allowed."""
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    cause_line = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
    if isinstance(exc, OverrideParseException):
        for o in overrides:
            try:
                OverridesParser.create().parse_overrides([o])
            except OverrideParseException as bad:
                key, eq, value = o.partition("=")
                special = [c if c != " " else "a space" for c in HYDRA_SPECIAL_CHARS if c in value]
                hint = (f"; Hydra reads {' '.join(special)} in a value as syntax: quote the value, as in "
                        f"\"{key}='...'\" (shell double quotes around Hydra's single quotes)" if eq and special
                        else " (expected key=value)")
                return f"{o!r} is not a valid override: {str(bad).splitlines()[0]}{hint}"
    appended = re.search(r"Could not append to config. An item is already at '([^']+)'", text)
    if appended:
        key = appended.group(1)
        value = next((override_value(o) for o in overrides if override_key(o) == key), "?")
        return (f"+{key}={value} is not allowed: the config already has {key}; set it without the '+' "
                f"({key}={value}), which '+' is for adding a key the config does not have")
    missing = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    if missing:
        group, option = missing.groups()
        options = re.findall(r"^\t(\S+)$", text.split(f"Available options in '{group}':", 1)[-1], re.M)
        return f"{group}={option} is not allowed: expected one of {', '.join(options) or '(none found)'}"
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown:
        key = unknown.group(1)
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key), "?")
        where, _, name = key.rpartition(".")
        schema = re.search(r"object_type=(\w+)", str(cause)) if cause is not None else None
        cls = getattr(_schema_module(), schema.group(1), None) if schema else None
        if cls is not None and is_dataclass(cls):
            allowed = sorted(f.name for f in fields(cls))
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f"did you mean {where + '.' if where else ''}{close[0]}?" if close else f"its keys are {', '.join(allowed)}"
            return f"{key}={value} is not allowed: {cls.__name__} has no key {name!r} ({hint})"
        return f"{key}={value} is not allowed: no such key"
    dotted = re.search(r"full_key: tasks\.([^.\s)]+)\.([^.\s)]+)", text)
    schema_module = _schema_module()
    if dotted and dotted.group(2) not in {f.name for f in fields(schema_module.TaskEntryConf)}:
        name = f"{dotted.group(1)}.{dotted.group(2)}"
        return (f"tasks.{name}: a task name cannot contain '.' (task names may use only "
                f"{schema_module.TASK_NAME_CHARS})")
    composing = re.search(r"In '([^'/]+)/([^']+)': ConfigKeyError raised while composing config", text)
    full_key = re.search(r"full_key: (\S+)", text)
    if composing and full_key:
        return option_sets_missing_key(*composing.groups(), full_key.group(1), str(cause), overrides)
    merging = re.search(r"Error merging override (\S+)", text)
    if merging:
        return f"{merging.group(1)} is not allowed: {cause_line or text}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(exc).__name__
    key = next((ln for ln in lines[1:] if ln.startswith("full_key:")), None)
    return f"{head} ({key})" if key else head


def option_sets_missing_key(group: str, option: str, key: str, cause: str, overrides: list[str]) -> str:
    """The line for a config file (an experiment, most often) that sets a key the chosen option of
    another group does not have: `experiment=chat_math judger=reward_model` while chat_math sets a math
    judger's key. Names the file, the key, the option and what to do."""
    import re

    part = key.split(".", 1)[0]
    chosen = next((override_value(o) for o in reversed(overrides) if override_key(o) == part), None)
    schema = re.search(r"object_type=(\w+)", cause)
    what = f"{part}={chosen}" if chosen else f"the chosen {part}"
    if schema:
        what += f" ({schema.group(1)})"
    if group == "experiment" and chosen:
        todo = (f"experiment={option} was made for its own {part}: leave out {part}={chosen} to keep it, or start "
                f"without the experiment and give its other settings yourself (conf/experiment/{option}.yaml)")
    else:
        todo = f"check the key in {group}/{option}.yaml, or choose a {part} that has it"
    return f"{group}={option} sets {key}, which {what} does not have: {todo}"


def _schema_module():
    from rlharness.config import schema

    return schema


def remove_empty_parents(path: Path, top: Path | None) -> None:
    """Remove the folders above `path` up to `top` (a start created them) while they are empty: another
    start may have put its own run there meanwhile, which stays."""
    if top is None:
        return
    for parent in path.parents:
        if not (parent == top or top in parent.parents):
            break
        try:
            parent.rmdir()
        except OSError:  # not empty (or gone): leave it and everything above
            break


@dataclass
class RunDirGuard:
    """What this start may add to a run directory, so a refused start can take it back."""

    run_dir: Path
    existed: bool
    output_subdir: str
    log_name: str
    log_size: int | None
    lock_bytes: bytes | None = None  # the lock file as it was (it names the last holder's PID)
    # The first folder this start creates on the way to run_dir (Hydra makes outputs/<date>/<time>).
    created: Path | None = None

    @classmethod
    def record(cls, run_dir: Path, output_subdir: str, job_name: str) -> RunDirGuard:
        log, lock = RunDir(run_dir).log(job_name), RunDir(run_dir).lock
        return cls(run_dir, run_dir.exists(), output_subdir, log.name,
                   log.stat().st_size if log.is_file() else None,
                   lock.read_bytes() if lock.is_file() else None, first_missing(run_dir))

    def rollback(self) -> None:
        """Undo this start's traces: the folders it created go (outputs/<date>/ too, when this start
        made it); an existing run is left as it was."""
        if not self.existed:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            remove_empty_parents(self.run_dir, self.created)
            return
        if self.output_subdir.startswith(f"{HYDRA}/{RESUMED_PREFIX}"):
            shutil.rmtree(self.run_dir / self.output_subdir, ignore_errors=True)
        log = self.run_dir / self.log_name
        if self.log_size is None:
            log.unlink(missing_ok=True)
        elif log.is_file():
            with open(log, "r+b") as fh:
                fh.truncate(self.log_size)
        lock = RunDir(self.run_dir).lock
        if self.lock_bytes is None:
            lock.unlink(missing_ok=True)
        else:  # in place: the lock stays held (on this open file) until the process ends
            with open(lock, "r+b") as fh:
                fh.write(self.lock_bytes)
                fh.truncate()
