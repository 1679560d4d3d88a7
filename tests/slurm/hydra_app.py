"""A small @hydra.main app on the project's own config tree (conf/), used by the Slurm
tests to exercise `cluster=slurm` without training: each job writes what it saw."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlharness.config.store import register_configs

register_configs()


@hydra.main(version_base=None, config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> int:
    out = Path(HydraConfig.get().runtime.output_dir)
    if cfg.seed < 0:
        sys.exit(f"refusing seed={cfg.seed}")
    seen = {key: os.environ.get(key) for key in ("SLURM_JOB_ID", "SLURM_CPUS_PER_TASK", "RLH_SETUP_MARK")}
    (out / "seen.json").write_text(json.dumps({"seed": cfg.seed, **seen}))
    return cfg.seed


if __name__ == "__main__":
    main()
