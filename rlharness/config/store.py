"""Register every schema in Hydra's ConfigStore.

Schemas live under `schema/<group>/<name>`; the YAML files in `conf/<group>/` start
from them (`defaults: [/schema/<group>/<name>@_here_]`... see conf/) and carry only
values that differ. The primary config `conf/config.yaml` starts from `schema/run`.

Dict-valued fields (`judger.headers`, `judger.weights`, `task.dataset_config`, `tasks`, ...) are
stored open: Hydra puts the whole config in struct mode, which would refuse a new key unless it is
written `+key.name=value`; open, all of Hydra's forms work (`key={name: value}`, `key.name=value`,
`+key.name=value`). A typo in a typed part is still refused (`preflight.check_known_keys`).
"""

import dataclasses
import typing

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from rlharness.config import schema as s
from rlharness.config.run import RunConf

SCHEMAS: dict[str, dict[str, type]] = {
    "strategy": {"sync": s.SyncStrategyConf, "async": s.AsyncStrategyConf},
    "sampler": {"default": s.SamplerConf},
    "agent": {"single_turn": s.SingleTurnAgentConf, "multi_turn_tool": s.MultiTurnToolAgentConf,
              "one_tool_call": s.MultiTurnToolAgentConf, "openai_gateway": s.OpenAIGatewayAgentConf},
    # Presets (an option file over a schema) that experiments pick, so a swapped judger leaves none of their keys.
    "judger": {**s.JUDGER_SCHEMAS, "math_strict": s.MathJudgerConf, "arith_rm": s.RouterJudgerConf,
               "reasoning_gym_last_number": s.ReasoningGymJudgerConf},
    "model": {"default": s.ModelConf, "smollm2": s.ModelConf, "tiny_chat": s.ModelConf},
    "engine": {"hf": s.HFEngineConf, "vllm": s.VLLMEngineConf, "sim": s.SimEngineConf},
    "backend": {"torch": s.TorchBackendConf, "deepspeed": s.DeepSpeedBackendConf, "sim": s.SimBackendConf},
    "algo": {"grpo": s.AlgoConf, "drgrpo": s.AlgoConf, "rloo": s.AlgoConf, "reinforce_pp": s.AlgoConf,
             "gspo": s.AlgoConf, "ppo": s.AlgoConf},
    "task": {"arithmetic": s.ArithmeticTaskConf, "arithmetic_unpadded": s.ArithmeticTaskConf,
             "countdown": s.CountdownTaskConf, "jsonl": s.JsonlTaskConf, "reasoning_gym": s.ReasoningGymTaskConf,
             "tiny_chat_math": s.JsonlTaskConf, "tiny_chat_tools": s.JsonlTaskConf,
             "rg_addition": s.ReasoningGymTaskConf},
    "cluster": {"local": s.LocalClusterConf, "local_ray": s.LocalRayClusterConf, "slurm": s.SlurmClusterConf},
    "logger": {"wandb": s.WandbLoggerConf, "none": s.NoneLoggerConf},
}


def dict_fields(schema: type, prefix: str = "") -> list[tuple[str, type]]:
    """(dotted key, value type) of every dict-valued field of a schema, nested schemas included."""
    found = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        hint = hints[f.name]
        if typing.get_origin(hint) is dict:
            found.append((prefix + f.name, typing.get_args(hint)[1]))
        elif dataclasses.is_dataclass(hint):
            found += dict_fields(hint, f"{prefix}{f.name}.")
    return found


def schema_node(schema: type) -> DictConfig:
    """The schema as a config whose dict-valued fields take new keys without `+`."""
    node = OmegaConf.structured(schema)
    for key, _ in dict_fields(schema):
        OmegaConf.set_struct(OmegaConf.select(node, key), False)
    return node


def register_configs() -> None:
    """Store every schema (once per process: the store is a process-wide singleton, and building the
    nodes is most of what composing a config costs)."""
    cs = ConfigStore.instance()
    if cs.repo.get("schema", {}).get("run.yaml") is not None:
        return
    cs.store(group="schema", name="run", node=schema_node(RunConf))
    for group, impls in SCHEMAS.items():
        for name, node in impls.items():
            cs.store(group=f"schema/{group}", name=name, node=schema_node(node))
