"""W&B: offline by default (files under `<run_dir>/wandb/`), online when configured.

The run id is saved with each checkpoint so a resumed job continues the same W&B run.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from rlharness.config.schema import ConfigError, LoggerConf
from rlharness.core.types import Group
from rlharness.logging_utils.samples import eval_table, sample_table

log = logging.getLogger(__name__)


def check_credentials(conf: LoggerConf) -> None:
    """logger.mode=online needs W&B credentials on this machine: without them wandb.init fails (or, at a
    terminal, stops the run to ask for a key) after the run has started. Asked as wandb.init asks
    (WANDB_API_KEY, the netrc `wandb login` writes, an identity token file), without a prompt."""
    if conf.name != "wandb" or conf.mode != "online":
        return
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:  # a wandb without these modules: its own init says what is missing
        return
    os.environ.setdefault("WANDB_SILENT", "true")  # before wandb's settings are read, as WandbLogger has it
    settings = wandb_setup.singleton().settings
    host = wbauth.HostUrl(settings.base_url, app_url=settings.app_url)
    if wbauth.authenticate_session(host=host, source="rlharness", prompt=False, update_session=False) is None:
        raise ConfigError(f"logger.mode=online is not allowed without W&B credentials for {settings.base_url}: "
                          f"run `wandb login` or set WANDB_API_KEY (or log offline and upload later with "
                          f"`wandb sync <run dir>/wandb/offline-run-*`)")


class WandbLogger:
    def __init__(self, conf: LoggerConf, run_dir: str, run_name: str, config: dict[str, Any],
                 run_id: str | None = None):
        self.run = None
        self.conf = conf
        if conf.name != "wandb" or conf.mode == "disabled":
            return
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")

        def init(mode: str):
            return wandb.init(
                project=conf.project, entity=conf.entity, mode=mode, dir=run_dir, name=run_name,
                id=run_id, resume="allow" if run_id else None, config=config, tags=list(conf.tags),
                settings=wandb.Settings(console="off", x_disable_stats=True, init_timeout=conf.init_timeout_s),
            )

        mode = conf.mode
        try:
            self.run = init(mode)
        except wandb.errors.CommError as exc:  # the server unreachable: the run goes on, its W&B files kept here
            log.warning("W&B online: the server did not answer within logger.init_timeout_s=%gs (%s); logging "
                        "offline instead", conf.init_timeout_s, str(exc).splitlines()[0][:200])
            mode = "offline"
            wandb.teardown()  # wandb's service still holds the failed start's run id (a resumed run's own)
            self.run = init(mode)
        log.info("W&B run %s (%s) in %s", self.run.id, mode, run_dir)
        if mode == "offline":
            log.info("upload it to W&B with: wandb sync %s", self.run.dir.rsplit("/files", 1)[0])

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run is not None else None

    def log(self, row: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=int(row["step"]))

    def log_samples(self, step: int, groups: list[Group]) -> None:
        """The step's samples as a table, every `logger.log_samples_every` steps."""
        if self.run is None or not groups:
            return
        every = self.conf.log_samples_every
        if every and step % every == 0:
            self._table("rollout/samples", step, *sample_table(step, groups, self.conf.max_sample_rows))

    def log_eval(self, step: int, rows: list[dict]) -> None:
        """An eval's completions with their judgement."""
        if self.run is not None and rows:
            self._table("eval/samples", step, *eval_table(step, rows, self.conf.max_sample_rows))

    def log_histograms(self, step: int, values: dict[str, list[float]]) -> None:
        """One W&B histogram per non-empty list (e.g. generated against trained lengths and rewards)."""
        if self.run is None:
            return
        import wandb

        hists = {k: wandb.Histogram(v) for k, v in values.items() if v}
        if hists:
            self.run.log(hists, step=step)

    def _table(self, key: str, step: int, columns: list[str], rows: list[list]) -> None:
        import wandb

        self.run.log({key: wandb.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
