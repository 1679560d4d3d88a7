"""The documentation site builds with every warning an error, renders in a real browser, and its
pictures come from the scripts in the repository.

`scripts/site_screenshot.py` does the work: `mkdocs build --strict` (broken links and anchors,
pages left out of the nav), the first page served locally and rendered by headless Chromium, its
title and navigation read from the rendered DOM, a screenshot taken.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import yaml

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
site = load_script(ROOT / "scripts" / "site_screenshot.py", "site_screenshot")
figures = load_script(ROOT / "scripts" / "make_doc_figures.py", "make_doc_figures")
# Material's header in the configured primary colour (indigo): #4051b5 in the rendered page.
HEADER_RGB = np.array([0x40, 0x51, 0xB5]) / 255


def test_the_site_builds_renders_and_shows_its_title_and_navigation(tmp_path):
    shot = tmp_path / "home.png"
    assert site.check(shot) == []
    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.shape[:2] == (site.WINDOW[1], site.WINDOW[0])
    # The theme's stylesheet was applied: the header bar is the theme's colour, the page below is not
    # one flat colour (text, the picture and the navigation were drawn).
    assert np.abs(pixels[10, site.WINDOW[0] // 2] - HEADER_RGB).max() < 0.08, pixels[10, site.WINDOW[0] // 2]
    assert pixels[100:].std() > 0.05


def test_the_rendered_checks_catch_a_wrong_page(tmp_path):
    """The DOM reading itself: a page without the nav or with another title is reported."""
    (tmp_path / "index.html").write_text("<html><head><title>other</title></head><body>no nav</body></html>")
    with site.served(tmp_path) as url:
        page = site.rendered(url, ["Concepts"])
    assert page.title == "other" and page.nav_sections == []


def test_a_broken_link_fails_the_strict_build(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "docs" / "index.md").write_text((copy / "docs" / "index.md").read_text()
                                            + "\n[gone](concepts/producer.md#no-such-section)\n")
    old_root = site.ROOT
    site.ROOT = copy
    try:
        with pytest.raises(RuntimeError, match="no-such-section"):
            site.build(tmp_path / "out")
    finally:
        site.ROOT = old_root


def test_every_page_is_in_the_nav_and_notes_are_not_on_the_site():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = set()

    def walk(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            walk(value) if isinstance(value, list) else listed.add(value)

    walk(config["nav"])
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert {p for p in pages if not p.startswith("notes/")} == listed
    assert "notes/" in config["exclude_docs"]
    # The order a user wants things in.
    assert site.expected_sections(config) == ["Getting started", "Concepts", "How-to guides", "Operations",
                                              "Results", "Development", "Reference"]


def test_the_pictures_are_drawn_by_the_script(tmp_path):
    assert figures.main(["--out", str(tmp_path)]) == 0
    for draw in figures.FIGURES:
        name = f"{draw.__name__}.png"
        made, committed = mpimg.imread(tmp_path / name), mpimg.imread(ROOT / "docs" / "img" / name)
        assert made.shape == committed.shape, name  # the committed picture is this script's
        assert made[..., :3].std() > 0.05, name
