"""The package's import graph (scripts/structure_report.py): no cycle, no arrow that imports upward.

Imports inside functions count as much as those at the top of a module: a lazy import
hides a dependency from the reader, it does not remove it. The layers are the table
`LAYERS` in the script (low to high, with the reasons).
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
report_script = load_script(ROOT / "scripts" / "structure_report.py", "structure_report")
REPORT = report_script.analyse(ROOT / "rlharness")


def test_every_module_has_a_layer():
    for module in REPORT.lines:
        report_script.layer_of(module)  # raises naming a module that no layer holds


def test_no_import_cycle():
    edges = REPORT.edges
    found = [" -> ".join(report_script.cycle_path(c, edges)) + f" (all: {', '.join(c)})"
             for c in report_script.cycles(edges)]
    assert found == [], "import cycles:\n" + "\n".join(found)


def test_no_arrow_imports_upward():
    up = [f"{a} -> {b} ({how})" for a, b, how in report_script.upward(REPORT)]
    assert up == [], "imports from a higher layer (scripts/structure_report.py LAYERS):\n" + "\n".join(up)


def test_the_graph_sees_imports_inside_functions(tmp_path):
    """A lazy import is an arrow (and a cycle through it is a cycle)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from pkg.high import g\n    return g\n")
    (package / "high.py").write_text("from pkg import low\n\ndef g():\n    return low.f\n")
    report = report_script.analyse(package)
    assert report.imports["pkg.low"] == {"pkg.high": {"function"}}
    assert report.imports["pkg.high"] == {"pkg.low": {"module"}}
    assert report_script.cycles(report.edges) == [["pkg.high", "pkg.low"]]


def test_folders_are_the_layers():
    """Each layer names whole packages: no module is lifted out of its folder into another layer, and
    no module sits loose at the top of the package."""
    for _, names in report_script.LAYERS:
        for name in names:
            path = ROOT.joinpath(*name.split("."))
            assert (path / "__init__.py").is_file(), f"{name} in LAYERS is not a package (a file-level exception)"
    loose = sorted(p.name for p in (ROOT / "rlharness").glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules loose at the top of rlharness/: {loose}"
