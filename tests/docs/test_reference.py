"""The generated references cannot drift from the code.

- docs/reference/config.md and metrics.md are what `scripts/gen_reference.py` makes of the code now;
- every schema field has the comment the configuration reference shows;
- every metric key a run logs, and every metric-shaped name in the package's sources, is in the
  catalog the metrics reference is made from (tests/conftest.py also checks every `metrics.jsonl`
  that any test's run writes);
- every catalog entry still names something the sources emit.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rlharness.logging_utils.metric_catalog import METRICS, UNITS, find_metric, unknown_keys
from rlharness.logging_utils.metrics import read_metrics
from tests.helpers import load_script, run_in_process, uncataloged_metrics

ROOT = Path(__file__).resolve().parents[2]
gen = load_script(ROOT / "scripts" / "gen_reference.py", "gen_reference")
STAGES = ("train", "rollout", "perf", "staleness", "buffer", "eval", "judge", "critic", "agent")
METRIC_SHAPE = re.compile(rf"^({'|'.join(STAGES)})/[^\s]*$")


@pytest.mark.parametrize("page", sorted(gen.PAGES, key=str), ids=lambda p: p.name)
def test_the_generated_page_is_current(page):
    assert page.read_text() == gen.PAGES[page](), (
        f"{page.relative_to(ROOT)} is stale: run `python scripts/gen_reference.py` and commit the result")


def test_every_schema_field_has_a_comment_to_show():
    rows = [line for line in gen.config_page().splitlines() if line.startswith("| `") and line.count("|") >= 6]
    assert len(rows) > 150, len(rows)
    bare = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("|  |")]
    assert bare == [], ("schema fields without a comment (write one above the field in rlharness/config/schema.py "
                        f"or run.py): {bare}")


def test_every_check_of_a_field_reaches_the_reference():
    rows: dict[str, list[str]] = {}
    for line in gen.config_page().splitlines():
        if line.startswith("| `"):
            rows.setdefault(line.split("|")[1].strip(), []).append(line)

    def shown(key: str, text: str) -> bool:
        return any(text in row for row in rows[f"`{key}`"])

    assert shown("sampler.prompt_repeat_k", "an integer >= 1")  # a shared rule function (check_prompt_repeat_k)
    assert shown("engine.weight_sync", "one of `collective`, `disk`")  # an option's own method (engine=vllm)
    assert shown("algo.adam_beta2", "0 <= beta < 1")  # a check in a loop over keys
    assert shown("strategy.max_staleness", "`${max_staleness}`")  # an interpolation shown as written


def source_metric_names() -> dict[str, str]:
    """Every metric-shaped string in rlharness/ (literal or f-string, `{...}` kept), with a file that has it."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "rlharness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                               for v in node.values)
            else:
                continue
            if METRIC_SHAPE.match(text):
                found.setdefault(text, str(path.relative_to(ROOT)))
    return found


def _covered(name: str) -> bool:
    """A literal name is in the catalog; a prefix ("judge/") or a pattern with `{...}` or `*` matches an entry."""
    if "{" not in name and "*" not in name and not name.endswith(("/", "_")):
        return find_metric(name) is not None
    parts = re.split(r"(\{[^}]*\}|\*)", name)
    body = "".join(".+" if p.startswith("{") or p == "*" else re.escape(p) for p in parts)
    pattern = re.compile(body + (".*" if name.endswith(("/", "_")) else ""))
    return any(pattern.fullmatch(m.name) for m in METRICS)


def test_every_metric_name_in_the_sources_is_in_the_catalog():
    names = source_metric_names()
    assert len(names) > 80, names  # a broken scan would find none
    missing = {n: f for n, f in names.items() if not _covered(n)}
    assert missing == {}, ("metric names in the sources without an entry in "
                           f"rlharness/logging_utils/metric_catalog.py: {missing}")


def test_every_catalog_entry_is_still_emitted_somewhere():
    """A renamed or removed metric leaves a stale entry: each entry's name (its fixed part, for a
    pattern) must still be written somewhere in the sources."""
    source = "\n".join(p.read_text() for p in (ROOT / "rlharness").rglob("*.py"))
    stale = []
    for m in METRICS:
        stage_free = m.name.split("/", 1)[-1]
        pieces = [p.strip("_/") for p in re.split(r"<[a-z]+>", stage_free)]
        if m.name.startswith("perf/engine_"):
            pieces = [stage_free.removeprefix("engine_")]  # the engines' counters: `stats()` keys
        if m.name.startswith("judge/") and "<" not in m.name:
            pieces = [stage_free]  # the judgers' counters: `count_keys`
        longest = max(pieces, key=len)
        if longest and f'"{longest}' not in source and f"{longest}\"" not in source and f"/{longest}" not in source:
            stale.append(m.name)
    assert stale == [], f"catalog entries no source writes any more: {stale}"


def test_every_entry_has_a_known_unit_and_a_description():
    assert len({m.name for m in METRICS}) == len(METRICS), "an entry is listed twice"
    bad = [m.name for m in METRICS if m.unit not in UNITS or not m.what or not m.when]
    assert bad == []


def test_the_catalog_tells_a_new_key_from_a_known_one():
    assert unknown_keys(["train/loss", "rollout/padded/reward_mean", "staleness/tokens_at_3", "judge/calc/timeouts",
                         "rollout/reward_reward_model_mean", "eval/arith/pass@k"]) == []
    assert unknown_keys(["train/loss_new", "rollout/a/b/c", "eval/accuracy_greedy"]) == [
        "eval/accuracy_greedy", "rollout/a/b/c", "train/loss_new"]


def test_a_short_real_run_logs_only_cataloged_keys(tmp_path):
    """The real default path and a multi-task async run with sampled evaluation: every key they log is in
    the catalog (and so in docs/reference/metrics.md)."""
    short = ["total_steps=2", "batch_size=4", "sampler.prompt_repeat_k=4", "eval_every=1", "eval.num_prompts=4",
             "eval.num_samples=2", "eval.pass_k=2", "save_every=0", "logger=none"]
    run_in_process(tmp_path / "default", short)
    run_in_process(tmp_path / "mix", [*short, "experiment=arith_mix", "strategy=async", "max_staleness=1"])
    keys = {k for run in ("default", "mix") for row in read_metrics(tmp_path / run / "metrics.jsonl") for k in row}
    assert {"train/loss", "eval/pass@k", "eval/padded/accuracy", "rollout/unpadded/reward_mean",
            "staleness/tokens_at_0"} <= keys
    assert unknown_keys(keys) == []


def test_the_suite_wide_check_finds_a_run_file_with_a_new_key(tmp_path):
    """What tests/conftest.py runs after every test that has a tmp_path."""
    run = tmp_path / "outputs" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5, "train/brand_new": 1.0}\n')
    assert uncataloged_metrics(tmp_path) == {str(run / "metrics.jsonl"): ["train/brand_new"]}
    (run / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5}\n')  # else this test's own check fails
    assert uncataloged_metrics(tmp_path) == {}
