"""Turns the scenario's ``workload`` section into a list of Requests (open loop, in arrival order).

Shared prefixes follow inference-perf's ``shared_prefix`` data profile: ``num_groups`` system
prompts of ``system_prompt_len`` tokens, each used by ``users_per_group`` users; every request
picks a (group, user) at random and sends system prompt + question.  With ``question_pool`` each
(group, user) slot owns one fixed question, so the workload is a pool of ``num_groups x
users_per_group`` full prompts; ``order: cycle`` re-sends them in order (request n sends prompt
n mod pool size, as inference-perf's shared-prefix generator does), ``shuffled_cycle`` cycles
through a seeded permutation, ``random`` picks one per request.  With ``multi_turn`` a
user's request also carries that user's earlier questions and answers, so consecutive turns
share a growing prefix; a conversation restarts when the next prompt plus its answer would
exceed ``max_context_tokens``.  Arrivals stay open-loop: a follow-up may arrive before the
previous answer finished (then it hits only the part that is cached).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config.errors import ConfigError
from ..config.schema.workload import parse_workload
from ..core.request import Request
from .arrivals import burst_sizes, generate_arrivals
from .lengths import sample_lengths
from .traces import read_trace

# Segment ids: groups' system prompts are 1..G; questions get ids from here up; a trace's content
# block ids (Mooncake hash_ids) from _HASH_BASE up.
_QUESTION_BASE = 1 << 32
_HASH_BASE = 1 << 40


class Workload:
    """A run's requests in arrival order.  A generated workload keeps three arrays and makes each
    Request when it is read, so a run holds the requests in flight, not all of them (issue 17);
    traces, mixes and shared prefixes keep their request list.  Reading twice gives equal but
    distinct objects for a generated workload: the simulation reads it once."""

    def __init__(self, items: list | None = None, arrivals=None, prompts=None, outputs=None):
        self._items = items
        self._cols = None if items is not None else (np.asarray(arrivals, dtype=float), _narrow(prompts),
                                                     _narrow(outputs))
        self._slo = (None, None)

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else len(self._cols[0])

    def __iter__(self):
        return self.tail(0)

    def smallest(self) -> tuple[int, int] | None:
        """(prompt, output) tokens of the request needing the fewest KV slots; None when empty."""
        if self._items is not None:
            r = min(self._items, key=lambda r: r.prompt_len + r.max_tokens, default=None)
            return None if r is None else (r.prompt_len, r.max_tokens)
        _, pr, out = self._cols
        if not len(pr):
            return None
        i = int(np.argmin(pr.astype(np.int64) + out))
        return int(pr[i]), int(out[i])

    def arrival_times(self) -> np.ndarray:
        """Every request's arrival time, in order, without building the requests (a plan's early stop
        needs the measurement window before the run)."""
        if self._items is not None:
            return np.fromiter((r.arrival for r in self._items), dtype=float, count=len(self._items))
        return self._cols[0]

    def rids(self) -> np.ndarray:
        """Every request's id, in the order of ``arrival_times``."""
        if self._items is not None:
            return np.fromiter((r.rid for r in self._items), dtype=np.int64, count=len(self._items))
        return np.arange(len(self._cols[0]), dtype=np.int64)

    def tail(self, start: int):
        """The requests from index ``start`` on."""
        if self._items is not None:
            yield from self._items[start:]
            return
        arr, pr, out = self._cols
        ttft, tpot = self._slo
        for c in range(start, len(arr), 4096):          # Python numbers a chunk at a time
            for i, t, p, o in zip(range(c, c + 4096), arr[c:c + 4096].tolist(), pr[c:c + 4096].tolist(),
                                  out[c:c + 4096].tolist()):
                r = Request(i, t, p, o)
                r.ttft_slo_ms, r.tpot_slo_ms = ttft, tpot
                yield r

    def apply_slo_targets(self, classes: dict, ttft_ms, tpot_ms) -> None:
        """See ``apply_slo_targets``; a generated workload has no classes or own targets."""
        if self._items is not None:
            apply_slo_targets(self._items, classes, ttft_ms, tpot_ms)
        else:
            self._slo = (ttft_ms, tpot_ms)

    def has_ttft_targets(self) -> bool:
        if self._items is not None:
            return any(r.ttft_slo_ms is not None for r in self._items)
        return self._slo[0] is not None and len(self) > 0


def _narrow(a) -> np.ndarray:
    """Lengths as int32 when they fit (all but pathological tails): 16 bytes a request, not 24."""
    a = np.asarray(a)
    return a.astype(np.int32) if a.size and int(a.max()) < 2**31 else a


def build_requests(wl, rng, base_dir: Path | None, path: str = "workload") -> tuple[list, dict]:
    """Return (requests sorted by arrival, a description for the manifest)."""
    w, desc = build_workload(wl, rng, base_dir, path)
    return list(w), desc


def build_workload(wl, rng, base_dir: Path | None, path: str = "workload") -> tuple[Workload, dict]:
    """Return (the Workload, a description for the manifest).

    ``wl`` is the typed section (``Scenario.config.workload``); a mapping, as Python callers and
    recorded runs hold one, is validated first.  ``path`` names the section in the errors that only
    the data can raise (a trace's rows, a file of lengths)."""
    wl = parse_workload(wl, path)
    desc: dict = {"type": wl.type}
    if wl.max_concurrency is not None:
        desc["max_concurrency"] = wl.max_concurrency
    if wl.type == "mix":
        return Workload(_mix(wl, rng, base_dir, desc, path)), desc
    if wl.type == "trace":
        return Workload(_from_trace(wl, rng, base_dir, desc, path)), desc
    arrivals = generate_arrivals(wl, rng.stream("workload.arrivals"), path)
    n = len(arrivals)
    if wl.shared_prefix is not None:
        w = Workload(_shared_prefix(wl, arrivals, rng, base_dir, desc, path))
    else:
        prompts = sample_lengths(wl.prompt_tokens, f"{path}.prompt_tokens", n, rng.stream("workload.prompt_tokens"),
                                 base_dir)
        outputs = sample_lengths(wl.output_tokens, f"{path}.output_tokens", n, rng.stream("workload.output_tokens"),
                                 base_dir)
        w = Workload(arrivals=arrivals, prompts=prompts, outputs=outputs)
    desc["num_requests"] = len(w)
    return w, desc


def _from_trace(wl, rng, base_dir, desc, path: str) -> list:
    p = Path(wl.path)
    if base_dir is not None and not p.is_absolute():
        p = base_dir / p
    rows = read_trace(p, f"{path}.path")
    scale, rate, start = wl.time_scale, wl.rate, wl.start_s
    if start:
        rows = [r for r in rows if r[0] >= start]
    if wl.num_requests is not None:
        rows = rows[:wl.num_requests]
    if not rows:
        raise ConfigError(f"{path}.start_s", start, "a start before the trace's last arrival")
    t0 = rows[0][0] if start else 0.0
    if rate is not None:
        # rescale time so the selected requests' mean rate, (n - 1) / span, is exactly ``rate``
        span = rows[-1][0] - rows[0][0]
        if len(rows) < 2 or span <= 0:
            raise ConfigError(f"{path}.rate", rate, "a trace slice with arrivals at two different times")
        scale = rate * span / (len(rows) - 1)
        t0 = rows[0][0]
    scale = scale or 1.0
    rows = _override_lengths(wl, rows, rng, base_dir, path)
    times = [(t - t0) / scale for t, *_ in rows]
    if wl.burst_factor != 1:
        times = _bursts(times, wl.burst_factor, rng.stream("workload.bursts"))
    block = wl.hash_block_tokens
    out = []
    own = set()                     # requests whose content a segments column gave
    for i, (t, pr, o, g, rid, ids, attrs) in enumerate(rows):
        r = Request(i, times[i], pr, o, None, g, rid)
        if ids:
            r.segments = _hash_segments(ids, pr, block, i)
        if attrs is not None:
            for k, v in attrs.items():
                setattr(r, k, v)
            if "segments" in attrs:
                own.add(i)
        out.append(r)
    # a trace says which requests share a prefix but not how long it is: requests of one group
    # share their first ``prefix_tokens`` tokens (default: the shortest prompt of the group)
    pref = wl.prefix_tokens
    groups: dict = {}
    for r in out:
        if r.prefix_group >= 0 and r.rid not in own:
            groups.setdefault(r.prefix_group, []).append(r)
    for g, rs in groups.items():
        plen = pref if pref is not None else min(r.prompt_len for r in rs)
        for r in rs:
            k = min(plen, r.prompt_len)
            tail = r.prompt_len - k
            r.segments = ((g + 1, k),) + (((_QUESTION_BASE + r.rid, tail),) if tail else ())
    desc.update(path=str(p), time_scale=scale, num_requests=len(out))
    if rate is not None:
        desc["rate"] = rate
    if wl.burst_factor != 1:
        desc["burst_factor"] = wl.burst_factor
    return out


def _bursts(times: list, factor: float, rng) -> list:
    """A trace's arrival times with bursts: consecutive requests grouped into bursts of geometric
    size (mean (factor + 1) / 2), each request arriving at its burst's first time.  Requests keep
    their order; no request arrives later than recorded."""
    sizes = burst_sizes(rng, factor, len(times))      # at most one burst per request
    out = []
    for size in sizes.tolist():
        if len(out) >= len(times):
            break
        first = times[len(out)]
        out += [first] * min(size, len(times) - len(out))
    return out


def _override_lengths(wl, rows: list, rng, base_dir, path: str) -> list:
    """The trace's rows with prompt and/or output lengths redrawn from the override distributions
    (seed 002's ``prompt_length_override`` / ``output_length_override``); arrivals are kept."""
    pro, outo = wl.prompt_length_override, wl.output_length_override
    if pro is None and outo is None:
        return rows
    n = len(rows)
    if pro is not None:
        for i, row in enumerate(rows):
            if row[6] is not None and "segments" in row[6]:
                raise ConfigError(f"{path}.prompt_length_override", "set", "null for a trace whose rows give their "
                                  f"own segments (request {i} of {wl.path}: its segments add up to its recorded prompt)",
                                  show_value=False)
    prompts = (sample_lengths(pro, f"{path}.prompt_length_override", n,
                              rng.stream("workload.prompt_length_override"), base_dir) if pro is not None else None)
    outputs = (sample_lengths(outo, f"{path}.output_length_override", n,
                              rng.stream("workload.output_length_override"), base_dir) if outo is not None else None)
    return [(t, pr if prompts is None else int(prompts[i]), o if outputs is None else int(outputs[i]), *rest)
            for i, (t, pr, o, *rest) in enumerate(rows)]


def _hash_segments(ids, prompt_len: int, block: int, rid: int) -> tuple:
    """A prompt given as content block ids (Mooncake's hash_ids, ``block`` tokens each; the last
    may be partial) as segments: two requests share KV exactly as far as their id lists agree.
    Tokens beyond what the ids cover are unique to the request."""
    segs = []
    left = prompt_len
    for h in ids:
        if left <= 0:
            break
        k = min(block, left)
        segs.append((_HASH_BASE + h, k))
        left -= k
    if left > 0:
        segs.append((_QUESTION_BASE + rid, left))
    return tuple(segs)


def _shared_prefix(wl, arrivals: np.ndarray, rng, base_dir, desc, path: str) -> list:
    sp = wl.shared_prefix
    n = len(arrivals)
    groups, users, sys_len = sp.num_groups, sp.users_per_group, sp.system_prompt_len
    multi, max_ctx, pool, order = sp.multi_turn, sp.max_context_tokens, sp.question_pool, sp.order
    slots = groups * users
    # a pool draws one question per (group, user) slot; otherwise one per request
    n_q = slots if pool else n
    q = sample_lengths(wl.prompt_tokens, f"{path}.prompt_tokens", n_q, rng.stream("workload.prompt_tokens"), base_dir)
    o = sample_lengths(wl.output_tokens, f"{path}.output_tokens", n_q, rng.stream("workload.output_tokens"), base_dir)
    if order == "random":
        pick = rng.stream("workload.prefix").integers(0, slots, n)
    else:
        seq = (rng.stream("workload.prefix").permutation(slots) if order == "shuffled_cycle"
               else np.arange(slots))
        pick = seq[np.arange(n) % slots]
    history: dict = {}
    reqs = []
    for i in range(n):
        slot = int(pick[i])
        g = slot // users
        j = slot if pool else i
        qlen, olen = int(q[j]), int(o[j])
        segs = [(g + 1, sys_len)]
        if multi:
            hist = history.get(slot, [])
            if sys_len + sum(ln for _, ln in hist) + qlen + olen > max_ctx:
                hist = []
            segs += hist
        segs.append((_QUESTION_BASE + j, qlen))
        r = Request(i, float(arrivals[i]), sum(ln for _, ln in segs), olen, tuple(segs), g)
        r.session = slot
        if multi:
            history[slot] = segs[1:] + [(-(i + 1), olen)]
        reqs.append(r)
    desc["shared_prefix"] = dict(num_groups=groups, users_per_group=users, system_prompt_len=sys_len,
                                 multi_turn=multi, **({"question_pool": True, "order": order} if pool else {}))
    return reqs


class _PrefixedRNG:
    """The run's PartitionedRNG seen through a name prefix: each tenant of a mix draws from its
    own streams, so adding a tenant never shifts another's requests."""

    def __init__(self, rng, prefix: str):
        self.rng = rng
        self.prefix = prefix

    def stream(self, name: str):
        return self.rng.stream(self.prefix + name)


_GROUP_SHIFT = 1 << 48


def _mix(wl, rng, base_dir, desc, path: str) -> list:
    """Several tenants, each a complete workload of its own (any type but mix), merged by arrival.
    Requests are renumbered in arrival order; prompt contents never collide across tenants."""
    parts = []
    for k, c in enumerate(wl.classes):
        # c.priority None: the requests keep their own (a trace's column)
        reqs, d = build_requests(c, _PrefixedRNG(rng, f"workload.{c.name}."), base_dir, f"{path}.classes[{k}]")
        parts.append((c.name, reqs, (c.priority, c.slo_class, (c.temperature, c.top_p, c.domain))))
        desc.setdefault("classes", {})[c.name] = d
    order = sorted(((r.arrival, k, j) for k, (_, reqs, _) in enumerate(parts) for j, r in enumerate(reqs)))
    new_id = {(k, j): i for i, (_, k, j) in enumerate(order)}
    out = []
    for i, (_, k, j) in enumerate(order):
        name, reqs, (prio, cls, samp) = parts[k]
        r = reqs[j]
        r.rid = i
        r.tenant = name
        if prio is not None:                      # a tenant's keys apply to all its requests
            r.priority = prio
        if cls is not None:
            r.slo_class = cls
        if samp != (None, None, None):            # each of the tenant's set keys wins over the request's own
            own = r.sampling or (None, None, "")
            r.sampling = tuple(own[i] if v is None else v for i, v in enumerate(samp))
        if r.session >= 0:
            r.session += k << 32
        if r.segments is not None:
            r.segments = tuple((_remap(sid, k, new_id), ln) for sid, ln in r.segments)
        out.append(r)
    desc["num_requests"] = len(out)
    return out


def _remap(sid: int, k: int, new_id: dict) -> int:
    """A tenant's segment id in the merged workload.  Ids that name no request of the tenant (a
    trace's own segments column may hold any) are shifted into the tenant's range, like groups."""
    if sid >= _HASH_BASE:                     # a trace's content block: shared within the tenant only
        return sid + k * _GROUP_SHIFT
    if sid < 0:                               # an earlier answer of request -sid - 1
        j = new_id.get((k, -sid - 1))
        return sid - k * _GROUP_SHIFT if j is None else -(j + 1)
    if sid >= _QUESTION_BASE:                 # the question of request sid - base
        j = new_id.get((k, sid - _QUESTION_BASE))
        return sid + k * _GROUP_SHIFT if j is None else _QUESTION_BASE + j
    return sid + k * _GROUP_SHIFT             # a shared system prompt (group)


def apply_slo_targets(reqs, classes: dict, ttft_ms, tpot_ms) -> None:
    """Give every request its SLO targets: its own (trace columns), else its class's (``classes``:
    name -> (ttft_ms, tpot_ms)), else the scenario's.  An unknown class is an error."""
    for r in reqs:
        ttft, tpot = ttft_ms, tpot_ms
        if r.slo_class:
            if r.slo_class not in classes:
                where = f"workload (request {r.label or r.rid}).slo_class"
                raise ConfigError(where, r.slo_class, "a class of slo.classes" + (
                    f" ({', '.join(sorted(classes))})" if classes else " (there is none)"))
            ttft, tpot = classes[r.slo_class]
        if r.ttft_slo_ms is None:
            r.ttft_slo_ms = ttft
        if r.tpot_slo_ms is None:
            r.tpot_slo_ms = tpot
