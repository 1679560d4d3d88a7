"""Evaluate a model outside training: `python evaluate.py model.path=<HF folder>` or
`python evaluate.py resume=<run dir> [eval.checkpoint_step=N]`, with any `task=` / `tasks.<name>`,
`eval.num_samples`, `eval.pass_k`, `eval.temperature`, `engine=hf|vllm`.

    python evaluate.py model=smollm2 task=jsonl task.path=... eval.num_samples=8 eval.pass_k=4
    python evaluate.py resume=outputs/2026-11-24/10-31-07 eval.num_samples=8 eval.pass_k=4

Writes `evals/<label>.jsonl`, `summary.json` and `summary.md` into its own directory
(`outputs/evaluate/<date>/<time>/`). Refused input prints one line `error: ...` and exits 2
with nothing written (rlharness/launch/evaluate.py).
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rlharness.config.schema import ConfigError
from rlharness.config.store import register_configs
from rlharness.launch.evaluate import OutputGuard, Source, prepare_eval_argv, run_evaluation
from rlharness.core.redaction import redact

register_configs()
EXIT_REFUSED = 2
_SOURCE: Source | None = None
_GUARD: OutputGuard | None = None


@hydra.main(version_base=None, config_path="conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from pathlib import Path

    from rlharness.data.jsonl import DataFileError

    cfg.run_dir = HydraConfig.get().runtime.output_dir
    conf = OmegaConf.to_object(cfg)
    source = _SOURCE or Source(model_path=conf.model.path)
    try:
        run_evaluation(conf, Path(conf.run_dir), source)
    except (ConfigError, DataFileError) as exc:  # found while loading: nothing was written but Hydra's files
        if _GUARD is None:
            raise
        _GUARD.rollback()
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)


if __name__ == "__main__":
    try:
        sys.argv, _SOURCE, _GUARD = prepare_eval_argv(sys.argv)
    except ConfigError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    main()
