"""Register every schema in Hydra's ConfigStore.

Schemas live under `schema/<group>/<name>`; the YAML files in `conf/<group>/` start
from them (`defaults: [/schema/<group>/<name>@_here_]`... see conf/) and carry only
values that differ. The primary config `conf/config.yaml` starts from `schema/run`.
"""

from hydra.core.config_store import ConfigStore

from rlharness.config.registry import GROUPS
from rlharness.config.run import RunConf

# schema/<group>/<name> for every implementation a group registers (rlharness/config/registry.py).
SCHEMAS: dict[str, dict[str, type]] = {group: {name: impl.schema for name, impl in impls.items()}
                                       for group, impls in GROUPS.items()}


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(group="schema", name="run", node=RunConf)
    for group, impls in SCHEMAS.items():
        for name, node in impls.items():
            cs.store(group=f"schema/{group}", name=name, node=node)
