"""Finished requests as columns: a run holds ~100 bytes per request it has seen, not the request.

A request leaves the simulation when it completes or is rejected; the fleet records it here and
drops the object, so memory grows with the requests in flight, not with the ones ever seen
(issue 17).  Each field is a typed array created the first time a request has a non-default value
for it (a plain run never pays for P/D, tenants or SLO classes); ``seal`` puts the rows in request
id order.  Summaries read ``col`` arrays; ``RequestLedger`` is also a sequence of ``Request``
objects rebuilt on access (``Result.requests``), carrying what a report reads, without the
scheduler's internals (segments, block hashes).
"""
from __future__ import annotations

from array import array
from operator import attrgetter

import numpy as np

from ..core.request import Request

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
)
NAMES = tuple(f for f, _, _ in FIELDS)
_OPTIONAL = tuple(f for f, t, _ in FIELDS if t == "f?")
_BIT = {f: 1 << i for i, f in enumerate(_OPTIONAL)}
_get_all = attrgetter(*NAMES)
BATCH = 2048                 # rows buffered as tuples before they go into the columns


class RequestLedger:
    """Append-only columns of finished requests; after ``seal``, a sequence in request id order."""

    def __init__(self):
        self.n = 0
        self._cols: dict = {}                 # field -> array, created on the first non-default value
        self._mask = array("H")               # presence bits of the optional floats
        self._strs: list = [None, ""]         # string table; codes are indices
        self._code = {None: 0, "": 1}
        self.preempt_times: dict = {}         # rid -> tuple, only for preempted requests
        self.spec: dict = {}                  # rid -> speculative round state, only for speculative requests
        self._sealed = None                   # the Rows in rid order, after seal
        self._buf: list = []                  # rows (tuples of FIELDS) not yet in the columns

    # ---- recording ---------------------------------------------------------------------------------
    def add(self, r) -> None:
        """Record a request whose fields are final; the caller drops it afterwards.  Rows wait in a
        small buffer of tuples and go into the columns a batch at a time (C-speed transposition)."""
        if self._sealed is not None:
            raise RuntimeError("the ledger is sealed")
        self._buf.append(_get_all(r))
        if r.preempt_times:
            self.preempt_times[r.rid] = r.preempt_times
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
                if None in vals:
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
                col = self._cols[name] = array(tc, [dflt]) * n0
            try:
                col.extend(vals)
            except OverflowError:             # a length past 2**31 (an unbounded tail): widen the column
                col = self._cols[name] = array("q", col[:n0])     # (extend stopped part way)
                col.extend(vals)
        self._mask.frombytes(mask.tobytes())
        buf.clear()

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
            return sum(a.nbytes for a in self._sealed.arrays.values()) + self._sealed.mask.nbytes
        return sum(c.itemsize * len(c) for c in self._cols.values()) + 2 * len(self._mask)

    def since(self, start: int) -> "Rows":
        """The rows recorded from the ``start``-th on, in the order they finished (before ``seal``):
        what a controller's observation window reads."""
        if self._sealed is not None:
            raise RuntimeError("the ledger is sealed")
        self._flush()
        arrays = {name: np.frombuffer(col, dtype=col.typecode)[start:].copy() for name, col in self._cols.items()}
        return Rows(arrays, np.frombuffer(self._mask, dtype=np.uint16)[start:].copy(), self._code)

    def seal(self) -> "RequestLedger":
        """Put the rows in request id order and freeze them as numpy arrays."""
        if self._sealed is not None:
            return self
        self._flush()
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

    # ---- columns -----------------------------------------------------------------------------------
    def _frozen(self) -> "Rows":
        if self._sealed is None:
            raise RuntimeError("seal the ledger before reading it")
        return self._sealed

    def col(self, name: str) -> np.ndarray:
        """The field's values in request id order (optional floats: NaN where None; strings: codes,
        see ``strings``)."""
        return self._frozen().col(name)

    def present(self, name: str) -> np.ndarray:
        """Where an optional float field is not None."""
        return self._frozen().present(name)

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
        return self._build({name: a[i].item() for name, a in s.arrays.items()}, int(s.mask[i]))

    def __iter__(self):
        s = self._frozen()
        names = [name for name in NAMES if name in s.arrays]
        for row, mask in zip(zip(*(s.arrays[name].tolist() for name in names)), s.mask.tolist()):
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
        r.spec = self.spec.get(r.rid)
        return r


class Rows:
    """Columns of some requests: ``col`` (fields never recorded read as their default) and
    ``present`` (optional floats)."""

    def __init__(self, arrays: dict, mask: np.ndarray, code: dict):
        self.arrays = arrays
        self.mask = mask
        self.n = mask.size
        self._code = code

    def col(self, name: str) -> np.ndarray:
        a = self.arrays.get(name)
        if a is not None:
            return np.where(self.present(name), a, np.nan) if name in _BIT else a
        tc, dflt = _TYPE[name]
        if tc == "f?":                          # only 0.0 was recorded (the stored default)
            return np.where(self.present(name), 0.0, np.nan)
        if tc == "s":
            return np.full(self.n, self._code[dflt], dtype=np.int32)
        return np.full(self.n, dflt, dtype=tc)

    def present(self, name: str) -> np.ndarray:
        return (self.mask & _BIT[name]) != 0


_TYPE = {f: (t, d) for f, t, d in FIELDS}
# (field, kind, array typecode, stored default): optional floats store 0.0 with the bit unset,
# strings store their code (None is 0, "" is 1)
_STORE = tuple((f, t, "d" if t == "f?" else "i" if t == "s" else t,
                0.0 if t == "f?" else (0 if d is None else 1) if t == "s" else d) for f, t, d in FIELDS)
