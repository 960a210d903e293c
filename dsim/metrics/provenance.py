"""What produced a report: package versions and the git commit of the dsim source, for manifest.json.

Nothing time-dependent is recorded, so the same scenario and seed on the same code still give
byte-identical files.
"""
from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """HEAD of the checkout dsim runs from (with '-dirty' if tracked files changed); None when
    dsim is installed from a wheel or git is unavailable."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def software_versions() -> dict:
    import numpy
    import simpy

    from .. import __version__
    return {"dsim": __version__, "git_commit": git_commit(), "python": platform.python_version(),
            "numpy": numpy.__version__, "simpy": simpy.__version__}
