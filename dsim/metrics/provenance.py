"""What produced a report: package versions and the git commit of the dsim source, for manifest.json.

The commit comes from the install record pip keeps (PEP 610 ``direct_url.json``): a wheel built
from a VCS URL carries its commit; an editable install points at its source checkout, where git
is asked.  Nothing time-dependent is recorded, so the same scenario and seed on the same code
still give byte-identical files.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
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
    import subprocess               # here: a run that writes no manifest never needs it
    try:
        head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", src, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


_HASHES: dict = {}          # (path, inode, size, mtime_ns, ctime_ns) -> sha256: a sweep hashes its trace once


def data_file_hashes(paths) -> list[dict]:
    """[{path, bytes, sha256}] of the data files a run read (traces, LUTs, coefficient files,
    acceptance curves, gamma heads, model config.json), sorted by path: the manifest names what the
    results rest on by content, not only by a path whose file may have changed since."""
    out = []
    for p in sorted(set(paths)):
        try:
            st = os.stat(p)
            key = (p, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if key not in _HASHES:
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                if len(_HASHES) > 256:
                    _HASHES.clear()
                _HASHES[key] = h.hexdigest()
            out.append({"path": p, "bytes": st.st_size, "sha256": _HASHES[key]})
        except OSError as e:                  # removed or unreadable since the run read it: say so
            out.append({"path": p, "bytes": None, "sha256": None, "error": e.strerror})
    return out


@functools.lru_cache(maxsize=1)
def software_versions() -> dict:
    import numpy
    import simpy

    import platform

    from .._version import __version__
    return {"dsim": __version__, "git_commit": git_commit(), "python": platform.python_version(),
            "numpy": numpy.__version__, "simpy": simpy.__version__}
