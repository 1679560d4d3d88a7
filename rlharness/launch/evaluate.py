"""`evaluate.py`: a model on the tasks' held-out sets, outside training.

    python evaluate.py model.path=<HF folder>                 # any model, e.g. the base model
    python evaluate.py resume=<run dir> [eval.checkpoint_step=N]   # a run's newest (or step N) checkpoint

The same config groups as `train.py` (task=/tasks.<name>, judger, engine hf|vllm, eval.*), the
same Evaluator as training's evals; `resume=<run dir>` composes that run's own overrides (its
task, judger, agent) with the checkpoint's model and the new overrides. Output goes to a
directory of its own (Hydra's, `outputs/evaluate/<date>/<time>/`): `evals/<label>.jsonl` (every
prompt's samples, extracted answers, judgements; label `step_XXXXXXXX` or `model`),
`summary.json` and `summary.md` (accuracy, avg@n, pass@k per task). A `hydra.run.dir` holding a
training run is used only when given explicitly, and then its files go to
`<run>/evaluate-<time>/` with Hydra's under `.hydra/evaluate-<time>/`, so the run's own files
stay as they were.

Refused in one line, exit 2, nothing written: a run directory without a complete checkpoint (or
without `eval.checkpoint_step`), a folder that is not a model, a task whose eval split is empty.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlharness.config.run import RunConf
from rlharness.config.schema import ConfigError
from rlharness.launch.overrides import merge_overrides, override_key, path_override
from rlharness.core.run_dir import EVALUATE_PREFIX, HYDRA, RunDir, checkpoint_folder_of, first_missing

log = logging.getLogger("rlharness")

_NO_RUN_FLAGS = ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc")


@dataclass
class Source:
    """What is evaluated: a model folder, and the run and step it came from (if any)."""

    model_path: str
    run_dir: str | None = None
    checkpoint_step: int | None = None
    # Where under the output directory the files go ("" = in it; "evaluate-<time>" beside a run's files).
    subdir: str = ""

    @property
    def label(self) -> str:
        return "model" if self.checkpoint_step is None else f"step_{self.checkpoint_step:08d}"


@dataclass
class OutputGuard:
    """What this evaluation adds (the first directory it creates, or Hydra's files beside a run's):
    removed again when the input is refused."""

    added: list[Path]
    created: Path | None = None  # the first folder made on the way to a new output directory

    @classmethod
    def record(cls, out_dir: Path, output_subdir: str) -> OutputGuard:
        if out_dir.exists():
            return cls([p for p in (out_dir / output_subdir, RunDir(out_dir).log("evaluate")) if not p.exists()])
        return cls([out_dir], first_missing(out_dir))

    def rollback(self) -> None:
        from rlharness.launch.preflight import remove_empty_parents

        for p in self.added:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if self.added:
            remove_empty_parents(self.added[0], self.created)


def prepare_eval_argv(argv: list[str]) -> tuple[list[str], Source | None, OutputGuard | None]:
    """Check the command line before Hydra makes a directory; `resume=<run dir>` becomes that run's
    overrides plus `model.path=<its checkpoint's model>`. Returns (argv for Hydra, source, guard)."""
    from rlharness.core.checkpoint import CheckpointError
    from rlharness.export import find_checkpoint, lora_base, model_dir
    from rlharness.launch.overrides import read_run_overrides
    from rlharness.launch.devices import check_attention, check_devices
    from rlharness.launch.preflight import ConfigSource, compose_checked, compose_typed, refuse_output_path
    from rlharness.model.weight_files import check_backend_weights

    evaluate_conf = ConfigSource(config_name="evaluate")  # evaluate.py's primary config, same conf/

    args = argv[1:]
    if any(a.split("=", 1)[0] in _NO_RUN_FLAGS for a in args):
        return argv, None, None
    if any(a in ("-m", "--multirun") for a in args):
        raise ConfigError("evaluate.py runs one evaluation: -m (--multirun) is not allowed; run it once per model")
    overrides = [a for a in args if not a.startswith("-")]
    flags = [a for a in args if a.startswith("-")]
    resume = next((o.split("=", 1)[1] for o in reversed(overrides) if override_key(o) == "resume"), None)
    overrides = [o for o in overrides if override_key(o) != "resume"]
    if resume in (None, "auto", "never"):
        merged = overrides
        cfg, typed = compose_typed(merged, evaluate_conf)
        if cfg.eval.checkpoint_step is not None:
            raise ConfigError(f"eval.checkpoint_step={cfg.eval.checkpoint_step} is not allowed without "
                              f"resume=<run dir> (it picks that run's checkpoint)")
        source = Source(model_path=str(cfg.model.path))
    else:
        if any(override_key(o) in ("model.path", "model") for o in overrides):
            raise ConfigError(f"resume={resume} with model.path: pass one of them (resume=<run dir> evaluates "
                              f"that run's checkpoint; model.path=<folder> any model)")
        step = compose_checked(overrides, evaluate_conf).eval.checkpoint_step
        folder = checkpoint_folder_of(resume) if Path(resume).expanduser().is_dir() else None
        if folder is not None:  # resume=<run>/checkpoints/step_N: that run at that step
            if step is not None and step != folder[1]:
                raise ConfigError(f"resume={resume} with eval.checkpoint_step={step}: that folder is the "
                                  f"checkpoint of step {folder[1]}; pass one of them")
            step = folder[1]
        run, saved = read_run_overrides(str(folder[0]) if folder is not None else resume)
        try:
            found_step, ckpt = find_checkpoint(run, step)
            if lora_base(ckpt) is not None:
                raise CheckpointError(f"checkpoint step {found_step} holds a LoRA adapter: export the merged model "
                                      f"first (python -m rlharness.export {run} --step {found_step} <out dir>), then "
                                      f"evaluate model.path=<out dir>")
            model = model_dir(ckpt)
            check_backend_weights(ckpt / "backend")  # readable, and the weights fit config.json
        except CheckpointError as exc:  # said as the key the user typed
            raise ConfigError(f"resume={resume}: {exc}") from None
        old = [o for o in saved if override_key(o) != "model.path" and not override_key(o).startswith("hydra.")]
        merged = merge_overrides(old, overrides) + [f"model.path={model}"]
        cfg, typed = compose_typed(merged, evaluate_conf)
        source = Source(model_path=str(model), run_dir=str(run), checkpoint_step=found_step)
    check_devices(typed, training=False)  # the engine's and the judgers' (nothing trains)
    check_attention(typed, training=False)
    refuse_output_path(Path(str(cfg.hydra.run.dir)))
    out_dir = Path(str(cfg.hydra.run.dir)).expanduser().resolve()
    output_subdir = str(cfg.hydra.output_subdir)
    if RunDir(out_dir).holds_run():  # asked for explicitly (hydra.run.dir=<run>): beside the run's files, never over them
        stamp = time.strftime("%Y%m%d-%H%M%S")
        output_subdir = f"{HYDRA}/{EVALUATE_PREFIX}{stamp}"
        merged = [*merged, f"hydra.output_subdir={output_subdir}"]
        source.subdir = f"{EVALUATE_PREFIX}{stamp}"
    if not any(override_key(o) == "hydra.run.dir" for o in merged):  # Hydra's `now` must not move it
        merged = [*merged, path_override("hydra.run.dir", out_dir)]
    return [argv[0], *merged, *flags], source, OutputGuard.record(out_dir, output_subdir)


def check_eval_splits(conf: RunConf, task_data: dict[str, Any]) -> None:
    for name, data in task_data.items():
        if not data.eval:
            label = f"tasks.{name}" if conf.tasks else f"task={conf.task.name}"
            raise ConfigError(f"{label}: the eval split is empty: nothing to evaluate (task.eval_path, "
                              f"task.num_eval)")


async def _evaluate(evaluator) -> dict:
    """The evaluation, its agent loops closed in the same event loop (the gateway's server and processes)."""
    from rlharness.agent.base import close_agent_loops

    try:
        return await evaluator.evaluate()
    finally:
        await close_agent_loops(evaluator.agent_loops())


def run_evaluation(conf: RunConf, run_dir: Path, source: Source) -> dict[str, Any]:
    """Load, evaluate, write `evals/<label>.jsonl`, `summary.json`, `summary.md`. Input errors
    (ConfigError, DataFileError) are raised before anything is written."""
    from rlharness.launch.build import (agent_loop_factory, build_engine_for, build_evaluator, load_task_data,
                                        load_tasks, verifiable_judgers)
    from rlharness.launch.launcher import _close, set_threads_from_env
    from rlharness.logging_utils.progress import phase
    from rlharness.logging_utils.samples import write_eval_rows
    from rlharness.core.redaction import install_log_redaction
    from rlharness.model.load import text_codec
    from rlharness.trainer.trainer import seed_everything

    if conf.engine.name == "vllm":
        from rlharness.engine.vllm import require_vllm

        require_vllm()
    set_threads_from_env()
    install_log_redaction()
    seed_everything(conf.seed)
    with phase(f"loading the tokenizer and tasks ({', '.join(conf.task_entries())})"):
        tokenizer, task_data, trained_with = load_tasks(conf, load_task_data(conf, check_eval_splits))
        judgers = verifiable_judgers(conf, trained_with)  # a learned reward is not what accuracy is measured by
        replaced = [j for name, j in trained_with.items() if judgers[name] is not j]
        asyncio.run(_close(None, None, replaced))  # their judging processes (an llm judge's, started by its check)
    encode, decode = text_codec(tokenizer)
    engine = None
    try:
        engine = build_engine_for(conf, tokenizer, decode)
        evaluator = build_evaluator(conf, task_data, encode, agent_loop_factory(conf, engine, judgers, tokenizer,
                                                                                decode))
        n = conf.eval.n
        with phase(f"evaluating {source.model_path}: {evaluator.num_prompts} prompt(s), greedy"
                   + (f" + {n} samples at temperature {conf.eval.temperature:g}" if n > 1 else "")):
            metrics = asyncio.run(_evaluate(evaluator))
    finally:
        asyncio.run(_close(engine, None, list(judgers.values())))
    out = RunDir(run_dir / source.subdir)
    out.path.mkdir(parents=True, exist_ok=True)
    write_eval_rows(out.eval_file(source.label), evaluator.last_rows)
    summary = make_summary(conf, source, metrics, list(task_data))
    out.summary.write_text(json.dumps(summary, indent=1) + "\n")
    out.summary_md.write_text(summary_markdown(summary))
    log.info("wrote %s, %s and %s", out.eval_file(source.label), out.summary, out.summary_md)
    return summary


_KEYS = ("accuracy", "avg@n", "pass@k", "judge_failed")


def make_summary(conf: RunConf, source: Source, metrics: dict[str, float], tasks: list[str]) -> dict[str, Any]:
    per_task = {}
    for task in tasks:
        prefix = f"eval/{task}/" if conf.tasks else "eval/"
        per_task[task] = {k: metrics.get(prefix + k) for k in _KEYS}
    return {
        "model": source.model_path, "run_dir": source.run_dir, "checkpoint_step": source.checkpoint_step,
        "eval": {"num_prompts": conf.eval.num_prompts, "n": conf.eval.n, "pass_k": conf.eval.pass_k,
                 "temperature": conf.eval.temperature, "seed": conf.seed},
        "tasks": per_task,
        "mean": {k: metrics.get(f"eval/{k}") for k in _KEYS} if conf.tasks else None,
    }


def summary_markdown(summary: dict[str, Any]) -> str:
    e = summary["eval"]
    what = summary["model"] + (f" (run {summary['run_dir']}, step {summary['checkpoint_step']})"
                               if summary["run_dir"] else "")

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    lines = [f"# Evaluation of {what}", "",
             f"{e['num_prompts']} prompts per task (at most); accuracy = greedy pass@1; avg@{e['n']} and "
             f"pass@{e['pass_k']} from {e['n']} samples at temperature {e['temperature']:g}.", "",
             f"| task | accuracy | avg@{e['n']} | pass@{e['pass_k']} | judge failed |", "| --- | --- | --- | --- | --- |"]
    rows = list(summary["tasks"].items()) + ([("mean (weighted)", summary["mean"])] if summary["mean"] else [])
    for task, m in rows:
        lines.append(f"| {task} | {cell(m['accuracy'])} | {cell(m['avg@n'])} | {cell(m['pass@k'])} | "
                     f"{'-' if m['judge_failed'] is None else int(m['judge_failed'])} |")
    return "\n".join(lines) + "\n"
