"""A sweep folder: one JSON file per finished point under ``points/`` (named by the hash of the
point's resolved scenario), written atomically as each point finishes.  Re-running a sweep into
the same folder computes only the points that have no file yet, so an interrupted sweep loses at
most the points in flight and never duplicates one."""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from ..config.errors import ConfigError
from ..metrics.writers import write_atomic


def ensure_out_dir(out, sub: str | None = None) -> Path:
    """Create (and check) an output folder up front, so a bad --out fails before any simulation."""
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise ConfigError(str(out), None, "an output folder (this is a file)", show_value=False)
    try:
        (d / sub if sub else d).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(str(out), None, f"an output folder that can be written ({e.strerror})",
                          show_value=False) from None
    return d


LOCK = ".dsim-sweep.lock"


class PointStore:
    def __init__(self, out):
        self.created = not Path(out).exists()
        self.dir = ensure_out_dir(out, "points")
        self.points = self.dir / "points"
        self._lock = None

    def lock(self) -> None:
        """Hold the folder for this sweep: a second sweep into it at once would compute every point
        again and race on results.csv.  flock is released by the kernel when the process ends, so
        a crash or kill -9 leaves no stale lock."""
        try:
            import fcntl
        except ImportError:                          # not POSIX: no lock
            return
        path = self.dir / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(str(self.dir), None, f"an output folder that can be written ({e.strerror})",
                              show_value=False) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError("--out", None, f"another dsim sweep is writing {self.dir} (pid {pid}); wait for "
                              "it to finish or use another folder", show_value=False) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock = fd

    def unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)                     # closing the descriptor releases the flock
            self._lock = None

    def discard_if_new(self) -> None:
        """Remove the folder when this sweep created it and stored no point in it: a user error
        found before any point ran (a cluster that refused the connection) leaves nothing behind."""
        if self.created and not any(self.points.glob("*.json")):
            import shutil
            self.unlock()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _file(self, key: str) -> Path:
        return self.points / f"{key}.json"

    def get(self, key: str) -> dict | None:
        f = self._file(key)
        if not f.is_file():
            return None
        try:
            return json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):      # a torn file cannot exist (atomic), but be safe
            return None

    def put(self, key: str, record: dict) -> None:
        write_atomic(self._file(key), json.dumps(record, sort_keys=True) + "\n")


def table_csv(rows: list[dict], lead: list[str]) -> str:
    """Rows as CSV: the ``lead`` columns first, then every other column sorted; missing = empty."""
    cols = list(lead) + sorted({k for r in rows for k in r if not k.startswith("_")} - set(lead))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow(["" if r.get(c) is None else _cell(r.get(c)) for c in cols])
    return buf.getvalue()


def _cell(v):
    if isinstance(v, float):
        return repr(float(f"{v:.12g}"))
    if isinstance(v, (list, dict, bool)):
        return json.dumps(v)
    return v
