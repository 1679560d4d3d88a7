"""Does a `cluster=slurm` request fit the partition at all? Checked before submitting.

A job asking for more nodes than its partition has, or more GPUs / CPUs per node than
any of its nodes, is either refused by sbatch (a long traceback) or, on clusters without
`EnforcePartLimits`, left PENDING forever (reason PartitionConfig) while `train.py -m`
waits. `check_capacity` reads the partition's nodes with `sinfo` and refuses such a
request in one line naming the keys; without a reachable Slurm it checks nothing (sbatch
decides). Nodes that are down or drained count: they may come back.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Optional

from rlharness.config.schema import ConfigError

SINFO_TIMEOUT_S = 20
_GPU_ENTRY = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")


@dataclass(frozen=True)
class SlurmNode:
    name: str
    cpus: int
    gpus: int


def gres_gpus(gres: str) -> int:
    """GPUs in a sinfo %G field: "gpu:2", "gpu:a100:8(S:0-1)", "gpu:a100:4,gpu:v100:2", "(null)"."""
    return sum(int(m.group(1)) for entry in re.split(r",(?=[a-z])", gres) if (m := _GPU_ENTRY.match(entry.strip())))


def parse_sinfo(text: str) -> tuple[Optional[str], dict[str, list[SlurmNode]]]:
    """(the default partition, nodes per partition) from `sinfo -h -N -o %P|%N|%c|%G`."""
    default, parts = None, {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4:
            continue
        part, node, cpus, gres = fields
        if part.endswith("*"):
            part = default = part.rstrip("*")
        parts.setdefault(part, {})[node] = SlurmNode(node, int(cpus) if cpus.isdigit() else 0, gres_gpus(gres))
    return default, {p: list(nodes.values()) for p, nodes in parts.items()}


def fits(nodes: list[SlurmNode], cluster) -> int:
    """How many of `nodes` could each hold one task of `cluster` (its CPUs and GPUs per node)."""
    return sum(1 for n in nodes if n.cpus >= cluster.cpus_per_task and n.gpus >= cluster.gpus_per_node)


def refusal(default: Optional[str], partitions: dict[str, list[SlurmNode]], cluster) -> Optional[str]:
    """The one-line reason `cluster` can never run on this Slurm, or None."""
    partition = cluster.partition or default
    if partition is None:
        return None  # no default partition: sbatch says so
    if partition not in partitions:
        return (f"cluster.partition={partition!r} is not allowed: this Slurm's partitions are "
                f"{', '.join(sorted(partitions)) or '(none)'}")
    nodes = partitions[partition]
    if fits(nodes, cluster) >= cluster.nodes:
        return None
    most_gpus = max(n.gpus for n in nodes)
    most_cpus = max(n.cpus for n in nodes)
    listed = ", ".join(f"{n.name} ({n.cpus} CPUs, {n.gpus} GPUs)" for n in nodes[:8])
    more = f" and {len(nodes) - 8} more" if len(nodes) > 8 else ""
    if cluster.gpus_per_node > most_gpus:
        what = f"cluster.gpus_per_node={cluster.gpus_per_node} is not allowed: at most {most_gpus}"
    elif cluster.cpus_per_task > most_cpus:
        what = f"cluster.cpus_per_task={cluster.cpus_per_task} is not allowed: at most {most_cpus}"
    else:
        what = (f"cluster.nodes={cluster.nodes} is not allowed: at most {fits(nodes, cluster)} node(s) with "
                f"cluster.gpus_per_node={cluster.gpus_per_node} and cluster.cpus_per_task={cluster.cpus_per_task}")
    return f"{what} in Slurm partition {partition!r}, whose nodes are {listed}{more}"


def read_sinfo() -> Optional[str]:
    """sinfo's node list, or None when Slurm cannot be asked (no sinfo, no answer)."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%P|%N|%c|%G"], capture_output=True, text=True,
                             timeout=SINFO_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 and out.stdout.strip() else None


def check_capacity(cluster) -> None:
    """Raise ConfigError if `cluster` (a SlurmClusterConf or its DictConfig) can never run; else nothing."""
    if getattr(cluster, "constraint", None):
        return  # features narrow the nodes in ways these columns do not show: sbatch decides
    text = read_sinfo()
    reason = refusal(*parse_sinfo(text), cluster) if text is not None else None
    if reason:
        raise ConfigError(reason)
