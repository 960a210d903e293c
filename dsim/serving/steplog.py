"""The replica's per-step series (what summary.json, plots and the memory bound read).

A long run takes millions of steps, so only what an exact statistic of summary.json needs is kept
whole: step durations and tokens emitted (ITL percentiles, busy time) and KV blocks in use (the
duration-weighted mean usage).  Step end times, batch tokens, running and waiting counts are kept
for the last ``CHUNK`` steps; older chunks fold into exact totals and peaks and min/max points
for the plots.  Past ``SPILL_STEPS`` steps, the whole series move to a temporary file
(``dsim.core.spill``): their arrays hold only the recent steps, and readers take ``chunks``.
``keep_all`` keeps every series whole in memory, for readers of single steps: the timeline trace
(``output.timeline``) and co-simulation's windows.
"""
from __future__ import annotations

from array import array

import numpy as np

from ..core.spill import SpillFile

CHUNK = 1 << 16              # steps per folded chunk
PLOT_POINTS = 1024           # min/max points kept per chunk and plotted series
SPILL_STEPS = 1 << 18        # whole series past this many steps in memory move to the spill file (4 MB)
NEVER = 1 << 62              # ``fold_at`` of a log that keeps every step (an int: stretches count down to it)


class StepLog:
    """Per-step series as typed arrays: 8 bytes a value instead of a list slot plus a float object
    (~32 bytes), and appends as cheap as a list's; numpy reads them without a copy."""

    __slots__ = ("t_end", "dur", "prefill_tokens", "decode_tokens", "itl_count", "running", "waiting", "kv_used",
                 "keep_all", "fold_at", "_prefill", "_decode", "_peak_running", "_peak_waiting", "_folded", "_spill",
                 "_segs", "_n_spilled")
    FLOATS = ("t_end", "dur")
    CHUNKED = ("t_end", "prefill_tokens", "decode_tokens", "running", "waiting")
    SERIES = ("t_end", "dur", "prefill_tokens", "decode_tokens", "itl_count", "running", "waiting", "kv_used")
    WHOLE = ("dur", "itl_count", "kv_used")

    def __init__(self, keep_all: bool = False):
        for k in self.SERIES:
            setattr(self, k, array("d" if k in self.FLOATS else "i"))     # counts fit in int32
        self.keep_all = keep_all
        self.fold_at = NEVER if keep_all else CHUNK     # chunk length that triggers ``fold``
        self._prefill = 0                 # over folded chunks: prefill and decode tokens, peaks
        self._decode = 0
        self._peak_running = 0
        self._peak_waiting = 0
        self._folded = {"running": [], "waiting": [], "depth": [], "kv": []}    # name -> [(t, y) per chunk]
        self._spill = None                # SpillFile of the WHOLE series' older steps, once they spill
        self._segs = {k: [] for k in self.WHOLE}
        self._n_spilled = 0

    def append(self, t_end: float, dur: float, prefill: int, decode: int, itl: int, running: int, waiting: int,
               kv: int) -> None:
        """One step (the replica's loop does the same inline: it runs millions of times)."""
        self.t_end.append(t_end)
        self.dur.append(dur)
        self.prefill_tokens.append(prefill)
        self.decode_tokens.append(decode)
        self.itl_count.append(itl)
        self.running.append(running)
        self.waiting.append(waiting)
        self.kv_used.append(kv)
        if len(self.running) >= self.fold_at:
            self.fold()

    def quiet_rows(self, k: int, n_dec: int) -> None:
        """The constant columns of ``k`` quiet decode steps (prefill 0, decode, ITL count and running
        ``n_dec``, waiting 0) whose t_end, dur and kv_used a stretch appended already."""
        z = array("i", [0]) * k
        c = array("i", [n_dec]) * k
        self.prefill_tokens.extend(z)
        self.decode_tokens.extend(c)
        self.itl_count.extend(c)
        self.running.extend(c)
        self.waiting.extend(z)

    def fold(self) -> None:
        """Fold the chunk of running, waiting and token counts into totals, peaks and plot points."""
        n = len(self.running)
        t = np.asarray(self.t_end)
        kv = np.asarray(self.kv_used[len(self.kv_used) - n:])     # a copy: kv_used keeps growing
        run = np.asarray(self.running)
        wait = np.asarray(self.waiting)
        self._prefill += int(np.asarray(self.prefill_tokens).sum(dtype=np.int64))
        self._decode += int(np.asarray(self.decode_tokens).sum(dtype=np.int64))
        self._peak_running = max(self._peak_running, int(run.max()))
        self._peak_waiting = max(self._peak_waiting, int(wait.max()))
        for name, y in (("running", run), ("waiting", wait), ("depth", run + wait), ("kv", kv)):
            self._folded[name].append(tuple(a.copy() for a in minmax_decimate(t, y, PLOT_POINTS)))
        del t, run, wait, kv
        for k in self.CHUNKED:
            setattr(self, k, array("d" if k in self.FLOATS else "i"))
        if len(self.dur) >= SPILL_STEPS:          # folds come at chunk ends, so every series restarts together
            if self._spill is None:
                self._spill = SpillFile()
            self._n_spilled += len(self.dur)
            for k in self.WHOLE:
                self._segs[k].append(self._spill.put(np.frombuffer(getattr(self, k), dtype=getattr(self, k).typecode)))
                setattr(self, k, array("d" if k in self.FLOATS else "i"))

    # ---- exact statistics over every step ----------------------------------------------------------
    @property
    def steps(self) -> int:
        return self._n_spilled + len(self.dur)

    def chunks(self, *names: str):
        """Aligned pieces of the named ``WHOLE`` series, in step order: one tuple per spilled
        segment, then the in-memory steps."""
        for segs in zip(*(self._segs[k] for k in names)):
            yield tuple(self._spill.get(s) for s in segs)
        if len(self.dur):
            yield tuple(np.asarray(getattr(self, k)) for k in names)

    def total_tokens(self) -> int:
        """Batch tokens (prefill + decode) over every step."""
        return sum(self.token_totals())

    def token_totals(self) -> tuple:
        """(prefill tokens, decode tokens) over every step (verification chunks count as decode)."""
        return (self._prefill + int(np.asarray(self.prefill_tokens).sum(dtype=np.int64)),
                self._decode + int(np.asarray(self.decode_tokens).sum(dtype=np.int64)))

    def peak_running(self) -> int:
        return max(self._peak_running, max(self.running, default=0))

    def peak_waiting(self) -> int:
        return max(self._peak_waiting, max(self.waiting, default=0))

    def series(self, name: str) -> tuple:
        """(step end times, values) of ``running``, ``waiting``, ``depth`` (their sum) or ``kv``
        (blocks in use) for a plot: every step of the current chunk, min/max points of the folded ones."""
        n = len(self.running)
        t = np.asarray(self.t_end)
        run, wait = np.asarray(self.running), np.asarray(self.waiting)
        y = {"running": run, "waiting": wait, "depth": run + wait,
             "kv": np.asarray(self.kv_used)[len(self.kv_used) - n:]}[name]
        if self._folded[name]:                  # the same density of points as the folded chunks
            t, y = minmax_decimate(t, y, max(2, PLOT_POINTS * n // CHUNK))
        parts = self._folded[name] + [(t, y)]
        return (np.concatenate([np.asarray(a, dtype=float) for a, _ in parts]),
                np.concatenate([np.asarray(b, dtype=float) for _, b in parts]))


def minmax_decimate(t, y, max_points: int):
    """At most ~max_points points that keep each bin's minimum and maximum, in time order."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    if t.size <= max_points:
        return t, y
    nb = max(1, max_points // 2)
    edges = np.linspace(0, t.size, nb + 1).astype(int)
    ts, ys = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        if b <= a:
            continue
        seg = y[a:b]
        i, j = a + int(np.argmin(seg)), a + int(np.argmax(seg))
        for k in sorted({i, j}):
            ts.append(t[k])
            ys.append(y[k])
    return np.asarray(ts), np.asarray(ys)
