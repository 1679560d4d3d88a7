"""Where a run's models go, checked before it starts: each device exists on the machine that runs the
job, and each model's attention implementation is one transformers has and can run there.

Without these checks a CPU machine given `backend.device=cuda` ended a started run with torch's
"not compiled with CUDA" traceback, or, with Ray actors asking for GPUs the machine does not have, waited
`timeout_s` for a placement that could never come. A Slurm job's devices are checked on its node, when
the job starts (`launcher.run`), not on the host that submits it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlharness.config.schema import ConfigError, LocalRayClusterConf, SlurmClusterConf


@dataclass(frozen=True)
class Placed:
    """A model of the run on a device: `device_key`'s value, with `attention_key`'s attention (None: one
    that no attention key sets), training (backward passes) and/or decoding with a KV cache, with code of
    its own (`trust_remote_code`: that code may register the attention it names when it loads)."""

    device_key: str
    device: str
    attention_key: str | None = None
    attention: str | None = None
    trains: bool = False
    generates: bool = False
    remote_code: bool = False


def placed_models(conf, training: bool = True) -> list[Placed]:
    """The policy (and its reference) on the trainer, the hf engine, each teacher and each learned judger;
    `training=False` (evaluate.py): the engine and the judgers."""
    from rlharness.judger import learned_judgers

    model = conf.model
    placed = []
    if training and hasattr(conf.backend, "device"):  # not backend=sim
        placed.append(Placed("backend.device", conf.backend.device, "model.attn_implementation",
                             model.attn_implementation, trains=True, remote_code=model.trust_remote_code))
    if conf.engine.name == "hf":
        placed.append(Placed("engine.device", conf.engine.device, "model.attn_implementation",
                             model.attn_implementation, generates=True, remote_code=model.trust_remote_code))
    for name, entry in conf.task_entries().items():
        teacher = conf.teacher_for(entry) if training else None
        if teacher is not None:
            key = conf.teacher_key(name)
            placed.append(Placed(f"{key}.device", teacher.device, f"{key}.attn_implementation",
                                 teacher.attn_implementation, remote_code=teacher.trust_remote_code))
    for key, judger in learned_judgers(conf):
        if getattr(judger, "engine", "hf") == "hf":  # an LLM judge on vLLM: the installed build decides
            placed.append(Placed(f"{key}.device", judger.device))
    return placed


def check_attention(conf, training: bool = True) -> None:
    """Each placed model's attention is one transformers has and can run on the model's device."""
    from rlharness.model.attention import attention_problem, unknown_attention

    for p in placed_models(conf, training):
        if p.attention is None:
            continue
        problem = ((None if p.remote_code else unknown_attention(p.attention))
                   or attention_problem(p.attention, p.device_key, p.device, p.trains, p.generates))
        if problem is not None:
            raise ConfigError(f"{p.attention_key}={p.attention} is not allowed: it {problem}"
                              + ("" if "did you mean" in problem else "; use sdpa or eager"))


def cuda_devices() -> tuple[int, str]:
    """CUDA devices this process sees, and why none where there are none."""
    import torch

    if torch.version.cuda is None:
        return 0, f"torch {torch.__version__} here is a CPU build"
    count = torch.cuda.device_count()
    return count, "" if count else "torch sees no CUDA device here (no driver, or CUDA_VISIBLE_DEVICES hides them)"


def check_devices(conf, training: bool = True) -> None:
    """Each CUDA device a placed model names exists here; with cluster=local_ray, the run's Ray actors ask for
    no more GPUs than this machine has."""
    if isinstance(conf.cluster, SlurmClusterConf) and "SLURM_JOB_ID" not in os.environ:
        return  # submitted from here: checked on the job's node when it starts
    cuda = [p for p in placed_models(conf, training) if p.device.startswith("cuda")]
    if not cuda:
        return
    count, why_none = cuda_devices()
    for p in cuda:
        index = int(p.device.partition(":")[2] or 0)
        if index >= count:
            have = why_none or f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            raise ConfigError(f"{p.device_key}={p.device} is not allowed: {have}; use cpu")
    if training and isinstance(conf.cluster, LocalRayClusterConf):
        need, what = ray_gpus(conf)
        if need > count:
            raise ConfigError(f"mode={conf.mode} with cluster=local_ray asks Ray for {need:g} GPUs ({what}), but this "
                              f"machine has {count}: its actors would wait timeout_s={conf.timeout_s:g} s for them")


def ray_gpus(conf) -> tuple[float, str]:
    """GPUs the run's Ray actors ask for on one machine (rlharness/distributed/placement_plan.py), and which."""
    from rlharness.distributed.placement_plan import actor_resources

    (_, engine_gpus), (_, trainer_gpus) = actor_resources(conf)
    parts = []
    if conf.mode == "disagg" or conf.backend.ranked:  # training ranks as actors
        parts.append((conf.backend.workers * trainer_gpus, f"{conf.backend.workers} training actor(s)"))
    if conf.mode == "disagg":
        parts.append((conf.engine.num_engines * engine_gpus, f"{conf.engine.num_engines} engine(s)"))
        teachers = sum(t.device.startswith("cuda") for t in conf.distinct_teachers().values())
        parts.append((float(teachers), f"{teachers} teacher(s)"))
    parts = [(n, what) for n, what in parts if n]
    return sum(n for n, _ in parts), " + ".join(f"{what}: {n:g}" for n, what in parts)
