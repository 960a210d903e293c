"""The ``speculation`` section of summary.json (seed 002 section 8), from a finished run's
speculative-decoding runtime (dsim.specdec.runtime.SpecRuntime: its config, per-request states,
devices and targets, read as plain attributes).

TVT (time to verify token) of a round: from the moment its drafts are at the target (bundle
arrived, or the round began for fused drafting) to the end of the verify step; a request's TVT is
the maximum over its rounds.  Tokens per verify step = (accepted + rounds) / rounds.  Network share
= time a request's messages spent on the network (prompt upload, per-round result and bundle,
final download) / its E2E latency.  Acceptance by context bin and the gamma (k) timeline come
from every verified round (``SpecRuntime.by_context`` / ``by_second``).  Device energy comes from the draft devices' busy loops; server
energy from the fleet's energy section.
"""
from __future__ import annotations

from ..core.request import COMPLETED
from .fleet import jain
from .measures import meets_slo, stats


def _meets(r, st, slo) -> bool:
    if not meets_slo(r, slo.get("ttft_ms"), slo.get("tpot_ms")):
        return False
    tvt = slo.get("tvt_ms")
    return tvt is None or st.rounds == 0 or st.tvt_max * 1e3 <= tvt


TIMELINE_POINTS = 100       # most windows in the gamma timeline


def by_context(bins: dict) -> list:
    """Acceptance per power-of-two bin of the context a round's drafts were verified at (tokens
    already computed), in the bins of summary.json's ``length_bins``: 0, 1, 2-3, 4-7, ..."""
    out = []
    for b in sorted(bins):
        n, v, a = bins[b]
        out.append({"min_tokens": 0 if b == 0 else 2 ** (b - 1), "max_tokens": 0 if b == 0 else 2 ** b - 1,
                    "rounds": n, "verified_tokens": v, "accepted_tokens": a,
                    "acceptance_rate": a / v if v else None})
    return out


def gamma_timeline(seconds: dict) -> dict:
    """k over the run: per window of whole simulated seconds (as many as it takes to keep at most
    TIMELINE_POINTS windows), the rounds verified, their mean drafted k and acceptance rate; windows
    without rounds are left out.  ``t_s``: each window's start."""
    out = {"window_s": None, "t_s": [], "rounds": [], "mean_gamma": [], "acceptance_rate": []}
    if not seconds:
        return out
    first = min(seconds)
    w = max(1, -(-(max(seconds) - first + 1) // TIMELINE_POINTS))
    win: dict = {}
    for s in sorted(seconds):
        acc = win.setdefault((s - first) // w, [0, 0, 0, 0])
        for i, x in enumerate(seconds[s]):
            acc[i] += x
    out["window_s"] = w
    for i in sorted(win):
        n, d, v, a = win[i]
        out["t_s"].append(first + i * w)
        out["rounds"].append(n)
        out["mean_gamma"].append(d / n)
        out["acceptance_rate"].append(a / v if v else None)
    return out


def by_domain(pairs, domain_of: dict) -> dict:
    """Per request domain label ("" for none): conversations, rounds, drafts verified and accepted,
    their ratio and the tokens per verify step."""
    acc: dict = {}
    for r, st in pairs:
        d = domain_of.get(r.rid, "")
        c = acc.setdefault(d, [0, 0, 0, 0])
        c[0] += 1
        c[1] += st.rounds
        c[2] += st.verified
        c[3] += st.accepted
    return {d: {"conversations": n, "rounds": rd, "verified": v, "accepted": a,
                "acceptance_rate": a / v if v else None, "tokens_per_verify_step": (a + rd) / rd if rd else None}
            for d, (n, rd, v, a) in sorted(acc.items())}


def spec_summary(rt, reqs, t_end: float, slo: dict) -> dict:
    cfg = rt.cfg
    pairs = [(r, rt.states[r.rid]) for r in reqs if r.rid in rt.states]
    done = [(r, st) for r, st in pairs if r.state == COMPLETED]
    rounds = sum(st.rounds for _, st in pairs)
    verified = sum(st.verified for _, st in pairs)
    accepted = sum(st.accepted for _, st in pairs)
    drafted = sum(st.drafted for _, st in pairs)
    span = max(t_end - min((r.arrival for r, _ in pairs), default=0.0), 1e-12)
    out = {
        "mode": cfg.mode,
        "gamma_policy": cfg.policy,
        "acceptance": cfg.acceptance_desc,
        "partial_verification": cfg.partial["mode"],
        "rounds": rounds,
        "drafted_tokens": drafted,
        "verified_tokens": verified,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / verified if verified else None,
        "tokens_per_verify_step": (accepted + rounds) / rounds if rounds else None,
        "mean_gamma": drafted / rounds if rounds else None,
        "rounds_by_mode": {"distributed": sum(st.dist_rounds for _, st in pairs),
                           "fused": sum(st.fused_rounds for _, st in pairs)},
        "rollbacks": sum(st.rollbacks for _, st in pairs),
        "unverified_draft_tokens": drafted - verified,
        "kv_spills_to_fused": rt.spills,
        "cold_starts": sum(t.cold_starts for t in rt.targets.values()),
        "cold_starts_avoided": rt.cold_avoided,
        "tvt_ms": stats([st.tvt_max * 1e3 for r, st in done if st.rounds]),
        "network_share": stats([st.net_s / (r.t_completion - r.arrival) for r, st in done
                                if r.t_completion > r.arrival]),
        "not_issued": rt.unissued,
        "acceptance_by_context": by_context(rt.by_context),
        "gamma_timeline": gamma_timeline(rt.by_second),
    }
    if cfg.switch.get("max_link_utilization") is not None:
        out["link_utilization_to_fused"] = rt.link_fused
    if rt.cond is not None:              # acceptance conditioned per request (dsim.specdec.conditioning)
        out["acceptance_by_domain"] = by_domain(pairs, rt.domain_of)
    if rt.log is not None and rt.log.replay is not None:
        out["replay"] = rt.log.summary()
    if rt.devices:
        kinds: dict = {}
        for d in rt.devices:
            k = kinds.setdefault(d.kind, {"devices": 0, "drafted_tokens": 0, "busy_s": 0.0, "energy_j": 0.0,
                                          "throttled_s": 0.0, "output_tokens": 0})
            k["devices"] += 1
            k["drafted_tokens"] += d.tokens
            k["busy_s"] += d.busy_s
            k["energy_j"] += d.energy_j
            k["throttled_s"] += d.throttled_s
        for r, st in done:
            if st.device is not None:
                kinds[st.device.kind]["output_tokens"] += r.n_out
        for k in kinds.values():
            k["joules_per_output_token"] = k["energy_j"] / k["output_tokens"] if k["output_tokens"] else None
        out["devices"] = kinds
        per_kind: dict = {}
        for r, st in pairs:
            if st.device is None:
                continue
            c = per_kind.setdefault(st.device.kind, [0, 0])
            c[1] += 1
            if r.state == COMPLETED and _meets(r, st, slo):
                c[0] += 1
        att = {k: good / n for k, (good, n) in sorted(per_kind.items()) if n}
        out["fairness"] = {"slo_attainment_by_device_kind": att, "jain": jain(list(att.values())),
                           "gap": (max(att.values()) - min(att.values())) if att else None}
    if cfg.portfolio is not None:
        names = [d.name for d in cfg.portfolio.drafters]
        per = {n: {"started": 0, "finished_on": 0} for n in names}
        for r, st in pairs:
            per[names[st.drafter - st.escalations]]["started"] += 1
            if r.state == COMPLETED:
                per[names[st.drafter]]["finished_on"] += 1
        out["portfolio"] = {"choose": cfg.portfolio.choose, "escalate_below": cfg.portfolio.escalate_below,
                            "drafters": per, "escalations": sum(st.escalations for _, st in pairs)}
    out.update(rt.mechanisms_summary())       # levels, draft device memory, verify cohorts (when on)
    good = sum(1 for r, st in done if _meets(r, st, slo))
    out["goodput"] = {"slo": {k: v for k, v in slo.items() if v is not None}, "requests_meeting_slo": good,
                      "fraction": good / max(1, len(pairs)), "requests_per_s": good / span}
    return out
