"""Plots of a run: latency CDFs and the queue / running / KV-usage timeline."""
from __future__ import annotations

import numpy as np


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "dsim"
    return plt


def latency_cdfs(lat: dict, path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, title in zip(axes, ("ttft_ms", "tpot_ms", "e2e_ms"), ("TTFT", "TPOT", "E2E")):
        v = np.sort(np.asarray(lat[key], dtype=float))
        if v.size:
            ax.plot(v, np.arange(1, v.size + 1) / v.size)
        ax.set_title(f"{title} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def timeline(log, total_blocks: int, path, max_points: int = 4000) -> None:
    plt = _plt()
    t = np.asarray(log.t_end)
    idx = np.linspace(0, t.size - 1, min(t.size, max_points)).astype(int) if t.size else np.arange(0)
    fig, ax = plt.subplots(2, 1, figsize=(11, 5), sharex=True)
    ax[0].plot(t[idx], np.asarray(log.waiting)[idx], label="waiting")
    ax[0].plot(t[idx], np.asarray(log.running)[idx], label="running")
    ax[0].set_ylabel("requests")
    ax[0].legend(loc="upper right")
    ax[1].plot(t[idx], np.asarray(log.kv_used, dtype=float)[idx] / max(1, total_blocks))
    _finish_timeline(plt, fig, ax, path)


def fleet_timeline(insts, path, max_points: int = 2000) -> None:
    """Queue depth (waiting + running) and KV usage per replica over time."""
    plt = _plt()
    fig, ax = plt.subplots(2, 1, figsize=(11, 5), sharex=True)
    for inst in insts:
        log = inst.log
        t = np.asarray(log.t_end)
        if not t.size:
            continue
        idx = np.linspace(0, t.size - 1, min(t.size, max_points)).astype(int)
        depth = np.asarray(log.waiting) + np.asarray(log.running)
        ax[0].plot(t[idx], depth[idx], label=inst.name, lw=0.8)
        ax[1].plot(t[idx], np.asarray(log.kv_used, dtype=float)[idx] / max(1, inst.kv.total), lw=0.8)
    ax[0].set_ylabel("waiting + running")
    if len(insts) <= 12:
        ax[0].legend(loc="upper right", fontsize=7, ncol=2)
    _finish_timeline(plt, fig, ax, path)


def _finish_timeline(plt, fig, ax, path) -> None:
    ax[1].set_ylabel("KV blocks used")
    ax[1].set_xlabel("simulated time (s)")
    for a in ax:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)


def network_timeline(net, path, max_links: int = 12) -> None:
    """Utilisation (bytes carried / capacity) per link per ``timeline_bin_s``, busiest links first."""
    plt = _plt()
    links = sorted((lk for lk in net.links.values() if lk.bins), key=lambda lk: -lk.bytes)[:max_links]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    b = net.bin_s
    for lk in links:
        idx = sorted(lk.bins)
        ax.step([i * b for i in idx], [lk.bins[i] / (lk.bw * b) for i in idx], where="post",
                label=f"{lk.u}->{lk.v}", lw=0.8)
    ax.set_ylabel("link utilisation")
    ax.set_xlabel("simulated time (s)")
    ax.grid(alpha=0.3)
    if links:
        ax.legend(loc="upper right", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
