"""W&B: offline by default (files under `<run_dir>/wandb/`), online when configured.

The run id is saved with each checkpoint so a resumed job continues the same W&B run.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from rlharness.config.schema import LoggerConf

log = logging.getLogger(__name__)


class WandbLogger:
    def __init__(self, conf: LoggerConf, run_dir: str, run_name: str, config: dict[str, Any],
                 run_id: str | None = None):
        self.run = None
        if conf.name != "wandb" or conf.mode == "disabled":
            return
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=conf.project, entity=conf.entity, mode=conf.mode, dir=run_dir, name=run_name,
            id=run_id, resume="allow" if run_id else None, config=config, tags=list(conf.tags),
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        log.info("W&B run %s (%s) in %s", self.run.id, conf.mode, run_dir)

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run is not None else None

    def log(self, row: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=int(row["step"]))

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
