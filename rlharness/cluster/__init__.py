"""The low Ray pieces every distributed part stands on: bringing Ray up per cluster
(`connect_ray`), placement groups and actor options. The run itself is
`rlharness.launch.launcher.run`; Slurm submission is hydra-submitit-launcher's (conf/cluster/slurm.yaml)."""

from rlharness.cluster.ray_cluster import connect_ray

__all__ = ["connect_ray"]
