"""Register every schema in Hydra's ConfigStore.

Schemas live under `schema/<group>/<name>`; the YAML files in `conf/<group>/` start
from them (`defaults: [/schema/<group>/<name>@_here_]`... see conf/) and carry only
values that differ. The primary config `conf/config.yaml` starts from `schema/run`.
"""

from hydra.core.config_store import ConfigStore

from rlharness.config import schema as s
from rlharness.config.run import RunConf

SCHEMAS: dict[str, dict[str, type]] = {
    "strategy": {"sync": s.SyncStrategyConf, "async": s.AsyncStrategyConf},
    "sampler": {"default": s.SamplerConf},
    "agent": {"single_turn": s.SingleTurnAgentConf, "multi_turn_tool": s.MultiTurnToolAgentConf,
              "openai_gateway": s.OpenAIGatewayAgentConf},
    "judger": s.JUDGER_SCHEMAS,
    "model": {"default": s.ModelConf, "smollm2": s.ModelConf, "tiny_chat": s.ModelConf},
    "engine": {"hf": s.HFEngineConf, "vllm": s.VLLMEngineConf, "sim": s.SimEngineConf},
    "backend": {"torch": s.TorchBackendConf, "deepspeed": s.DeepSpeedBackendConf, "fsdp2": s.FSDP2BackendConf,
                "sim": s.SimBackendConf},
    "algo": {"grpo": s.AlgoConf, "drgrpo": s.AlgoConf, "rloo": s.AlgoConf, "reinforce_pp": s.AlgoConf,
             "gspo": s.AlgoConf, "ppo": s.AlgoConf},
    "task": {"arithmetic": s.ArithmeticTaskConf, "arithmetic_unpadded": s.ArithmeticTaskConf, "countdown": s.CountdownTaskConf, "jsonl": s.JsonlTaskConf,
             "reasoning_gym": s.ReasoningGymTaskConf},
    "cluster": {"local": s.LocalClusterConf, "local_ray": s.LocalRayClusterConf, "slurm": s.SlurmClusterConf},
    "logger": {"wandb": s.WandbLoggerConf, "none": s.NoneLoggerConf},
}


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(group="schema", name="run", node=RunConf)
    for group, impls in SCHEMAS.items():
        for name, node in impls.items():
            cs.store(group=f"schema/{group}", name=name, node=node)
