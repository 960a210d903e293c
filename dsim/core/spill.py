"""Column segments in an unnamed temporary file: a long run's per-step and per-request columns
leave RAM as they grow, so peak memory stays bounded by what is in flight (issue 17).

A million-request run logs ~7 M steps and a million ledger rows; kept in memory they are most of
the process.  Owners (``StepLog``, ``RequestLedger``) keep a short tail in an ``array`` (appends
stay as cheap as a list's) and move it here in one write once it passes their threshold; readers
get numpy arrays back, whole or a slice at a time.  The file has no name (``TemporaryFile``), so
nothing is left behind, even when the process is killed.
"""
from __future__ import annotations

import os
import tempfile
import weakref

import numpy as np


class SpillError(OSError):
    """The spill file could not be written (a full or unwritable temporary directory): a fact about
    the machine, said with where and what to do, not a traceback."""


class SpillFile:
    """Append-only store of numpy segments; a segment is ``(offset, dtype, count)``."""

    __slots__ = ("_f", "_end", "_own", "_own_at", "__weakref__")
    written = 0                       # bytes every SpillFile of this process wrote (``dsim bench`` reports it)
    _all: "weakref.WeakSet" = None    # every SpillFile of this process (for go_private)

    def __init__(self):
        self._f = None                # opened on the first write: short runs never touch the disk
        self._end = 0
        self._own = None              # after go_private: this process's own file for new segments...
        self._own_at = 0              # ...which start at this offset
        if SpillFile._all is None:
            SpillFile._all = weakref.WeakSet()
        SpillFile._all.add(self)

    @classmethod
    def go_private(cls) -> None:
        """In a forked process (the online planner's forecasts): new segments go to a file of its
        own, and the segments written before the fork are read with ``os.pread``, so neither the
        parent's file position nor its bytes past the fork are touched."""
        for sf in list(cls._all or ()):
            if sf._f is not None and sf._own is None:
                sf._own_at = sf._end
                sf._own = tempfile.TemporaryFile(prefix="dsim-spill-")

    def put(self, a) -> tuple:
        """Write ``a`` (any buffer numpy reads) at the end; return its segment."""
        a = np.ascontiguousarray(a)
        try:
            if self._f is None:
                self._f = tempfile.TemporaryFile(prefix="dsim-spill-")
            if self._own is not None:
                self._own.seek(self._end - self._own_at)
                self._own.write(a.data.cast("B"))
            else:
                self._f.seek(self._end)
                self._f.write(a.data.cast("B"))
        except OSError as e:
            raise SpillError(f"a long run spills its step and request columns to {tempfile.gettempdir()}, "
                             f"which failed ({e.strerror or e}): free space there or point TMPDIR at a "
                             "larger disk") from e
        seg = (self._end, a.dtype.str, a.size)
        self._end += a.nbytes
        SpillFile.written += a.nbytes
        return seg

    def get(self, seg: tuple, start: int = 0, count: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """The segment's values ``[start, start + count)`` (all of them from ``start`` by default),
        read into ``out`` when given (a contiguous array of the segment's dtype and that length)."""
        off, dt, n = seg
        dt = np.dtype(dt)
        count = n - start if count is None else min(count, n - start)
        if out is None:
            out = np.empty(max(count, 0), dtype=dt)
        elif out.dtype != dt or out.size != max(count, 0) or not out.flags.c_contiguous:
            raise ValueError(f"spill file: out is {out.dtype}[{out.size}], the read {dt}[{max(count, 0)}]")
        if out.size:
            at = off + start * dt.itemsize
            if self._own is not None and off >= self._own_at:
                self._own.seek(at - self._own_at)
                got = self._own.readinto(out.data.cast("B"))
            elif self._own is not None:      # a segment from before the fork: the shared file, no seek
                buf = os.pread(self._f.fileno(), out.nbytes, at)
                got = len(buf)
                out.data.cast("B")[:got] = buf
            else:
                self._f.seek(at)
                got = self._f.readinto(out.data.cast("B"))
            if got != out.nbytes:
                raise OSError(f"spill file: read {got} of {out.nbytes} bytes")
        return out

    @property
    def nbytes(self) -> int:
        return self._end

    def __getstate__(self):
        """Pickled with its bytes (a Result sent between processes keeps its spilled columns)."""
        if self._f is None:
            return (b"",)                 # a true value: pickle calls __setstate__ only for those
        if self._own is not None:
            head = os.pread(self._f.fileno(), self._own_at, 0)
            self._own.seek(0)
            return (head + self._own.read(self._end - self._own_at),)
        self._f.seek(0)
        return (self._f.read(self._end),)

    def __setstate__(self, state: tuple):
        (data,) = state
        self._f = None
        self._end = 0
        self._own, self._own_at = None, 0
        if SpillFile._all is None:
            SpillFile._all = weakref.WeakSet()
        SpillFile._all.add(self)
        if data:
            self._f = tempfile.TemporaryFile(prefix="dsim-spill-")
            self._f.write(data)
            self._end = len(data)


def concat(parts: list) -> np.ndarray:
    """One array from segments read back and an in-memory tail (no copy for a lone tail)."""
    if len(parts) == 1:
        return np.asarray(parts[0])
    return np.concatenate([np.asarray(p) for p in parts])
