"""docs/concepts/architecture.md names only what exists: every repository path in it, and every
backticked name (a function, class, constant or config key) somewhere in the sources.

The page is where a newcomer looks for the place to change; a renamed module or function
must fail here, not mislead a reader.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "concepts" / "architecture.md"
# A repository path: starts at one of the top-level folders (or is train.py); `<name>` placeholders end it.
PATH = re.compile(r"(?<![\w/.])((?:rlharness|scripts|tests|conf|docs|benchmarks|examples)/[\w./-]*|train\.py)")
CODE = re.compile(r"`([^`\n]+)`")
# A backticked name: `f`, `Class.method`, `section.key` (config keys are checked by their last part).
NAME = re.compile(r"^@?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\(\))?$")
# Words on the page that name a stored value or a file, not a symbol of the sources.
NOT_SYMBOLS = {"DONE", "summary.csv"}


def page_paths(text: str) -> list[str]:
    return sorted({m.rstrip(".") for m in PATH.findall(text)})


def page_names(text: str) -> list[str]:
    names = set()
    for code in CODE.findall(text):
        code = code.strip()
        if NAME.match(code) and "/" not in code and not code.endswith(".py") and code not in NOT_SYMBOLS:
            names.add(code.lstrip("@").removesuffix("()"))
    return sorted(names)


def source_text() -> str:
    files = [ROOT / "train.py", *sorted((ROOT / "rlharness").rglob("*.py")),
             *sorted((ROOT / "scripts").glob("*.py")), *sorted((ROOT / "conf").rglob("*.yaml"))]
    return "\n".join(p.read_text() for p in files)


def test_every_path_on_the_page_exists():
    paths = page_paths(PAGE.read_text())
    assert len(paths) > 50, paths  # the page names files; a broken pattern would find none
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert missing == [], f"{PAGE.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_every_name_on_the_page_is_in_the_sources():
    names = page_names(PAGE.read_text())
    assert len(names) > 50, names
    src = source_text()
    missing = [n for n in names
               if not all(re.search(rf"\b{re.escape(part)}\b", src) for part in n.split("."))]
    assert missing == [], f"{PAGE.relative_to(ROOT)} names what the sources do not hold: {missing}"


def test_the_checks_catch_a_renamed_file_and_function():
    text = "see `rlharness/producer/no_such_module.py` and `no_such_function_here`"
    assert page_paths(text) == ["rlharness/producer/no_such_module.py"]
    assert page_names(text) == ["no_such_function_here"]
    assert not re.search(r"\bno_such_function_here\b", source_text())


# A path into docs/ wherever it is written: the README, the package, scripts, benchmarks, tests, conf,
# the site's pages (the engineering notes under docs/notes/ keep the paths of their time).
DOCS_PATH = re.compile(r"(?<![\w/.-])(docs/[\w./-]+\.(?:md|png))")
NAMING_FILES = ["README.md", "mkdocs.yml", "train.py", "evaluate.py", "rlharness", "scripts", "benchmarks", "tests",
                "conf", "docs"]


def docs_paths_named() -> dict[str, str]:
    """docs/ path -> a file that names it."""
    found: dict[str, str] = {}
    for name in NAMING_FILES:
        root = ROOT / name
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.suffix in (".py", ".md", ".sh", ".yaml")]
        for path in files:
            if "notes" in path.relative_to(ROOT).parts:
                continue
            for m in DOCS_PATH.findall(path.read_text(errors="replace")):
                found.setdefault(m.rstrip("."), str(path.relative_to(ROOT)))
    return found


def test_every_docs_path_named_anywhere_exists():
    named = docs_paths_named()
    assert len(named) > 20, named
    missing = {p: f for p, f in named.items() if not (ROOT / p).exists()}
    assert missing == {}, f"docs/ paths that do not exist (path: where it is named): {missing}"


def test_every_repository_path_the_readme_names_exists():
    paths = page_paths((ROOT / "README.md").read_text())
    assert len(paths) > 20, paths
    assert [p for p in paths if not (ROOT / p).exists()] == []
