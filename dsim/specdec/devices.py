"""Draft devices: phones, laptops and edge GPUs that draft tokens for distributed speculative decoding.

A device is one busy loop (architecture rule: one per device, never one per token) that drafts
for its conversations in FIFO order: a chain of callbacks with one SimPy event per job when it
drafts one round at a time, a SimPy process when it batches rounds (``max_batch`` > 1).
Drafting k tokens costs k batch-1 decode steps of the drafter model on the device, timed by a
draft-side LUT of the profile's ``lut_ids`` when one covers the drafter, else by dsim's roofline with
the device's bandwidth and FLOP/s (quantised weights read fewer bytes: int4 weights move a quarter
of the bf16 bytes).  A batch of rounds is capped by ``max_parallel_tokens`` and by the drafter KV
that fits in ``kv_cache_limit_mb``.  Thermal
throttling slows drafting by ``throttle_factor`` after ``throttle_after_s`` of continuous work
(reset by ``cooldown_s`` idle); availability windows pause drafting; energy is power x drafting
time, or ``joules_per_token`` when the profile gives it.
"""
from __future__ import annotations

from collections import deque
from heapq import heappush
from dataclasses import dataclass
from functools import lru_cache

from simpy.events import NORMAL

from ..config.files import read_yaml
from ..config.files import package_folder
from ..config.hardware import DeviceProfile, resolve_profile
from ..latency.base import BatchShape
from ..latency.roofline import RooflineModel
from ..network.fabric import Wake

DRAFT_PROFILE_DIR = package_folder("dsim.device_profiles") / "drafts"   # device_profiles/drafts/
DRAFT_LUT_DIR = DRAFT_PROFILE_DIR / "luts"                                 # draft-side LUTs, by id
LINKS_FILE = package_folder("dsim.device_profiles") / "links" / "access.yaml"   # default_link classes
SUMS_KEPT = 1 << 16      # (context, k) drafting times a group remembers (DraftDevice._start)


@dataclass(frozen=True)
class DraftProfile:
    name: str
    kind: str
    peak_tflops: float
    mem_gb_s: float
    memory_gb: float
    weight_bits: int
    compute_efficiency: float
    memory_efficiency: float
    step_overhead_ms: float
    power_w: float
    joules_per_token: float | None
    throttle_after_s: float | None
    throttle_factor: float
    cooldown_s: float
    source: str = ""            # where the figures come from (datasheet, memory configuration)
    lut_ids: tuple = ()         # draft-side latency tables (device_profiles/drafts/luts/<id>.csv)
    kv_cache_limit_mb: float | None = None    # the drafter's KV memory: bounds a draft batch's contexts
    max_parallel_tokens: int | None = None    # tokens per forward pass: caps a batch, splits a wide tree level
    default_link: tuple | None = None         # (rtt_ms, bw_mbps, class name or "") for groups that give none

    def step_model(self, drafter):
        """The drafter's step-time model on this device: the first of ``lut_ids`` whose draft_decode
        rows are for this drafter, else the roofline."""
        for lid in self.lut_ids:
            table = _draft_tables(lid).get(drafter.name)
            if table is not None:
                return DraftLut(table, lid, self.step_overhead_ms * 1e-3)
        return self.roofline(drafter)
    storage_gb_s: float | None = None   # storage read rate: a cold drafter loads at it (dsim.specdec.devmem)

    def roofline(self, drafter) -> RooflineModel:
        """The drafter's step-time model on this device."""
        dev = DeviceProfile(name=self.name, peak_flops=self.peak_tflops * 1e12,
                            hbm_bytes_s=self.mem_gb_s * 1e9 * drafter.bytes_per_param * 8 / self.weight_bits,
                            memory_bytes=self.memory_gb * 1e9, interconnect_bytes_s=1e9, interconnect_latency_s=0.0,
                            tdp_w=self.power_w)
        return RooflineModel(drafter, dev, 1, curve=False, compute_efficiency=self.compute_efficiency,
                             memory_efficiency=self.memory_efficiency, step_overhead_us=self.step_overhead_ms * 1e3)


class DraftLut:
    """A drafter's token time from a draft-side LUT's draft_decode rows (interpolated by context
    and batch, dsim.latency.lut.LutTable), plus the profile's per-step overhead."""

    pure = True
    name = "lut"

    def __init__(self, table, lut_id: str, overhead_s: float):
        self.table, self.lut_id, self.overhead_s = table, lut_id, overhead_s

    def step_time(self, b: BatchShape) -> float:
        n = max(b.decode_tokens, 1)
        return float(self.table.lookup("draft_decode", b.decode_ctx_sum / n, n)[0]) * 1e-3 + self.overhead_s


@lru_cache(maxsize=None)
def _draft_tables(lut_id: str) -> dict:
    """drafter model name -> LutTable of the draft_decode rows (TP 1) of device_profiles/drafts/luts/<id>.csv."""
    from ..latency.lut import LutTable, read_lut
    rows = [r for r in read_lut(DRAFT_LUT_DIR / f"{lut_id}.csv")
            if r["phase"] == "draft_decode" and r["tensor_parallel"] == 1 and r["fanout_k"] == 1]
    by_model: dict = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    return {m: LutTable(rs, f"{lut_id}.csv") for m, rs in by_model.items()}


def lut_ids() -> list[str]:
    return sorted(f.stem for f in DRAFT_LUT_DIR.glob("*.csv"))


@lru_cache(maxsize=None)
def access_links() -> dict:
    """Link classes of device_profiles/links/access.yaml: name -> (rtt_ms, bw_mbps)."""
    d = read_yaml(LINKS_FILE.read_text(), shipped=True) or {}
    return {str(k): (float(v["rtt_ms"]), float(v["bw_mbps"])) for k, v in d.items()}


@lru_cache(maxsize=None)
def _profiles() -> dict:
    out = {}
    for f in sorted(DRAFT_PROFILE_DIR.glob("*.yaml")):
        for k, v in (read_yaml(f.read_text(), shipped=True) or {}).items():
            out[str(k)] = v
    return out


def _from_spec(name: str, spec, path: str = "") -> DraftProfile:
    """A DraftProfile from a validated profile (dsim.config.schema.speculation.DraftDeviceProfile);
    its LUT ids and link class are checked here (``path``: the profile's key)."""
    from ..config.errors import ConfigError
    kw = {k: getattr(spec, k) for k in type(spec).model_fields if k != "name"}
    known = lut_ids()
    for i, lid in enumerate(spec.lut_ids):
        if lid not in known:
            raise ConfigError(f"{path}.lut_ids[{i}]", lid, f"a draft LUT id ({', '.join(known) or 'none shipped'})")
    kw["lut_ids"] = tuple(spec.lut_ids)
    link = spec.default_link
    if isinstance(link, str):
        classes = access_links()
        if link not in classes:
            raise ConfigError(f"{path}.default_link", link, f"a link class ({', '.join(sorted(classes))}) "
                              "or {rtt_ms, bw_mbps}")
        kw["default_link"] = (*classes[link], link)
    elif link is not None:
        kw["default_link"] = (link.rtt_ms, link.bw_mbps, "")
    return DraftProfile(name=name, **kw)


def _build(name: str, d, path: str) -> DraftProfile:
    """A named profile of the profile files, validated by the schema model inline profiles use."""
    from ..config.schema.base import parse
    from ..config.schema.speculation import DraftDeviceProfile
    return _from_spec(name, parse(DraftDeviceProfile, d, path), path)


def load_draft_profile(value, path: str) -> DraftProfile:
    """A profile name from device_profiles/drafts/, or an inline profile: a validated
    ``InlineDraftProfile`` (a scenario's, parsed at the door) or a mapping with the same keys."""
    from ..config.schema.base import Section
    if isinstance(value, Section):
        return _from_spec(value.name, value, path)
    if isinstance(value, dict):
        from ..config.schema.base import parse
        from ..config.schema.speculation import InlineDraftProfile
        spec = parse(InlineDraftProfile, value, path)
        return _from_spec(spec.name, spec, path)
    return resolve_profile(value, path, _profiles(), _build, "draft device profile")


class DraftDevice:
    """One device's drafting loop.  ``submit(k, ctx, done)`` queues a job; ``done()`` runs when
    the k tokens are drafted (and the next queued job starts at once)."""

    direct = True     # False: every job goes through the queue (the general path ``_start`` must equal; tests)

    def __init__(self, env, name: str, group, drafter, think_rng=None, token_cache=None, sum_cache=None):
        self.env = env
        self.name = name
        self.group = group
        self.kind = group.profile.kind
        self.prof = group.profile
        self.step = self.prof.step_model(drafter)
        # kv_cache_limit_mb: the drafter's KV of the contexts a batch holds must fit in it
        lim = self.prof.kv_cache_limit_mb
        self.kv_budget = None if lim is None else (lim * 1e6, drafter.kv_bytes_per_token)
        self.largest_batch = 0        # most rounds drafted together (max_batch, max_parallel_tokens, KV)
        # batch-1 token times by context: the same for every device of a group (one profile, one
        # drafter), so the runtime hands its devices one shared dict; a round looks up k of them
        self._tok = token_cache if token_cache is not None else {}
        # (ctx, k) -> the sum of those k token times, added in order (what _draft's loop gives);
        # shared by the group like _tok, for ``_start``
        self._sums = sum_cache if sum_cache is not None else {}
        self.windows = group.available
        self.jobs: deque = deque()
        self._wake = None
        self.busy_s = 0.0
        self.energy_j = 0.0
        self.tokens = 0
        self.throttled_s = 0.0
        self.hot_since = None
        self.last_end = -float("inf")
        self.next_free = 0.0          # closed loop: the user's next request may start from here
        self.requests: list = []
        self.think_rng = think_rng    # the group's think-time stream (closed loop)
        self._busy = False            # max_batch 1: a job is drafting or waiting for its window
        self.mem = None               # DeviceMemory (dsim.specdec.devmem): drafter KV and weights, when modelled
        if group.max_batch > 1:
            env.process(self._loop())

    def available_from(self, t: float) -> float:
        """Earliest time >= t at which the device is available (inf if never again)."""
        if not self.windows:
            return t
        for a, b in self.windows:
            if t < b:
                return max(t, a)
        return float("inf")

    def token_time(self, ctx: int) -> float:
        t = self._tok.get(ctx)
        if t is None:
            t = self._tok[ctx] = self.step.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=ctx + 1,
                                                                num_sampled=1, running=1))
        return t

    def submit(self, k: int, ctx: int, done, lost=None, steps=None, model=None, seconds=None, req=None) -> None:
        """Draft k tokens after ctx; ``done()`` when drafted, ``lost()`` if the device goes offline
        for good before it starts (its conversation must then finish without it).  ``steps``: a
        tree's tokens per forward pass (dsim.specdec.tree.DraftTree.draft_steps), None for a chain;
        ``model``: another drafter's roofline on this device (a portfolio's), None for its own;
        ``seconds``: the drafting time when the caller costs it (a multi-level chain's); ``req``: the
        request, for the device's KV cache (dsim.specdec.devmem)."""
        if (self.direct and not self._busy and steps is None and model is None and seconds is None and req is None
                and self.group.max_batch == 1 and not self.windows and self.mem is None):
            # an idle device drafting one round at a time, always available, no drafter memory, a
            # chain on its own drafter: it starts at once, as _next_job then _draft would start it
            self._start(k, ctx, done)
            return
        self.jobs.append((k, ctx, done, lost, steps, model, seconds, req))
        if self.group.max_batch > 1:
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()
        elif not self._busy:
            self._next_job()

    def batch_times(self, jobs) -> list:
        """Drafting several rounds together: draft step j runs every job with k >= j as one batch
        (the drafter's roofline at batch n_j); returns each job's finish offset, in job order."""
        order = sorted(range(len(jobs)), key=lambda i: jobs[i][0])
        n = len(jobs)
        ctx = sum(c for _, c, *_ in jobs)
        t, j, out, i = 0.0, 1, [0.0] * n, 0
        while i < n:
            t += self.step.step_time(BatchShape(decode_tokens=n - i, decode_ctx_sum=ctx + (n - i) * j,
                                                num_sampled=n - i, running=n - i))
            while i < n and jobs[order[i]][0] <= j:
                out[order[i]] = t
                ctx -= jobs[order[i]][1]
                i += 1
            j += 1
        return out

    # ---- one job at a time (max_batch 1): callbacks, one SimPy event per job ---------------------
    # A process would cost two more per round (a wake-up when a job arrives at an idle device, a
    # resume after drafting); the callbacks do the same work at the same instants.
    def _next_job(self) -> None:
        env = self.env
        while self.jobs:
            job = self.jobs.popleft()
            t = self.available_from(env.now)
            if t == float("inf"):
                if job[3] is not None:    # offline for good: hand the round back
                    job[3]()
                continue
            self._busy = True
            if t > env.now:
                ev = env.timeout(t - env.now)
                ev.callbacks.append(lambda _e, job=job: self._draft(job))
            else:
                self._draft(job)
            return
        self._busy = False

    def _start(self, k: int, ctx: int, done) -> None:
        """``_next_job`` and ``_draft`` for a chain job on an idle device (``submit`` says which): the same
        thermal state, the same per-token times summed in the same order, the same timeout."""
        self._busy = True
        env, p = self.env, self.prof
        now = env._now
        if self.hot_since is None or now - self.last_end >= p.cooldown_s:
            self.hot_since = now
        sums = self._sums
        d = sums.get((ctx, k))
        if d is None:                    # the first round of this (context, k): _draft's loop
            tok = self._tok
            d = 0
            for c in range(ctx, ctx + k):
                t = tok.get(c)
                d += t if t is not None else self.token_time(c)
            if len(sums) < SUMS_KEPT:
                sums[ctx, k] = d
        if p.throttle_after_s is not None and now - self.hot_since >= p.throttle_after_s:
            d /= p.throttle_factor
            self.throttled_s += d
        # env.timeout(d)'s key (Environment.schedule's push, inlined)
        heappush(env._queue, (now + d, NORMAL, next(env._eid), Wake(self._drafted, (k, d, done))))

    def _draft(self, job) -> None:
        k, ctx, done, _, steps, model, seconds, req = job
        env, p = self.env, self.prof
        now = env.now
        mem = self.mem
        if mem is not None:
            wait = mem.cold_wait(now)    # a cold drafter loads first (once), then the round drafts
            if wait:
                ev = env.timeout(wait)
                ev.callbacks.append(lambda _e: self._draft(job))
                return
        if self.hot_since is None or now - self.last_end >= p.cooldown_s:
            self.hot_since = now
        if seconds is not None:
            d = seconds
        elif steps is None and model is None:
            tok = self._tok
            d = 0
            for c in range(ctx, ctx + k):
                t = tok.get(c)
                d += t if t is not None else self.token_time(c)
        else:
            step = (model or self.step).step_time
            mpt = p.max_parallel_tokens
            passes = [(j, t) for j, t in enumerate(steps or [1] * k)] if mpt is None else \
                [(j, min(mpt, t - i)) for j, t in enumerate(steps or [1] * k) for i in range(0, t, mpt)]
            d = sum(step(BatchShape(decode_tokens=t, decode_ctx_sum=t * (ctx + j + 1), num_sampled=t, running=1))
                    for j, t in passes)
        if req is not None:              # the context the device's KV cache lacks
            d += mem.extra_seconds(model or self.step, req, ctx, k)
        if p.throttle_after_s is not None and now - self.hot_since >= p.throttle_after_s:
            d /= p.throttle_factor
            self.throttled_s += d
        # env.timeout(d)'s key (Environment.schedule's push, inlined)
        heappush(env._queue, (env._now + d, NORMAL, next(env._eid), Wake(self._drafted, (k, d, done))))

    def _drafted(self, ev) -> None:
        """A job's k tokens took d seconds and are out: ``done()``, then the next queued job."""
        k, d, done = ev.arg
        p = self.prof
        self.busy_s += d
        self.tokens += k
        self.energy_j += p.joules_per_token * k if p.joules_per_token is not None else p.power_w * d
        self.last_end = self.env._now
        if self.mem is not None:
            self.mem.drafted(self.last_end)
        done()
        if self.jobs:
            self._next_job()
        else:
            self._busy = False

    # ---- batches (max_batch > 1): a process --------------------------------------------------------
    def _loop(self):
        env = self.env
        cap = self.group.max_batch
        if self.prof.max_parallel_tokens is not None:      # one token per round per pass
            cap = min(cap, self.prof.max_parallel_tokens)
        while True:
            if not self.jobs:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            yield from self._batch(cap)

    def _batch(self, cap: int):
        """Up to ``cap`` queued rounds drafted together, after waiting ``max_wait_ms`` for the batch
        to fill; each round's ``done()`` fires when its own k tokens are out."""
        env, p = self.env, self.prof
        if len(self.jobs) < cap and self.group.max_wait_s:
            yield env.timeout(self.group.max_wait_s)
        t = self.available_from(env.now)
        if t == float("inf"):
            while self.jobs:
                lost = self.jobs.popleft()[3]
                if lost is not None:
                    lost()
            return
        if t > env.now:
            yield env.timeout(t - env.now)
        if self.mem is not None:         # a cold drafter loads first (dsim.specdec.devmem)
            wait = self.mem.cold_wait(env.now)
            while wait:
                yield env.timeout(wait)
                wait = self.mem.cold_wait(env.now)
        jobs = [self.jobs.popleft()]
        if self.kv_budget is None:
            jobs += [self.jobs.popleft() for _ in range(min(cap - 1, len(self.jobs)))]
        else:                         # rounds join while their contexts' KV fits (the first always drafts)
            limit, per_tok = self.kv_budget
            used = (jobs[0][1] + jobs[0][0]) * per_tok
            while len(jobs) < cap and self.jobs:
                need = (self.jobs[0][1] + self.jobs[0][0]) * per_tok
                if used + need > limit:
                    break
                used += need
                jobs.append(self.jobs.popleft())
        if len(jobs) > self.largest_batch:
            self.largest_batch = len(jobs)
        now = env.now
        if self.hot_since is None or now - self.last_end >= p.cooldown_s:
            self.hot_since = now
        offs = self.batch_times(jobs)
        slow = p.throttle_after_s is not None and now - self.hot_since >= p.throttle_after_s
        if slow:
            offs = [o / p.throttle_factor for o in offs]
        d = max(offs)
        for (k, _, done, *_), o in sorted(zip(jobs, offs), key=lambda x: x[1]):
            ev = env.timeout(o)
            ev.callbacks.append(lambda _e, done=done: done())
        yield env.timeout(d)
        if slow:
            self.throttled_s += d
        k_all = sum(j[0] for j in jobs)
        self.busy_s += d
        self.tokens += k_all
        self.energy_j += p.joules_per_token * k_all if p.joules_per_token is not None else p.power_w * d
        self.last_end = env.now
        if self.mem is not None:
            self.mem.drafted(self.last_end)
