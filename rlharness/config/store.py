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

from rlharness.config.registry import GROUPS
from rlharness.config.run import RunConf

# schema/<group>/<name> for every implementation a group registers (rlharness/config/registry.py).
SCHEMAS: dict[str, dict[str, type]] = {group: {name: impl.schema for name, impl in impls.items()}
                                       for group, impls in GROUPS.items()}


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
