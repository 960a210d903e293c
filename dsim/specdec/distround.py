"""A distributed round in flight: its result going down to the device, the device drafting, the
bundle coming up, then the round is ready at the target (docs/performance.md, "Round three,
second pass: distributed rounds").

Why an object: as closures inside ``SpecRuntime._next_round`` the round's callbacks made a dozen
of that function's locals cells, built on every call (fused rounds included); a round with slots
carries the same values, and its bound methods are the callbacks.  Each reads what it reads at
the moment the closure it replaces read it.
"""
from __future__ import annotations


class DistRound:
    """One distributed round of conversation ``st`` (request ``r``) verified on ``inst``: k drafts
    (``kv_k`` of them holding KV at the target), a tree's ``steps`` per draft pass or None, the
    datacenter end ``dc`` of the device's messages, sent at ``t0``."""

    __slots__ = ("rt", "st", "r", "inst", "tgt", "k", "kv_k", "steps", "dc", "t0", "t1")

    def __init__(self, rt, st, r, inst, tgt, k: int, kv_k: int, steps, dc, t0: float):
        self.rt, self.st, self.r, self.inst, self.tgt = rt, st, r, inst, tgt      # tgt: inst's TargetState
        self.k, self.kv_k, self.steps, self.dc, self.t0 = k, kv_k, steps, dc, t0

    def at_device(self, _e) -> None:
        """The result reached the device: it drafts the round (queued behind its other jobs)."""
        rt, st, r = self.rt, self.st, self.r
        st.net_s += rt.env._now - self.t0
        dev = st.device
        ns = st.levels_ns
        if ns is not None:
            dev.submit(ns[0], r.num_computed, self.drafted, self.lost, None, None,
                       rt._levels_device_seconds(dev, r.num_computed, ns))
            return
        dev.submit(self.k, r.num_computed, self.drafted, self.lost, self.steps,
                   rt._device_model(dev, st.drafter) if st.drafter > 0 else None, None,
                   r if rt.cfg.draft_kv is not None else None)

    def drafted(self) -> None:
        """The k drafts are out on the device: the bundle goes up."""
        rt = self.rt
        cfg = rt.cfg
        self.t1 = rt.env._now
        rt.net.send(self.st.device.name, self.dc, cfg.header_bytes + self.k * cfg.bundle_bytes_per_token, False,
                    self.bundle)

    def bundle(self, _e) -> None:
        """The bundle is at the target: the round is ready to verify (``SpecRuntime._ready``)."""
        rt, st, inst = self.rt, self.st, self.inst
        now = rt.env._now
        st.net_s += now - self.t1
        st.in_flight = False
        st.k = self.kv_k
        self.tgt.ready_n += 1
        st.ready = True
        st.t_ready = now
        st.deadline = now + rt.round_budget_s
        if inst._wake is not None:       # (Instance.wake's own first test: the replica sleeps)
            inst.wake()

    def lost(self) -> None:
        """The device left for good after the round was sent: the target finishes the conversation
        alone (``_mode`` picks fused for a device that is gone)."""
        self.st.in_flight = False
        self.rt._next_round(self.st, self.r, self.inst)
