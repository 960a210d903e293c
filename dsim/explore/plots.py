"""Figures of the explore layer: metric vs one swept key (lines per hue), capacity curves with the knee."""
from __future__ import annotations

from pathlib import Path

DEFAULT_PANELS = ("p99_ttft_ms", "p99_tpot_ms", "output_throughput", "goodput_fraction")
LABELS = {"p99_ttft_ms": "TTFT p99 (ms)", "p99_tpot_ms": "TPOT p99 (ms)", "p99_e2el_ms": "E2E p99 (ms)",
          "output_throughput": "output tokens/s", "request_throughput": "completed req/s",
          "goodput_fraction": "share of requests meeting the SLO", "request_goodput": "goodput (req/s)"}


def _mpl():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


SLO_COLS = {"p99_ttft_ms": "goodput_slo_ttft_ms", "p99_tpot_ms": "goodput_slo_tpot_ms"}


def _spans(vals) -> bool:
    v = [x for x in vals if _num(x) and x > 0]
    return len(v) >= 2 and max(v) / min(v) > 10


def sweep_plot(rows, path: Path, metric=None, x=None, hue=None, title="") -> None:
    """One panel per metric, two panels a row: mean over seeds vs ``x``, one line per ``hue`` value;
    the scenario's SLO dashed, overloaded points crossed, log axes where values span a decade;
    failed points skipped."""
    if x is None:
        return
    plt = _mpl()
    ok = [r for r in rows if r.get("status") == "ok"]
    metrics = [metric] if metric else [m for m in DEFAULT_PANELS if any(m in r for r in ok)]
    if not ok or not metrics:
        return
    xs = []
    for r in ok:
        if r[x] not in xs:
            xs.append(r[x])
    numeric = all(_num(v) for v in xs)
    hues = []
    for r in ok:
        h = r.get(hue) if hue else None
        if h not in hues:
            hues.append(h)
    ncol = min(2, len(metrics))
    nrow = (len(metrics) + 1) // 2
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.5 * nrow), squeeze=False)
    for ax in axes.flat[len(metrics):]:
        ax.set_visible(False)
    for ax, m in zip(axes.flat, metrics):
        for i, h in enumerate(hues):
            pts = []
            for xv in xs:
                sel = [r for r in ok if r[x] == xv and (hue is None or r.get(hue) == h) and _num(r.get(m))]
                if sel:
                    pts.append((xv, sum(r[m] for r in sel) / len(sel), any(r.get("stability_overloaded") for r in sel)))
            if not pts:
                continue
            px = [p[0] if numeric else xs.index(p[0]) for p in pts]
            line, = ax.plot(px, [p[1] for p in pts], marker="o", ms=3,
                            label=None if hue is None else f"{hue.split('.')[-1]}={h}")
            over = [(a, p[1]) for a, p in zip(px, pts) if p[2]]
            if over:
                ax.plot(*zip(*over), "x", ms=9, mew=2, color=line.get_color(),
                        label="overloaded" if i == 0 else None)
        slo = next((r[SLO_COLS[m]] for r in ok if m in SLO_COLS and _num(r.get(SLO_COLS[m]))), None)
        if slo is not None:
            ax.axhline(slo, color="tab:red", ls="--", lw=1)
            ax.annotate(f"SLO {slo:g} ms", (0.01, slo), xycoords=("axes fraction", "data"), fontsize=7,
                        color="tab:red", va="bottom")
        vals = [r.get(m) for r in ok] + ([slo] if slo else [])
        if _spans(vals) and not m.endswith("fraction"):
            ax.set_yscale("log")
        if numeric and _spans(xs):
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=30, ha="right")
        ax.set_xlabel(x)
        ax.set_ylabel(LABELS.get(m, m))
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        axes.flat[ncol - 1].legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                                   borderaxespad=0)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def capacity_plot(probes, answer, slos, path: Path, title="", xlabel="offered load (req/s)") -> None:
    """Throughput and the SLO percentiles vs the searched load; the answer (knee) marked."""
    plt = _mpl()
    probes = sorted(probes, key=lambda p: p["value"])
    xs = [p["value"] for p in probes]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    a1.plot(xs, [p.get("request_throughput", float("nan")) for p in probes], marker="o", ms=3, label="completed req/s")
    if all("request_goodput" in p for p in probes):
        a1.plot(xs, [p["request_goodput"] for p in probes], marker="s", ms=3, label="goodput req/s")
    a1.set_xlabel(xlabel)
    a1.set_ylabel("req/s")
    for metric, bound in slos.items():
        ys = [p.get(metric, float("nan")) for p in probes]
        line, = a2.plot(xs, ys, marker="o", ms=3, label=metric)
        a2.axhline(bound, ls="--", color=line.get_color(), lw=1)
    a2.set_yscale("log")
    a2.set_xlabel(xlabel)
    a2.set_ylabel("ms (dashed: SLO)")
    for ax in (a1, a2):
        if answer is not None:
            ax.axvline(answer, color="k", lw=1, ls=":")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
