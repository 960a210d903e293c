"""Self-contained HTML reports (interactive charts) for every command's output folder.

``build(folder)`` reads only the files a command wrote (summary.json, results.csv, capacity.json,
...) and returns the page; the commands call ``write(folder)`` on their (temporary) output folder
after its files are written, and ``dsim report DIR`` calls ``rebuild(DIR)`` on a finished one, so
both give the same bytes.  Nothing here is imported by ``import dsim``."""
from __future__ import annotations

import os
from pathlib import Path

from ..config.errors import ConfigError

NAME = "report.html"

# kind -> files that identify it (all must exist), checked in this order
KINDS = (("run", ("summary.json", "manifest.json")), ("sweep", ("results.csv", "sweep.yaml")),
         ("capacity", ("capacity.json",)), ("plan", ("plan.md", "candidates.csv")), ("cosim", ("cosim.json",)),
         ("calibrate", ("report.json", "calibrated.yaml")))


def detect(folder) -> str:
    """The kind of output folder: run, sweep, capacity, plan, cosim or calibrate."""
    d = Path(folder)
    if not d.is_dir():
        raise ConfigError(str(folder), None, "a dsim output folder (not found)", show_value=False)
    for kind, files in KINDS:
        if all((d / f).is_file() for f in files):
            return kind
    raise ConfigError(str(folder), None, "a dsim output folder: summary.json + manifest.json (run), results.csv + "
                      "sweep.yaml (sweep), capacity.json, plan.md + candidates.csv (plan), cosim.json (cosim) or "
                      "report.json + calibrated.yaml (calibrate)", show_value=False)


def build(folder, kind: str | None = None) -> str:
    """The report.html text of an output folder."""
    d = Path(folder)
    kind = kind or detect(d)
    if kind == "run":
        from .run import build as b
    elif kind == "sweep":
        from .sweep import build as b
    elif kind == "capacity":
        from .capacity import build as b
    elif kind == "plan":
        from .plan import build as b
    else:
        from .cosim import build_calibrate, build_cosim
        b = build_cosim if kind == "cosim" else build_calibrate
    return b(d)


def write(folder, kind: str | None = None) -> Path:
    """Write ``folder/report.html`` atomically (readers see the old file or the new one)."""
    from ..metrics.writers import write_atomic
    d = Path(folder)
    text = build(d, kind)
    write_atomic(d / NAME, text)
    os.chmod(d / NAME, 0o666 & ~_umask())          # mkstemp's 0600 -> like the folder's other files
    return d / NAME


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def rebuild(folder) -> Path:
    """``dsim report DIR``: rebuild report.html of a finished output folder, and list it in the
    folder's file list (.dsim-report) so dsim may replace the folder later."""
    from ..metrics.writers import MARKER, write_atomic
    d = Path(folder)
    kind = detect(d)
    try:
        out = write(d, kind)
        m = d / MARKER
        if m.is_file():
            names = [ln for ln in m.read_text().splitlines() if ln]
            if NAME not in names:
                write_atomic(m, "".join(f"{n}\n" for n in sorted(names + [NAME])))
    except OSError as e:
        raise ConfigError(str(folder), None, f"a folder that can be written ({e.strerror})", show_value=False) from None
    return out
