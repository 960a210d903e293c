"""What a link carried and when: the per-link byte timeline and the network's summary section.

Kept apart from the fluid solver (``fabric.Network`` inherits it): the solver decides rates, these
books only record what the rates moved, bin by bin, and report it at the end of a run.
"""
from __future__ import annotations

LONG_RUN_BINS = 1_000           # a settled stretch longer than this many timeline bins is kept as a run


class LinkBooks:
    """The timeline bins and summary of ``Network``'s links (its ``bin_s``, ``links`` and counters)."""

    def _bin(self, lk, t0, t1, rate) -> None:
        b = self.bin_s
        i = int(t0 // b)
        j = int(t1 // b)
        if j - i > LONG_RUN_BINS:      # days at 1 kbit/s: whole bins in closed form, not one by one
            lk.bins[i] = lk.bins.get(i, 0.0) + rate * ((i + 1) * b - t0)
            runs = lk.runs
            runs[i + 1] = runs.get(i + 1, 0.0) + rate * b
            runs[j] = runs.get(j, 0.0) - rate * b
            if t1 > j * b:
                lk.bins[j] = lk.bins.get(j, 0.0) + rate * (t1 - j * b)
            return
        while t0 < t1:
            edge = min(t1, (i + 1) * b)
            lk.bins[i] = lk.bins.get(i, 0.0) + rate * (edge - t0)
            t0 = edge
            i += 1

    def timeline(self, lk, max_bins: int = 20_000):
        """(bin start times, bytes per bin, bin width) of one link.  With long constant stretches
        (``runs``) the bins are summed into at most ``max_bins`` wider ones, in closed form."""
        b = self.bin_s
        if not lk.runs:
            idx = sorted(lk.bins)
            return [i * b for i in idx], [lk.bins[i] for i in idx], b
        import numpy as np
        lo = min(min(lk.bins), min(lk.runs))
        hi = max(max(lk.bins), max(lk.runs)) + 1
        k = max(1, -(-(hi - lo) // max_bins))      # fine bins per coarse bin
        m = -(-(hi - lo) // k)
        out = np.zeros(m)
        for i, v in lk.bins.items():
            out[(i - lo) // k] += v
        steps = np.zeros(m + 1)                     # a run from fine bin p on: part of p's coarse bin,
        for p, v in lk.runs.items():                # then k bins' worth in every later one
            c = (p - lo) // k
            out[c] += ((c + 1) * k + lo - p) * v
            steps[c + 1] += k * v
        out += np.cumsum(steps)[:m]
        return [(lo + c * k) * b for c in range(m)], out.tolist(), k * b

    def summary(self, span: float) -> dict:
        self._settle_all()
        links = {}
        for (u, v), lk in sorted(self.links.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            if not lk.bytes and not lk.busy_s:
                continue
            links[f"{u}->{v}"] = {"bytes": lk.bytes, "bandwidth_gb_s": lk.bw / 1e9,
                                  "utilization": lk.bytes / (lk.bw * span) if span > 0 else 0.0,
                                  "busy_fraction": lk.busy_s / span if span > 0 else 0.0}
        return {"transfers": self.count, "retries": self.retries, "failed": self.failed,
                "mean_transfer_ms": self.total_s / self.delivered * 1e3 if self.delivered else None,
                "outage_wait_s": self.waited_s, "outages": self.outages, "links": links}
