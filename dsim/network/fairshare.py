"""Max-min fair shares of the links' bandwidth among the flows in flight (the fabric's contended
solver), kept apart from the fabric's events so the rule can be read, and tested, on its own."""
from __future__ import annotations

import heapq


def water_fill(flows) -> None:
    """Max-min fair rates (water filling) over the links that are up.

    Progressive filling with a heap of link fair shares: the link whose share cap / unfixed
    flows is smallest saturates first, its flows get that share, and only the links those flows
    cross change.  Ties go to the link first met in flow order, and every cap is reduced in the
    same order as a full rescan would, so rates are bit-identical to the textbook loop, in
    O(F x path x log L) instead of O(L^2)."""
    if len(flows) == 1:                        # fast path: one flow gets its bottleneck
        f = flows[0]
        f.rate = 0.0 if any(not lk.up for lk in f.links) else min(lk.bw for lk in f.links)
        return
    cap: dict = {}
    users: dict = {}                           # link -> {fid: flow}, in flow order
    order: dict = {}                           # link -> first-seen index (tie-break)
    for f in flows:
        f.rate = -1.0
        if any(not lk.up for lk in f.links):
            f.rate = 0.0
            continue
        for lk in f.links:
            us = users.get(lk)
            if us is None:
                users[lk] = us = {}
                cap[lk] = lk.bw
                order[lk] = len(order)
            us[f.fid] = f
    heap = [(cap[lk] / len(us), order[lk], lk) for lk, us in users.items()]
    heapq.heapify(heap)
    while heap:
        share, _, lk = heapq.heappop(heap)
        us = users.get(lk)
        if us is None or cap[lk] / len(us) != share:
            continue                           # stale entry: the link was updated since
        touched = {}
        for f in list(us.values()):
            f.rate = share
            for other in f.links:
                cap[other] -= share
                ou = users[other]
                del ou[f.fid]
                if ou:
                    touched[other] = True
                else:
                    del users[other]
                    touched.pop(other, None)
        for other in touched:
            if other in users:
                heapq.heappush(heap, (cap[other] / len(users[other]), order[other], other))
