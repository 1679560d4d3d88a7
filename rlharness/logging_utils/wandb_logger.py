"""W&B: offline by default (files under `<run_dir>/wandb/`), online when configured.

The run id is saved with each checkpoint so a resumed job continues the same W&B run.
"""

from __future__ import annotations

import logging
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from rlharness.config.schema import ConfigError, LoggerConf
from rlharness.core.run_dir import MULTIRUN_YAML, RunDir, sweep_of
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


def run_names(run_dir: Path) -> tuple[str, str | None]:
    """(W&B run name, W&B group) of a run directory: `<date>/<time>` for a run; a sweep's job is grouped by
    its sweep (`<date>/<time>`) and named by its number and its own point of the sweep (`#3 algo.lr=1e-6`),
    not by its directory's bare number."""
    run_dir = Path(run_dir)
    sweep = sweep_of(run_dir)
    if sweep is None:
        return f"{run_dir.parent.name}/{run_dir.name}", None
    group = f"{sweep.parent.name}/{sweep.name}"
    saved = yaml.safe_load((sweep / MULTIRUN_YAML).read_text()) or {}
    swept = set(saved.get("hydra", {}).get("overrides", {}).get("task") or [])
    own = RunDir(run_dir).overrides
    point = [o for o in (yaml.safe_load(own.read_text()) or []) if o not in swept] if own.is_file() else []
    return " ".join([f"{group}#{run_dir.name}", *point]), group


def server_unreachable(url: str, timeout_s: float) -> str | None:
    """Why the W&B server at `url` cannot be reached (its host unknown, its port closed or silent), else None.
    A connection, not a request: wandb.init alone would retry for init_timeout_s, then leave a resumed run's
    id held by its service. Behind a proxy (HTTPS_PROXY and the like) only wandb knows the way: not asked."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                                       "all_proxy")):
        return None
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"cannot reach {parts.hostname}:{port} ({exc})"
    return None


class WandbLogger:
    def __init__(self, conf: LoggerConf, run_dir: str, config: dict[str, Any], run_id: str | None = None):
        self.run = None
        self.conf = conf
        if conf.name != "wandb" or conf.mode == "disabled":
            return
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")

        name, group = run_names(Path(run_dir))

        def init(mode: str, run_id: str | None):
            return wandb.init(
                project=conf.project, entity=conf.entity, mode=mode, dir=run_dir, name=conf.run_name or name,
                group=conf.group or group, id=run_id, resume="allow" if run_id else None, config=config,
                tags=list(conf.tags),
                # The bound is the server's: an offline start (wandb's local service) keeps wandb's own.
                settings=wandb.Settings(console="off", x_disable_stats=True,
                                        **({"init_timeout": conf.init_timeout_s} if mode == "online" else {})),
            )

        mode = conf.mode
        why = server_unreachable(wandb.setup().settings.base_url, conf.init_timeout_s) if mode == "online" else None
        if why is not None:  # no network (a cluster node without one): the run goes on, its W&B files kept here
            log.warning("W&B online: %s; logging offline instead", why)
            mode = "offline"
        try:
            self.run = init(mode, run_id)
        except wandb.errors.CommError as exc:  # reached, but no answer: as above
            log.warning("W&B online: the server did not answer within logger.init_timeout_s=%gs (%s); logging "
                        "offline instead%s", conf.init_timeout_s, str(exc).splitlines()[0][:200],
                        f", under a new run id (wandb still holds {run_id})" if run_id else "")
            mode = "offline"
            self.run = init(mode, None)
        log.info("W&B run %s, %r%s (%s) in %s", self.run.id, self.run.name,
                 f" in group {self.run.group!r}" if self.run.group else "", mode, run_dir)
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
