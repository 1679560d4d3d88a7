"""Launch helpers: Ray bring-up per cluster (`connect_ray`). The run itself is
`rlharness.launcher.run`; Slurm submission is hydra-submitit-launcher's (conf/cluster/slurm.yaml)."""

from rlharness.launch.ray_cluster import connect_ray

__all__ = ["connect_ray"]
