"""Where a round is drafted: the mode selector (fused, distributed, or hybrid by RTT and verify
queue thresholds, the access link's utilisation, device availability, KV spill, or the gamma
policy's choice) and the target's
fused drafter, which is loaded on first use (a cold start), kept warm for a retention time, and
pre-warmed while the device keeps drafting.  A mixin of ``SpecRuntime`` (dsim.specdec.runtime)."""
from __future__ import annotations

import math
from collections import deque

from .gamma import DISTRIBUTED, FUSED, Telemetry
from .state import SpecState, TargetState


class DraftingModes:
    @staticmethod
    def switch_keys(sw: dict) -> tuple:
        """mode_switch's (policy, max_rtt_ms, max_verify_queue, max_link_utilization,
        min_fused_dwell_s), which ``_mode`` reads every round (the runtime keeps them as ``_switch``)."""
        return (sw.get("policy"), sw.get("max_rtt_ms"), sw.get("max_verify_queue"), sw.get("max_link_utilization"),
                sw.get("min_fused_dwell_s", 0.0))

    def _mode(self, st: SpecState, tel: Telemetry, pmode: str, tgt: TargetState) -> str:
        cfg = self.cfg
        dev = st.device
        if cfg.mode == "fused" or dev is None:
            return FUSED
        spill = cfg.kv_spill_pct is not None and tel.kv_utilization * 100 > cfg.kv_spill_pct
        if spill:
            self.spills += 1
            return FUSED
        now = self.env._now
        avail = dev.available_from(now) if dev.windows else now     # (available_from without windows)
        if avail == math.inf:
            return FUSED                 # the device is gone for good: the target finishes alone
        if cfg.mode == "distributed":
            return DISTRIBUTED
        # hybrid (mode_switch's keys, read once: SpecRuntime._switch)
        policy, max_rtt, max_queue, lim, dwell = self._switch
        dev_ok = avail == now
        if policy == "gamma_policy":
            mode = pmode if dev_ok else FUSED
        else:
            mode = DISTRIBUTED if (dev_ok and tel.rtt_ms <= max_rtt and tel.verify_queue <= max_queue) else FUSED
        if lim is not None and mode == DISTRIBUTED and self.link_utilization(dev) > lim:
            mode = FUSED                 # network-aware guard (seed 002 6.1): the access link is saturated
            self.link_fused += 1
        if dwell:                        # fused hysteresis (seed 002): once the switch says fused, the
            if now < st.fused_until:     # conversation stays fused for the dwell, however the RTT jitters
                mode = FUSED
            elif mode == FUSED:
                st.fused_until = now + dwell
        if mode == FUSED and dev_ok and not now <= tgt.warm_until:      # not self._warm(tgt)
            # the target's drafter is cold: start loading it (pre-warm) and keep drafting on the
            # device until it is in memory, instead of stalling the round on the load
            if tgt.loading is None:
                self._drafter_ready(tgt)
            self.cold_avoided += 1
            return DISTRIBUTED
        return mode

    def link_utilization(self, dev) -> float:
        """Share of its bandwidth the device's access link carried (the busier direction) over at
        least the last ``mode_switch.link_window_s``: from the carried bytes at this and earlier
        readings (the latest one at or before the window's start)."""
        now = self.env.now
        net = self.net
        up, down = net.carried_bytes(dev.name, self.gw), net.carried_bytes(self.gw, dev.name)
        hist = self.link_hist.get(dev.name)
        if hist is None:
            hist = self.link_hist[dev.name] = deque([(0.0, 0.0, 0.0)])
        hist.append((now, up, down))
        start = now - self.cfg.switch["link_window_s"]
        while len(hist) > 2 and hist[1][0] <= start:
            hist.popleft()
        t0, u0, d0 = hist[0]
        if now <= t0:
            return 0.0
        bw = net.link(dev.name, self.gw).bw
        return max(up - u0, down - d0) / (bw * (now - t0))

    def _warm(self, tgt: TargetState) -> bool:
        return self.env._now <= tgt.warm_until

    def _drafter_ready(self, tgt: TargetState):
        """None if the target's drafter is loaded (keeps it warm), else an event for when it is."""
        now = self.env.now
        ret = self.cfg.cold["warm_retention_s"]
        if self._warm(tgt):
            if tgt.warm_until != math.inf:
                tgt.warm_until = now + ret
            return None
        if tgt.loading is None:
            tgt.cold_starts += 1
            tgt.loading = self.env.timeout(tgt.load_s)

            def loaded(_e):
                tgt.loading = None
                tgt.warm_until = self.env.now + ret
            tgt.loading.callbacks.append(loaded)
        return tgt.loading
