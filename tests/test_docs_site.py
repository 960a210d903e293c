"""The documentation site (mkdocs.yml): every page is in the nav, and the strict build passes.

The nav check needs only PyYAML, so it runs everywhere: a new docs/*.md page left out of the nav
fails here. The build needs the docs extra (pip install -e ".[docs]") and is skipped without it.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"


def _nav_pages(node) -> list:
    """Every page path of a MkDocs nav: strings, {title: path} and {title: [sections...]}."""
    if isinstance(node, str):
        return [] if "://" in node else [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return []


def _api_members() -> list:
    """(page, object path) for every member named in a ``::: module`` block's ``members`` list in
    docs/api/: mkdocstrings silently drops a listed member that no longer exists."""
    out = []
    for page in sorted((DOCS / "api").glob("*.md")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("::: "):
                continue
            ident = line[4:].strip()
            block = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and not nxt.startswith("    "):
                    break
                block.append(nxt[4:])
            opts = (yaml.safe_load("\n".join(block)) or {}).get("options") or {}
            out += [(page.stem, f"{ident}.{m}") for m in opts.get("members") or []]
            if not opts.get("members"):
                out.append((page.stem, ident))
    return out


def _config() -> dict:
    if not CONFIG.exists():
        pytest.skip("mkdocs.yml is not beside the tests (the suite runs without the checkout)")
    return yaml.safe_load(CONFIG.read_text())


def test_every_docs_page_is_in_the_nav():
    cfg = _config()
    nav = _nav_pages(cfg["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    missing = [p for p in pages if p not in nav]
    assert not missing, f"docs pages not in mkdocs.yml's nav (add them): {missing}"
    stale = [p for p in nav if not (DOCS / p).is_file()]
    assert not stale, f"nav entries without a page: {stale}"
    assert len(nav) == len(set(nav)), "a page is listed twice in the nav"
    assert cfg.get("strict") is True


def test_docs_site_builds_strict(tmp_path):
    _config()
    for mod in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(mod, reason=f"{mod} not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(CONFIG), "-d", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "index.html").is_file()
    assert (site / "tasks" / "size-a-deployment" / "index.html").is_file()
    api = (site / "api" / "dsim" / "index.html").read_text()
    for name in ("dsim.run", "dsim.load_scenario", "dsim.capacity", "dsim.ConfigError"):
        assert f'id="{name}"' in api, f"{name} missing from the generated API reference"
    listed = _api_members()
    assert len(listed) > 20
    gone = [obj for page, obj in listed if f'id="{obj}"' not in (site / "api" / page / "index.html").read_text()]
    assert not gone, f"API reference entries no longer in dsim (update docs/api/): {gone}"
    assert (site / "search" / "search_index.json").is_file()
