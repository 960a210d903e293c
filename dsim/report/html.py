"""The page shell of a report.html: one self-contained file, Vega-Lite charts drawn by vega-embed.

The JavaScript (Vega, Vega-Lite and vega-embed, ~0.9 MB) comes from vl-convert-python's
``javascript_bundle`` and is inlined, so the page opens without a network.  Bundling takes a few
seconds, so the bundle is kept in the user's cache folder (keyed by the vl-convert version) and
re-used by later reports.  The page holds no timestamp and no random id (charts are ``chart-1``,
``chart-2``, ... in page order), so the same inputs give the same bytes.

No ``http://`` or ``https://`` appears in the file: the bundle's own URL strings (the SVG namespace,
links in error messages) are written ``http:\\/\\/``, the same string to JavaScript.
"""
from __future__ import annotations

import html
import json
import os
import re
import tempfile
from pathlib import Path

_URL = re.compile(r"(https?):(?://)")


def no_urls(text: str) -> str:
    """``http://`` -> ``http:\\/\\/`` (JavaScript and JSON read both the same): no URL in the file."""
    return _URL.sub(r"\1:\\/\\/", text)


def esc(text) -> str:
    """HTML text with any ``://`` written as character references (a path or note shows the same)."""
    return html.escape(str(text)).replace("://", ":&#47;&#47;")


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsim"


def vega_bundle() -> str:
    """vega + vega-lite + vega-embed as one script defining ``vegaEmbed`` (cached on disk)."""
    import vl_convert as vlc
    key = re.sub(r"[^A-Za-z0-9._-]", "_", f"{vlc.__version__}-{vlc.get_vega_version()}")
    f = _cache_dir() / f"vega-embed-{key}.js"
    try:
        text = f.read_text()
        if text.endswith("\n//dsim:end\n"):          # a whole file (written atomically, but be safe)
            return text[: -len("//dsim:end\n")]
    except (OSError, UnicodeDecodeError):
        pass
    text = no_urls(vlc.javascript_bundle()).replace("</script", "<\\/script") + "\n"
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{f.name}.", dir=f.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(text + "//dsim:end\n")
        os.replace(tmp, f)
    except OSError:
        pass                                            # no cache: bundle again next time
    return text


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1100px;
padding:1em 1.5em;color:#222}
h1{font-size:1.45em;margin:.3em 0}h2{font-size:1.15em;margin:1.4em 0 .4em;border-bottom:1px solid #ddd}
p.answer{font-size:1.15em;font-weight:600;background:#eef5ff;border-left:4px solid #3b73c4;padding:.6em .8em}
p.band{background:#f7f7f7;border-left:4px solid #999;padding:.5em .8em}
p.warn{background:#fff4e5;border-left:4px solid #e69500;padding:.5em .8em}
p.note{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}.tw{overflow-x:auto}td{max-width:36em}
.chart{margin:.6em 0}
.headline{display:flex;flex-wrap:wrap;gap:.6em}.headline div{background:#f6f8fa;padding:.4em .7em;border-radius:4px}
.headline b{display:block;font-size:1.2em}
footer{color:#888;font-size:.8em;margin-top:2em}
"""


class Page:
    """Sections of a report in order: headings, paragraphs, tables and charts."""

    def __init__(self, title: str, kind: str):
        self.title, self.kind = title, kind
        self.parts: list[str] = []
        self.specs: list[tuple[str, dict]] = []

    def h2(self, text: str) -> None:
        self.parts.append(f"<h2>{esc(text)}</h2>")

    def para(self, text: str, cls: str = "") -> None:
        self.parts.append(f'<p{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>{esc(text)}</p>')

    def headline(self, items) -> None:
        """Big numbers in a row: [(label, value text)]."""
        cells = "".join(f"<div>{esc(k)}<b>{esc(v)}</b></div>" for k, v in items)
        self.parts.append(f'<div class="headline">{cells}</div>')

    def table(self, header, rows, left: int = 1) -> None:
        """A plain table; the first ``left`` columns are left-aligned (names)."""
        def cell(tag, i, v):
            lft = i < left or (isinstance(v, str) and len(v) > 12)
            return f"<{tag}{' class=l' if lft else ''}>{esc(fmt(v))}</{tag}>"
        head = "".join(cell("th", i, h) for i, h in enumerate(header))
        body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
        self.parts.append(f'<div class="tw"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')

    def data(self, name: str, rows: list) -> None:
        """Rows as JSON in the page (id ``data-NAME``): every point, for scripts and for search."""
        self.parts.append(f'<script type="application/json" id="data-{name}">{_json(rows)}</script>')

    def chart(self, spec: dict) -> None:
        cid = f"chart-{len(self.specs) + 1}"
        self.specs.append((cid, spec))
        self.parts.append(f'<div class="chart" id="{cid}"></div>')

    def render(self) -> str:
        specs = ",".join(f'"{cid}":{_json(spec)}' for cid, spec in self.specs)
        boot = ("const SPECS={" + specs + "};\n"
                "for (const [id, spec] of Object.entries(SPECS)) {\n"
                "  vegaEmbed('#' + id, spec, {renderer: 'svg', actions: false})"
                ".catch(e => console.error(e));\n}\n")
        return no_urls(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{esc(self.title)}</title>\n<meta name=\"generator\" content=\"dsim report ({self.kind})\">\n"
            f"<style>{_CSS}</style>\n<script>\n{vega_bundle()}</script>\n</head>\n<body>\n"
            f"<h1>{esc(self.title)}</h1>\n" + "\n".join(self.parts)
            + "\n<footer>Written by dsim; rebuild with <code>dsim report FOLDER</code>. Charts: hover a mark for "
              "its values, drag to pan, scroll to zoom, double-click to reset.</footer>\n"
            + f"<script>\n{boot}</script>\n</body>\n</html>\n")


def _json(obj) -> str:
    """Compact, sorted JSON safe inside <script> (no '</' sequence)."""
    return json.dumps(_finite(obj), sort_keys=True, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def _finite(obj):
    if isinstance(obj, float) and obj != obj or obj in (float("inf"), float("-inf")):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:
            return "n/a"
        if v and (abs(v) >= 1e7 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)
