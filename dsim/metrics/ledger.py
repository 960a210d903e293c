"""Finished requests as columns: a run holds ~100 bytes per request it has seen, not the request.

A request leaves the simulation when it completes or is rejected; the fleet records it here and
drops the object, so memory grows with the requests in flight, not with the ones ever seen
(issue 17).  Each field is a typed array created the first time a request has a non-default value
for it (a plain run never pays for P/D, tenants or SLO classes); ``seal`` puts the rows in request
id order.  Past ``SPILL_ROWS`` rows in memory, the columns move to a temporary file
(``dsim.core.spill``), so a million-request run holds a bounded tail.  Summaries read ``col`` arrays; ``RequestLedger`` is also a sequence of ``Request``
objects rebuilt on access (``Result.requests``), carrying what a report reads, without the
scheduler's internals (segments, block hashes).
"""
from __future__ import annotations

from array import array
from operator import attrgetter

import numpy as np

from ..core.request import Request
from ..core.spill import SpillFile, concat

# (field, array typecode, default).  "f?" = float or None (a presence bit), "s" = string or None
# (an index into the ledger's string table).  Ids and groups are 64-bit; a 32-bit column that meets
# a larger value is widened.
FIELDS = (
    ("rid", "q", 0), ("arrival", "d", 0.0), ("prompt_len", "i", 0), ("max_tokens", "i", 0),
    ("n_out", "i", 0), ("num_computed", "i", 0), ("state", "b", 0),
    ("t_routed", "f?", None), ("t_queued", "f?", None), ("t_scheduled", "f?", None),
    ("t_first_token", "f?", None), ("t_last_token", "f?", None), ("t_completion", "f?", None),
    ("t_handoff", "f?", None), ("t_kv_ready", "f?", None),
    ("ttft_slo_ms", "f?", None), ("tpot_slo_ms", "f?", None),
    ("cached_tokens", "i", 0), ("kv_ready", "i", 0), ("priority", "i", 0),
    ("prefix_group", "q", -1), ("session", "q", -1),
    ("replica", "s", None), ("prefill_replica", "s", None), ("label", "s", ""), ("tenant", "s", ""),
    ("reject_reason", "s", ""), ("slo_class", "s", ""),
    ("energy_j", "d", 0.0), ("kv_peak_bytes", "q", 0), ("t_decode_scheduled", "f?", None),
    ("decode_deferred", "b", 0),
)
NAMES = tuple(f for f, _, _ in FIELDS)
_OPTIONAL = tuple(f for f, t, _ in FIELDS if t == "f?")
_BIT = {f: 1 << i for i, f in enumerate(_OPTIONAL)}
_get_all = attrgetter(*NAMES)
BATCH = 2048                 # rows buffered as tuples before they go into the columns
SPILL_ROWS = 1 << 17         # rows in memory (~13 MB on the bench) before the columns move to the spill file
ITER_ROWS = 1 << 16          # rows read back at a time when iterating a spilled ledger


class RequestLedger:
    """Append-only columns of finished requests; after ``seal``, a sequence in request id order."""

    def __init__(self):
        self.n = 0
        self._cols: dict = {}                 # field -> array, created on the first non-default value
        self._mask = array("H")               # presence bits of the optional floats
        self._strs: list = [None, ""]         # string table; codes are indices
        self._code = {None: 0, "": 1}
        self.preempt_times: dict = {}         # rid -> tuple, only for preempted requests
        self.resume_times: dict = {}          # rid -> tuple, only for preempted requests scheduled again
        self.spec: dict = {}                  # rid -> speculative round state, only for speculative requests
        self._sealed = None                   # the Rows in rid order, after seal
        self._buf: list = []                  # rows (tuples of FIELDS) not yet in the columns
        self._spill = None                    # SpillFile, once the rows pass SPILL_ROWS
        self._segs: dict = {}                 # field (and "_mask") -> spilled segments, in row order
        self._n_spilled = 0                   # rows in the spill file; the columns hold the rest

    # ---- recording ---------------------------------------------------------------------------------
    def add(self, r) -> None:
        """Record a request whose fields are final; the caller drops it afterwards.  Rows wait in a
        small buffer of tuples and go into the columns a batch at a time (C-speed transposition)."""
        if self._sealed is not None:
            raise RuntimeError("the ledger is sealed")
        self._buf.append(_get_all(r))
        if r.preempt_times:
            self.preempt_times[r.rid] = r.preempt_times
            if r.resume_times:
                self.resume_times[r.rid] = r.resume_times
        if r.spec is not None:
            self.spec[r.rid] = r.spec
        self.n += 1
        if len(self._buf) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        buf = self._buf
        m = len(buf)
        if not m:
            return
        n0 = self.n - m                       # rows already in the columns
        mask = np.zeros(m, dtype=np.uint16)
        for (name, kind, tc, dflt), vals in zip(_STORE, zip(*buf)):
            if kind == "f?":
                if vals[0] is None and vals.count(None) == m:    # absent from the whole batch (P/D-only times...)
                    vals = [0.0] * m
                elif None in vals:
                    mask |= np.fromiter((v is not None for v in vals), dtype=bool, count=m).astype(np.uint16) \
                        * np.uint16(_BIT[name])
                    vals = [0.0 if v is None else v for v in vals]
                else:
                    mask |= np.uint16(_BIT[name])
            elif kind == "s":
                if vals.count(vals[0]) == m:     # one value in the whole batch (the usual case)
                    vals = [self._intern(vals[0])] * m
                else:
                    code = self._code
                    vals = [code[v] if v in code else self._intern(v) for v in vals]
            col = self._cols.get(name)
            if col is None:
                if vals.count(dflt) == m:
                    continue                  # still the default everywhere: no column yet
                col = self._cols[name] = array(tc, [dflt]) * (n0 - self._n_spilled)
                if self._n_spilled:           # the spilled rows had the default too
                    self._segs[name] = [self._spill.put(np.full(self._n_spilled, dflt, dtype=tc))]
            try:
                col.extend(vals)
            except OverflowError:             # a length past 2**31 (an unbounded tail): widen the column
                col = self._cols[name] = array("q", col[:n0 - self._n_spilled])   # (extend stopped part way)
                col.extend(vals)
        self._mask.frombytes(mask.tobytes())
        buf.clear()
        if self.n - self._n_spilled >= SPILL_ROWS:
            self._spill_tail()

    def _spill_tail(self) -> None:
        """Move every column's in-memory rows to the spill file (spilled segments of one column
        may differ in width: reading widens them)."""
        if self._spill is None:
            self._spill = SpillFile()
        for name, col in list(self._cols.items()) + [("_mask", self._mask)]:
            self._segs.setdefault(name, []).append(self._spill.put(np.frombuffer(col, dtype=col.typecode)))
            if name == "_mask":
                self._mask = array("H")
            else:
                self._cols[name] = array(col.typecode)
        self._n_spilled = self.n

    def _rows_from(self, name: str, start: int) -> np.ndarray:
        """A column's rows from ``start`` on, in finish order, spilled or not."""
        col = self._mask if name == "_mask" else self._cols[name]
        parts, at = [], 0
        for seg in self._segs.get(name, ()):
            if at + seg[2] > start:
                parts.append(self._spill.get(seg, max(0, start - at)))
            at += seg[2]
        parts.append(np.frombuffer(col, dtype=col.typecode)[max(0, start - at):])
        return concat(parts)

    def _spilled_column(self, name: str) -> np.ndarray:
        """A whole spilled column (after ``_spill_tail``), its segments read into one array (no
        list of pieces and their concatenation at once); segments of mixed widths are widened."""
        segs = self._segs.get(name, ())
        if len({s[1] for s in segs}) != 1:
            return self._rows_from(name, 0)
        out = np.empty(sum(s[2] for s in segs), dtype=segs[0][1])
        at = 0
        for s in segs:
            self._spill.get(s, out=out[at:at + s[2]])
            at += s[2]
        return out

    def _intern(self, v) -> int:
        c = self._code.get(v)
        if c is None:
            c = self._code[v] = len(self._strs)
            self._strs.append(v)
        return c

    @property
    def sealed(self) -> bool:
        return self._sealed is not None

    @property
    def nbytes(self) -> int:
        """Bytes of the columns (not the sparse per-request extras or the string table)."""
        if self._sealed is not None:
            return self._sealed.nbytes
        spilled = sum(seg[2] * np.dtype(seg[1]).itemsize for segs in self._segs.values() for seg in segs)
        return spilled + sum(c.itemsize * len(c) for c in self._cols.values()) + 2 * len(self._mask)

    @property
    def spilled(self) -> bool:
        """Whether the columns went to the spill file (a long run)."""
        return self._spill is not None

    def since(self, start: int) -> "Rows":
        """The rows recorded from the ``start``-th on, in the order they finished (before ``seal``):
        what a controller's observation window reads."""
        if self._sealed is not None:
            raise RuntimeError("the ledger is sealed")
        self._flush()
        arrays = {name: self._rows_from(name, start).copy() for name in self._cols}
        return Rows(arrays, self._rows_from("_mask", start).copy(), self._code)

    def seal(self) -> "RequestLedger":
        """Put the rows in request id order and freeze them as numpy arrays."""
        if self._sealed is not None:
            return self
        self._flush()
        if self._spill is not None:
            return self._seal_spilled()
        n = self.n
        rid = np.frombuffer(self._cols["rid"], dtype=np.int64) if "rid" in self._cols else np.zeros(n, np.int64)
        order = np.argsort(rid, kind="stable")
        arrays = {}
        for name, _, _ in FIELDS:
            col = self._cols.pop(name, None)
            if col is None:
                continue
            arrays[name] = np.frombuffer(col, dtype=col.typecode)[order]
            del col                               # one column copied at a time
        self._sealed = Rows(arrays, np.frombuffer(self._mask, dtype=np.uint16)[order], self._code)
        self._mask = None
        return self

    def _seal_spilled(self) -> "RequestLedger":
        """``seal`` for spilled columns: each is read back, put in id order and written again, one
        column in memory at a time."""
        self._spill_tail()
        order = None                              # finished in id order: no reordering
        if "rid" in self._cols:
            rid = self._spilled_column("rid")
            if not (rid[1:] >= rid[:-1]).all():   # the stable order is the identity just when sorted
                order = np.argsort(rid, kind="stable")
            del rid
        segs = {}
        for name in [f for f in NAMES if f in self._cols] + ["_mask"]:
            a = self._spilled_column(name)
            if order is None:
                segs[name] = self._spill.put(a)
            else:                                 # written a block at a time: one segment, no whole copy
                first = self._spill.put(a[order[:ITER_ROWS]])
                for lo in range(ITER_ROWS, self.n, ITER_ROWS):
                    self._spill.put(a[order[lo:lo + ITER_ROWS]])
                segs[name] = (first[0], first[1], self.n)
            del a
        mask = segs.pop("_mask")
        self._cols.clear()
        self._segs.clear()
        self._mask = None
        self._sealed = Rows(segs, mask, self._code, file=self._spill, n=self.n)
        return self

    # ---- columns -----------------------------------------------------------------------------------
    def _frozen(self) -> "Rows":
        if self._sealed is None:
            raise RuntimeError("seal the ledger before reading it")
        return self._sealed

    def col(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The field's values in request id order (optional floats: NaN where None; strings: codes,
        see ``strings``); rows [lo, hi) only when given."""
        return self._frozen().col(name, lo, hi)

    def present(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Where an optional float field is not None (rows [lo, hi) when given)."""
        return self._frozen().present(name, lo, hi)

    def blocks(self, size: int | None = None) -> list:
        """``(lo, hi)`` row ranges of at most ``size`` rows (``ITER_ROWS``) covering the ledger in id
        order: what a reader of a million rows takes a piece at a time, so it holds a block's
        temporaries, not a whole run's."""
        size = size or ITER_ROWS
        return [(lo, min(lo + size, self.n)) for lo in range(0, self.n, size)]

    def strings(self, name: str) -> list:
        """The field's values as Python strings (or None), in request id order."""
        return [self._strs[c] for c in self.col(name).tolist()]

    def code_of(self, value) -> int | None:
        """The code ``col`` uses for a string value (None if no request has it)."""
        return self._code.get(value)

    @property
    def string_table(self) -> list:
        return self._strs

    # ---- the sequence of requests ------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("request index out of range")
        s = self._frozen()
        return self._build({name: s.raw(name, i, i + 1)[0].item() for name in s.arrays},
                           int(s.raw_mask(i, i + 1)[0]))

    def __iter__(self):
        s = self._frozen()
        names = [name for name in NAMES if name in s.arrays]
        step = ITER_ROWS if s.file is not None else max(1, self.n)     # a spilled ledger: a block at a time
        for lo in range(0, self.n, step):
            hi = lo + step
            for row, mask in zip(zip(*(s.raw(name, lo, hi).tolist() for name in names)), s.raw_mask(lo, hi).tolist()):
                yield self._build(dict(zip(names, row)), mask)

    def _build(self, values: dict, mask: int):
        r = Request(0, 0.0, 0, 0)
        strs = self._strs
        for name, kind, _, dflt in _STORE:
            v = values.get(name, dflt)           # a field never recorded holds its default everywhere
            if kind == "f?":
                if not mask & _BIT[name]:
                    continue
            elif v == dflt:
                continue                         # the new Request has it already
            elif kind == "s":
                v = strs[v]
            setattr(r, name, v)
        r.preempt_times = self.preempt_times.get(r.rid, ())
        r.resume_times = self.resume_times.get(r.rid, ())
        r.spec = self.spec.get(r.rid)
        return r


class Rows:
    """Columns of some requests: ``col`` (fields never recorded read as their default) and
    ``present`` (optional floats).  With ``file``, ``arrays`` and ``mask`` are segments of that
    spill file, read back on each access."""

    def __init__(self, arrays: dict, mask, code: dict, file=None, n: int | None = None):
        self.arrays = arrays
        self._mask = mask
        self.file = file
        self.n = mask.size if n is None else n
        self._code = code

    def raw(self, name: str, lo: int = 0, hi: int | None = None):
        """The stored values of rows [lo, hi) (None: a field never recorded)."""
        a = self.arrays.get(name)
        if a is None or self.file is None:
            return a if a is None else a[lo:hi]
        return self.file.get(a, lo, None if hi is None else hi - lo)

    def raw_mask(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        if self.file is None:
            return self._mask[lo:hi]
        return self.file.get(self._mask, lo, None if hi is None else hi - lo)

    @property
    def mask(self) -> np.ndarray:
        return self.raw_mask()

    @property
    def nbytes(self) -> int:
        if self.file is None:
            return sum(a.nbytes for a in self.arrays.values()) + self._mask.nbytes
        return sum(s[2] * np.dtype(s[1]).itemsize for s in [*self.arrays.values(), self._mask])

    def col(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The values of rows [lo, hi) (all by default), as ``RequestLedger.col`` describes."""
        a = self.raw(name, lo, hi)
        if a is not None:
            return np.where(self.present(name, lo, hi), a, np.nan) if name in _BIT else a
        tc, dflt = _TYPE[name]
        if tc == "f?":                          # only 0.0 was recorded (the stored default)
            return np.where(self.present(name, lo, hi), 0.0, np.nan)
        m = max(0, (self.n if hi is None else min(hi, self.n)) - lo)
        if tc == "s":
            return np.full(m, self._code[dflt], dtype=np.int32)
        return np.full(m, dflt, dtype=tc)

    def present(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        return (self.raw_mask(lo, hi) & _BIT[name]) != 0


_TYPE = {f: (t, d) for f, t, d in FIELDS}
# (field, kind, array typecode, stored default): optional floats store 0.0 with the bit unset,
# strings store their code (None is 0, "" is 1)
_STORE = tuple((f, t, "d" if t == "f?" else "i" if t == "s" else t,
                0.0 if t == "f?" else (0 if d is None else 1) if t == "s" else d) for f, t, d in FIELDS)
