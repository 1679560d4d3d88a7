"""Build the documentation site, open its first page in headless Chromium, check it, screenshot it.

    python scripts/site_screenshot.py --out home.png

`mkdocs build --strict` (every warning an error: broken links and anchors, pages left out of the
nav) into a temporary folder, served on a free local port; Chromium renders the first page (its
JavaScript included) and the rendered DOM must carry the site's title and every top-level section
of `mkdocs.yml`'s nav. Exit 1 naming what is missing. Needs `chromium` (Debian's package, which
`scripts/setup.sh` installs as root).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WINDOW = (1280, 900)
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@dataclass
class Page:
    title: str
    nav_sections: list[str]  # the top-level nav titles found in the rendered page
    dom: str


def site_config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def expected_sections(config: dict) -> list[str]:
    """The top-level sections of the nav (entries that hold pages), in order."""
    return [next(iter(entry)) for entry in config["nav"] if isinstance(entry, dict)
            and isinstance(next(iter(entry.values())), list)]


def build(site_dir: Path) -> None:
    """`mkdocs build --strict`; raises with mkdocs' output when it fails."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                          cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's banner about its future
    if done.returncode != 0:
        raise RuntimeError(f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}")


def browser() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        raise RuntimeError("no headless browser: install Debian's chromium (apt-get install chromium; "
                           "scripts/setup.sh does it as root)")
    return found


@contextlib.contextmanager
def served(site_dir: Path):
    """The built site on http://127.0.0.1:<free port>/ for as long as the block runs."""
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the test's output is the check, not the access log
        pass


def chromium(url: str, *args: str, timeout_s: float = 300) -> str:
    """Run headless Chromium on `url` (its profile in a temporary folder); its stdout."""
    with tempfile.TemporaryDirectory(prefix="rlh-chromium-") as profile:
        command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
                   f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=5000", *args, url]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def rendered(url: str, sections: list[str]) -> Page:
    """The page as the browser rendered it: its <title> and which nav sections it shows."""
    dom = chromium(url, "--dump-dom")
    match = re.search(r"<title>(.*?)</title>", dom, re.S)
    nav = dom[dom.find('class="md-nav md-nav--primary"'):] if 'md-nav--primary' in dom else ""
    labels = {html.unescape(re.sub(r"\s+", " ", t)).strip() for t in re.findall(r">([^<>]+)<", nav)}
    return Page(title=html.unescape(match.group(1)).strip() if match else "",
                nav_sections=[s for s in sections if s in labels], dom=dom)


def screenshot(url: str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    chromium(url, f"--screenshot={out.resolve()}")
    if not out.exists():
        raise RuntimeError(f"the browser wrote no screenshot to {out}")
    return out


def check(out: Path) -> list[str]:
    """Build, render, screenshot; the problems found (none: the page is right)."""
    config = site_config()
    sections = expected_sections(config)
    with tempfile.TemporaryDirectory(prefix="rlh-site-") as tmp:
        build(Path(tmp))
        with served(Path(tmp)) as url:
            page = rendered(url, sections)
            screenshot(url, out)
    problems = []
    if page.title != config["site_name"]:
        problems.append(f"the first page's title is {page.title!r}, not {config['site_name']!r}")
    missing = [s for s in sections if s not in page.nav_sections]
    if missing:
        problems.append(f"the rendered navigation lacks {missing}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site-home.png", help="where the screenshot goes")
    args = parser.parse_args(argv)
    problems = check(args.out)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(f"screenshot: {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
