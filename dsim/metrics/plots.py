"""Plots of a run: latency CDFs, the queue / running / KV-usage timeline, network links.

Every figure names its scenario, model and hardware; SLOs and p50/p99 are marked on the CDFs;
timelines keep each bin's minimum and maximum (a short spike survives decimation), show KV usage
in percent, and mark the arrival rate and scale events; legends sit outside the data.
"""
from __future__ import annotations

import numpy as np

from ..serving.steplog import minmax_decimate
from .exact import percentiles


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "dsim"
    return plt


def run_title(name: str, overrides=()) -> str:
    """'quickstart (workload.rate=40, engine.max_num_seqs=64)': the scenario as actually run."""
    ovs = [str(o).strip() for o in overrides or () if str(o).strip()]
    return f"{name} ({', '.join(ovs)})" if ovs else name


def title_of(scn) -> str:
    """'name (--set overrides): model on hardware' (pools listed for fleets)."""
    pools = getattr(scn.fleet, "pools", None) or []
    return fleet_title(scn.name, getattr(scn, "overrides", ()), scn.model.name, scn.device.name,
                       [(p.replicas, p.model.name, p.device.name) for p in pools])


def fleet_title(name: str, overrides, model: str, hardware: str, pools=()) -> str:
    """``title_of`` from plain values (a report's manifest.json has them): pools are (replicas,
    model, hardware) triples."""
    if len(pools) > 1:
        what = ", ".join(f"{n} x {m.split('/')[-1]} on {d}" for n, m, d in pools)
    else:
        what = f"{model} on {hardware}"
        if pools and pools[0][0] > 1:
            what = f"{pools[0][0]} x {what}"
    return f"{run_title(name, overrides)}: {what}"


def latency_cdfs(lat: dict, path, title: str = "", slos: dict | None = None) -> None:
    plt = _plt()
    slos = slos or {}
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.6))         # two panels a row (fits a page)
    for ax, key, name in zip(axes.flat, ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms"), ("TTFT", "TPOT", "E2E", "queueing")):
        v = np.sort(np.asarray(lat.get(key, ()), dtype=float))
        pos = v[v > 0]
        if pos.size >= 2 and pos[-1] / pos[0] > 10:     # values spanning more than a decade: log axis
            ax.set_xscale("log")
        if v.size:
            ax.plot(v, np.arange(1, v.size + 1) / v.size, lw=1.2)
            for q, mk in ((50, "o"), (99, "s")):
                x = float(percentiles(v, q))
                ax.plot([x], [q / 100], mk, ms=5, color="k")
                ax.annotate(f"p{q} {x:.4g}", (x, q / 100), textcoords="offset points",
                            xytext=(-6, -12) if q == 99 else (6, 2), ha="right" if q == 99 else "left", fontsize=7)
        bound = slos.get(key)
        if bound is not None:
            if v.size and bound > 1.5 * v[-1]:        # far right of the data: say so, keep the scale
                ax.annotate(f"SLO {bound:g} ms (off scale) \u2192", (1.0, 0.04), xycoords="axes fraction",
                            ha="right", fontsize=7, color="tab:red")
            else:
                ax.axvline(bound, color="tab:red", ls="--", lw=1)
                ax.annotate(f"SLO {bound:g} ms", (bound, 0.05), textcoords="offset points", xytext=(3, 0),
                            fontsize=7, color="tab:red")
        ax.set_title(f"{name} CDF ({v.size} requests)", fontsize=9)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    # fixed margins: tight_layout measured every text of the figure and cost a third of a run
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.9 if title else 0.95, wspace=0.22, hspace=0.4)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def _arrival_rate(ax, arrivals, color="tab:gray"):
    """Arrivals per second (binned) on a twin axis."""
    a = np.asarray(arrivals, dtype=float)
    if a.size < 2:
        return
    span = a.max() - a.min()
    b = max(span / 100, 1e-3)
    edges = np.arange(a.min(), a.max() + b, b)
    if edges.size < 2:
        return
    h, e = np.histogram(a, edges)
    tw = ax.twinx()
    tw.step(e[:-1], h / b, where="post", color=color, lw=0.8, alpha=0.7, label="arrivals/s")
    tw.set_ylabel("arrivals/s", color=color, fontsize=8)
    tw.tick_params(axis="y", labelcolor=color, labelsize=7)
    return tw


def timeline(series: dict, path, max_points: int = 4000, title: str = "", arrivals=()) -> None:
    """One replica: requests waiting and running, KV cache used (%); ``series``: name -> (times,
    values) for "waiting", "running" and "kv_pct"."""
    plt = _plt()
    fig, ax = plt.subplots(2, 1, figsize=(11, 5.2), sharex=True)
    for name in ("waiting", "running"):
        ax[0].plot(*minmax_decimate(*series[name], max_points), label=name, lw=0.8)
    ax[0].set_ylabel("requests")
    tw = _arrival_rate(ax[0], arrivals)
    handles = ax[0].get_legend_handles_labels()
    if tw is not None:
        h2 = tw.get_legend_handles_labels()
        handles = (handles[0] + h2[0], handles[1] + h2[1])
    ax[0].legend(*handles, loc="upper left", bbox_to_anchor=(1.06, 1.0), fontsize=7, borderaxespad=0)
    ax[1].plot(*minmax_decimate(*series["kv_pct"], max_points), lw=0.8)
    _finish_timeline(plt, fig, ax, path, title)


def fleet_timeline(replicas, path, max_points: int = 2000, title: str = "", arrivals=(), scale_events=()) -> None:
    """Queue depth (waiting + running) and KV usage per replica over time; scale events marked.
    ``replicas``: (name, {"depth": (times, values), "kv_pct": (times, values)}) pairs."""
    plt = _plt()
    fig, ax = plt.subplots(2, 1, figsize=(11, 5.2), sharex=True)
    for name, series in replicas:
        ax[0].plot(*minmax_decimate(*series["depth"], max_points), label=name, lw=0.8)
        ax[1].plot(*minmax_decimate(*series["kv_pct"], max_points), lw=0.8)
    colors = {"scale_out": "tab:green", "scale_in": "tab:orange", "retired": "tab:red"}
    seen = set()
    for ev in scale_events:
        kind = ev["event"]
        for a in ax:
            a.axvline(ev["time_s"], color=colors.get(kind, "k"), ls=":", lw=0.9,
                      label=kind.replace("_", " ") if a is ax[0] and kind not in seen else None)
        seen.add(kind)
    ax[0].set_ylabel("waiting + running")
    tw = _arrival_rate(ax[0], arrivals)
    h, lab = ax[0].get_legend_handles_labels()
    if tw is not None:
        h2, l2 = tw.get_legend_handles_labels()
        h, lab = h + h2, lab + l2
    if len(h) <= 24:
        ax[0].legend(h, lab, loc="upper left", bbox_to_anchor=(1.06, 1.0), fontsize=7, borderaxespad=0)
    _finish_timeline(plt, fig, ax, path, title)


def _finish_timeline(plt, fig, ax, path, title="") -> None:
    ax[1].set_ylabel("KV cache used (%)")
    ax[1].set_ylim(0, 105)
    ax[1].set_xlabel("simulated time (s)")
    for a in ax:
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    # fixed margins with room on the right for the legends outside the axes (no tight_layout, no
    # tight bounding box: each measured every text and drew the figure once more)
    fig.subplots_adjust(left=0.07, right=0.80, bottom=0.09, top=0.91 if title else 0.96, hspace=0.08)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def network_timeline(net, path, max_links: int = 12, title: str = "") -> None:
    """Utilisation (bytes carried / capacity) per link per ``timeline_bin_s``, busiest links first."""
    plt = _plt()
    links = sorted((lk for lk in net.links.values() if lk.bins), key=lambda lk: -lk.bytes)[:max_links]
    fig, ax = plt.subplots(figsize=(11, 3.8))
    for lk in links:
        xs, ys, b = net.timeline(lk)
        ax.step(xs, [y * 100 / (lk.bw * b) for y in ys], where="post", label=f"{lk.u}->{lk.v}", lw=0.8)
    ax.set_ylabel("link utilisation (%)")
    ax.set_xlabel("simulated time (s)")
    ax.grid(alpha=0.3)
    if links:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)
    if title:
        ax.set_title(title, fontsize=10)
    fig.subplots_adjust(left=0.07, right=0.80, bottom=0.13, top=0.9)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def class_tails(classes: dict, path, kind: str, title: str = "") -> None:
    """Seed 002's tail plots: p95 and p99 TTFT, TPOT and E2E per fairness class (``classes``: name ->
    {"ttft_ms", "tpot_ms", "e2e_ms"} arrays of its completed requests; ``kind`` names the grouping).
    Bars side by side, so a class whose tail runs away from the others shows at a glance."""
    plt = _plt()
    names = list(classes)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    x = np.arange(len(names))
    for ax, key, label in zip(axes, ("ttft_ms", "tpot_ms", "e2e_ms"), ("TTFT", "TPOT", "E2E")):
        for j, (q, color) in enumerate(((95, "tab:blue"), (99, "tab:red"))):
            vals = [float(percentiles(np.asarray(classes[n][key], dtype=float), q)) if len(classes[n][key]) else 0.0
                    for n in names]
            ax.bar(x + (j - 0.5) * 0.38, vals, width=0.38, color=color, label=f"p{q}")
        ax.set_xticks(x)
        ax.set_xticklabels([f"{n}\n({len(classes[n]['e2e_ms'])})" for n in names], fontsize=7)
        ax.set_title(f"{label} tail by {kind}", fontsize=9)
        ax.set_ylabel("ms")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.2, top=0.84 if title else 0.9, wspace=0.25)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
