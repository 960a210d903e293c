"""Conversation-level metrics (seed 002, "Conversation-Level Metrics"): requests grouped by the
session they belong to, so a report can speak of whole conversations, not only of turns.

Why: a multi-turn user waits for every turn, and a conversation's length is the sum of its queueing,
prefills and decodes.  Two deployments with the same per-request p99 can finish conversations at
different rates (one delays late turns, whose prompts carry the whole history).

A session is whatever the workload says: a ``shared_prefix`` user (multi-turn or not), a trace's
``session`` column, a tenant's sessions in a mix.  A conversation is *completed* when every one of
its turns completed; its duration runs from its first turn's arrival to its last turn's completion.
Turns a stopped run never sent count as not completed (the conversation is cut, not finished).
"""
from __future__ import annotations

import csv
import io

import numpy as np

from ..core.request import PENDING
from .measures import ledger_latencies, stats

COLUMNS = ("session", "tenant", "turns", "completed_turns", "first_arrival_s", "last_completion_s",
           "duration_ms", "ttft_mean_ms", "output_tokens")


def conversation_table(led) -> dict | None:
    """Per session (in increasing session id): the columns of ``COLUMNS`` as numpy arrays, from the
    run's sealed RequestLedger; None when no request carries a session."""
    session = led.col("session")
    rows = np.flatnonzero(session >= 0)
    if rows.size == 0:
        return None
    order = rows[np.argsort(session[rows], kind="stable")]      # each session's turns in id order
    ids, start, turns = np.unique(session[order], return_index=True, return_counts=True)
    done = led.present("t_completion")[order]
    arrival = led.col("arrival")[order]
    completion = np.where(done, led.col("t_completion")[order], -np.inf)
    ttft = ledger_latencies(led, order)["ttft_ms"]
    n_done = np.add.reduceat(done.astype(np.int64), start)
    complete = n_done == turns
    first = np.minimum.reduceat(arrival, start)
    last = np.maximum.reduceat(completion, start)
    ttft_sum = np.add.reduceat(np.where(done, ttft, 0.0), start)
    out_tok = np.add.reduceat(np.where(done, led.col("n_out")[order], 0), start)
    names = led.string_table
    tenant = led.col("tenant")[order][start]
    return {
        "session": ids, "tenant": np.array([names[c] or "" for c in tenant.tolist()], dtype=object),
        "turns": turns, "completed_turns": n_done, "complete": complete, "first_arrival_s": first,
        "last_completion_s": np.where(complete, last, np.nan),
        "duration_ms": np.where(complete, (last - first) * 1e3, np.nan),
        "ttft_mean_ms": np.where(n_done > 0, ttft_sum / np.maximum(n_done, 1), np.nan),
        "output_tokens": out_tok,
    }


def conversation_summary(led, pcts, span_s: float) -> dict | None:
    """summary.json's ``conversations``: how many, how many completed (every turn), the rate they
    complete at, and statistics per conversation (turns, duration and mean turn TTFT of the
    completed ones, output tokens); None without sessions."""
    tab = conversation_table(led)
    if tab is None:
        return None
    sent = led.col("state") != PENDING
    ok = tab["complete"]
    n, c = int(tab["session"].size), int(ok.sum())
    return {
        "grouped_by": "session",
        "conversations": n,
        "with_a_sent_turn": int(np.unique(led.col("session")[sent & (led.col("session") >= 0)]).size),
        "completed": c,
        "completion_rate": c / n,
        "completed_per_s": c / span_s if span_s > 0 else None,
        "turns": stats(tab["turns"], pcts),
        "duration_ms": stats(tab["duration_ms"][ok], pcts),
        "ttft_mean_ms": stats(tab["ttft_mean_ms"][ok], pcts),
        "output_tokens": stats(tab["output_tokens"][ok], pcts),
    }


def _cell(v) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (float, np.floating)):
        return "" if v != v else repr(round(float(v), 9))
    return str(int(v))


def conversations_csv(led) -> str | None:
    """conversations.csv: one row per session (``COLUMNS``; empty cells where a conversation did
    not complete); None without sessions."""
    tab = conversation_table(led)
    if tab is None:
        return None
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    cols = [tab[k] for k in COLUMNS]
    for i in range(tab["session"].size):
        w.writerow([_cell(col[i]) for col in cols])
    return buf.getvalue()
