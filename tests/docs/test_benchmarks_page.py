"""docs/benchmarks.md is a results page: one section per benchmark script, each with its current
figure's command, machine, date and load, and no dated engineering-log sections."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"


def sections(text: str) -> dict[str, str]:
    """`## ` heading -> the section's text (up to the next `## `)."""
    return {title: body for title, body in re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.S | re.M)}


def scripts() -> list[str]:
    return sorted(f"benchmarks/{p.name}" for p in (ROOT / "benchmarks").iterdir()
                  if p.suffix in (".py", ".sh") and not p.name.startswith("_"))


def test_every_benchmark_script_has_exactly_one_section():
    titles = list(sections(PAGE.read_text()))
    assert len(scripts()) > 20
    for script in scripts():
        named = [t for t in titles if f"`{script}`" in t]
        assert len(named) == 1, f"{script}: {len(named)} sections of docs/benchmarks.md name it in their heading"


def test_every_script_section_gives_command_machine_date_and_load():
    for title, body in sections(PAGE.read_text()).items():
        if "`benchmarks/" not in title:
            continue
        for label in ("**Command:**", "**Machine:**", "**Date:**", "**Load:**"):
            assert label in body, f"docs/benchmarks.md, {title!r}: no {label}"
        assert re.search(r"\*\*Date:\*\* 20\d\d-\d\d-\d\d", body), title


def test_no_dated_log_sections_on_the_results_page():
    text = PAGE.read_text()
    assert not re.search(r"^#+ Issue \d+", text, re.M)
    assert "TODO" not in text and "TBD" not in text
