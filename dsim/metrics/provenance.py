"""What produced a report: package versions and the git commit of the dsim source, for manifest.json.

The commit comes from the install record pip keeps (PEP 610 ``direct_url.json``): a wheel built
from a VCS URL carries its commit; an editable install points at its source checkout, where git
is asked.  Nothing time-dependent is recorded, so the same scenario and seed on the same code
still give byte-identical files.
"""
from __future__ import annotations

import functools
import json
import platform
import subprocess
from importlib import metadata
from urllib.parse import unquote, urlparse


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit dsim was installed from ('-dirty' if an editable checkout has changed tracked
    files); None for a plain wheel or when git is unavailable."""
    # a stale dsim.egg-info in the working folder may shadow the installed record: take the first
    # record that says where dsim was installed from
    raw = next((t for d in metadata.distributions(name="dsim") if (t := d.read_text("direct_url.json"))), None)
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    if isinstance(info.get("vcs_info"), dict):
        return info["vcs_info"].get("commit_id")
    if not (info.get("dir_info") or {}).get("editable"):
        return None
    src = unquote(urlparse(info.get("url", "")).path)
    try:
        head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", src, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


@functools.lru_cache(maxsize=1)
def software_versions() -> dict:
    import numpy
    import simpy

    from .._version import __version__
    return {"dsim": __version__, "git_commit": git_commit(), "python": platform.python_version(),
            "numpy": numpy.__version__, "simpy": simpy.__version__}
