"""A deliberately plain re-implementation of the V1 scheduling rules, one explicit loop over every
running request per step, used to cross-check the optimised Instance (lazy decoders, O(1) steps).
No prefix caching, no alpha delays."""
from collections import deque

from dsim.latency.base import BatchShape


class R:
    def __init__(self, rid, arrival, prompt, out):
        self.rid, self.arrival, self.prompt, self.out = rid, arrival, prompt, out
        self.comp = 0
        self.n_out = 0
        self.blocks = 0
        self.prefilling = False
        self.t_sched = self.t_first = self.t_done = None
        self.preempts = 0


def cdiv(a, b):
    return -(-a // b)


def simulate(reqs, *, budget, max_seqs, bs, total_blocks, step_time, thr=0):
    pending = deque(sorted(reqs, key=lambda r: (r.arrival, r.rid)))
    waiting, running = deque(), []
    free = total_blocks
    t = 0.0
    steps = []
    while pending or waiting or running:
        while pending and pending[0].arrival <= t:
            waiting.append(pending.popleft())
        if not waiting and not running:
            t = pending[0].arrival
            continue
        left = budget
        sched = []
        preempted = False
        i = 0
        while i < len(running):
            r = running[i]
            i += 1
            if left <= 0:
                continue
            need = r.prompt + r.n_out - r.comp
            if 0 < thr < need:
                need = thr
            need = min(need, left)
            blocks = cdiv(r.comp + need, bs) - r.blocks
            self_pre = False
            while blocks > free:
                v = running.pop()
                free += v.blocks
                v.blocks, v.comp, v.prefilling = 0, 0, False
                v.preempts += 1
                waiting.appendleft(v)
                preempted = True
                if v is r:
                    self_pre = True
                    break
            if self_pre:
                break
            free -= blocks
            r.blocks += blocks
            left -= need
            sched.append((r, need))
        if not preempted:
            while waiting and left > 0 and len(running) < max_seqs:
                r = waiting[0]
                need = r.prompt + r.n_out
                if 0 < thr < need:
                    need = thr
                need = min(need, left)
                blocks = cdiv(need, bs)
                if blocks > free:
                    break
                waiting.popleft()
                free -= blocks
                r.blocks = blocks
                r.prefilling = True
                if r.t_sched is None:
                    r.t_sched = t
                running.append(r)
                left -= need
                sched.append((r, need))
        pt = npf = pairs = pctx = dt = dctx = samp = 0
        for r, c in sched:
            if r.prefilling:
                pt += c
                npf += 1
                pairs += c * r.comp + c * (c + 1) // 2
                pctx += r.comp
                if r.comp + c == r.prompt + r.n_out:
                    samp += 1
            else:
                dt += 1
                dctx += r.comp + 1
                samp += 1
        dur = step_time(BatchShape(pt, npf, pairs, pctx, dt, dctx, samp))
        t += dur
        steps.append((t, pt, dt))
        for r, c in sched:
            r.comp += c
            if r.comp == r.prompt + r.n_out:
                r.prefilling = False
                r.n_out += 1
                if r.n_out == 1:
                    r.t_first = t
                if r.n_out == r.out:
                    r.t_done = t
                    free += r.blocks
                    r.blocks = 0
                    running.remove(r)
    return steps
