"""Every `python train.py ...` the documentation pages show composes and passes the config's checks, as
train.py's preflight composes it: in code blocks and in inline code, each point of a `-m` sweep. (The
README's lines also run: tests/docs/test_readme_commands.py.) A line with a placeholder (`<run dir>`,
`...`, `seed=N`) or a `resume=` of a run this test does not have is left out."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest

from rlharness.config.schema import ConfigError
from rlharness.launch.preflight import ConfigSource, compose_typed

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "notes" not in p.relative_to(ROOT / "docs").parts)
PLACEHOLDER = re.compile(r"<|\.\.\.|=[A-Z]$")


def train_lines(text: str) -> list[str]:
    """The train.py command lines of a page: each line of its fenced code, and each inline code span."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    lines = [ln for b in blocks for ln in b.replace("\\\n", " ").splitlines()]
    inline = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
    return [ln for ln in lines + inline if "train.py" in ln]


def overrides_of(line: str) -> list[str] | None:
    """The overrides after `train.py` (flags dropped), or None for a line left out."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    for chain in (list(g) for sep, g in itertools.groupby(words, lambda w: w in ("&&", ";", "|")) if not sep):
        at = next((i for i, w in enumerate(chain) if w.endswith("train.py")), None)
        if at is None:
            continue
        args = [a for a in chain[at + 1:] if not a.startswith("-")]
        if not all("=" in a for a in args) or any(PLACEHOLDER.search(a) or a.startswith("resume=") for a in args):
            return None
        return args
    return None


def sweep_points(args: list[str]) -> list[list[str]]:
    return [list(p) for p in itertools.product(*(
        [f"{k}={v}" for v in vs.split(",")] if "[" not in vs and "'" not in vs else [a]
        for a in args for k, _, vs in [a.partition("=")]))]


CASES = [(page, args) for page in PAGES for line in train_lines(page.read_text())
         if (args := overrides_of(line)) is not None]


def test_the_pages_show_enough_command_lines_to_check():
    assert len(CASES) >= 60, len(CASES)


@pytest.mark.parametrize("page, args", CASES, ids=lambda x: x.name if isinstance(x, Path) else " ".join(x)[:70])
def test_a_documented_command_line_composes(page, args, monkeypatch):
    for name in re.findall(r"env:(\w+)", " ".join(args)):  # a header read from the environment
        monkeypatch.setenv(name, "set-by-the-test")
    for point in sweep_points(args):
        try:
            compose_typed(point, ConfigSource())
        except ConfigError as exc:
            # A LoRA line on a model fetched by a script (SmolLM2): its layout is read last, after every other
            # check passed; a fresh clone has not fetched it (tests/integration/test_real_model.py runs it).
            if "the model is not there yet; make it with `bash scripts/fetch_" not in str(exc):
                raise
