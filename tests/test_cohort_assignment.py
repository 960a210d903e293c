"""Capability-weighted cohort assignment (seed 002, "Canonical Trace Mapping for Draft Sweeps":
"round-robin by default, capability-weighted when configured"): speculation.cohort_assignment."""
import json
from collections import Counter

import pytest
from helpers import scenario

from dsim.config.errors import ConfigError
from dsim.config.scenario import load_scenario
from dsim.runner import simulate
from dsim.specdec.conversations import SmoothWeighted

DRAFTS = [{"name": "ph", "profile": "phone-flagship", "count": 2, "rtt_ms": 40, "bw_mbps": 20},
          {"name": "lp", "profile": "laptop-rtx4060", "count": 1, "rtt_ms": 8, "bw_mbps": 300}]


def bound(tmp_path, n, drafts=DRAFTS, recs=None, **spec):
    p = tmp_path / "t.jsonl"
    recs = recs if recs is not None else [{"arrival_s": 0.05 * i} for i in range(n)]
    p.write_text("".join(json.dumps({"prompt_tokens": 64, "output_tokens": 4, **r}) + "\n" for r in recs))
    scn = scenario(latency={"model": "roofline"}, workload={"type": "trace", "path": str(p)},
                   speculation={"mode": "distributed", "drafts": drafts, **spec})
    ses = simulate(load_scenario(scn))
    return ses, [ses.spec.states[i].device.name for i in range(len(recs))]


def test_smooth_weighted_round_robin_by_hand():
    """Weights 5, 1, 1, credit by credit (add 5/1/1, take the largest, first on a tie, charge it 7):
    (5,1,1) a -> (-2,1,1); (3,2,2) a -> (-4,2,2); (1,3,3) b -> (1,-4,3); (6,-3,4) a -> (-1,-3,4);
    (4,-2,5) c -> (4,-2,-2); (9,-1,-1) a -> (2,-1,-1); (7,0,0) a -> (0,0,0): "aabacaa", and the
    credits are back at 0, so every cycle of 7 repeats it."""
    w = SmoothWeighted("abc", [5, 1, 1])
    seq = "".join(w.pick() for _ in range(70))
    assert seq == "aabacaa" * 10
    even = SmoothWeighted("xy", [1, 1])
    assert "".join(even.pick() for _ in range(4)) == "xyxy"      # equal weights: in turn


def test_capability_shares_follow_the_drafting_speeds(tmp_path):
    """Without weights, a device's share is its drafting speed over the pool's total: the laptop
    drafts the 1B drafter faster than a phone, so it opens more conversations than either phone,
    and after n requests every device's count is within one of n x its share."""
    n = 300
    ses, names = bound(tmp_path, n, cohort_assignment="capability")
    speed = {d.name: 1.0 / d.token_time(0) for d in ses.spec.devices}
    total = sum(speed.values())
    got = Counter(names)
    assert speed["lp-0"] > 1.2 * speed["ph-0"] and speed["ph-0"] == speed["ph-1"]
    for d, s in speed.items():
        assert abs(got[d] - n * s / total) <= 1.0, (d, got[d], n * s / total)
    for k in (37, 150):                                  # at every prefix, not only the end
        pre = Counter(names[:k])
        assert all(abs(pre[d] - k * s / total) <= 1.0 for d, s in speed.items())


def test_explicit_weights_and_cohorts(tmp_path):
    """weight: 3 on the phones and 1 on the laptop: each cycle of 7 requests gives every phone 3 and
    the laptop 1; a cohort's rows stay in their group, weighted there."""
    drafts = [dict(DRAFTS[0], weight=3), dict(DRAFTS[1], weight=1)]
    _, names = bound(tmp_path, 70, drafts, cohort_assignment="capability")
    assert Counter(names) == {"ph-0": 30, "ph-1": 30, "lp-0": 10}
    drafts = [dict(DRAFTS[0], weight=1, count=3, cohort="mobile"), dict(DRAFTS[1], count=2, weight=2)]
    recs = [{"arrival_s": 0.05 * i, **({"tenant": "mobile"} if i % 2 else {})} for i in range(60)]
    _, names = bound(tmp_path, 0, drafts, recs, cohort_assignment="capability")
    mobile = Counter(nm for nm, r in zip(names, recs) if r.get("tenant"))
    assert mobile == {"ph-0": 10, "ph-1": 10, "ph-2": 10}
    rest = Counter(nm for nm, r in zip(names, recs) if not r.get("tenant"))      # every device: 3 x 1 + 2 x 2
    assert rest == {"ph-0": 4, "ph-1": 4, "ph-2": 4, "lp-0": 9, "lp-1": 9}


def test_default_is_the_round_robin_and_pins_draft_ids(tmp_path):
    """Omitted or round_robin: the devices in turn, as before; a row's draft_id wins in both modes."""
    _, a = bound(tmp_path, 7)
    _, b = bound(tmp_path, 7, cohort_assignment="round_robin")
    assert a == b == ["ph-0", "ph-1", "lp-0"] * 2 + ["ph-0"]
    recs = [{"arrival_s": 0.1 * i, **({"draft_id": "ph-1"} if i < 3 else {})} for i in range(6)]
    _, c = bound(tmp_path, 0, recs=recs, cohort_assignment="capability")
    assert c[:3] == ["ph-1"] * 3


def test_weight_without_capability_is_refused(tmp_path):
    drafts = [dict(DRAFTS[0], weight=2), DRAFTS[1]]
    with pytest.raises(ConfigError, match=r"^speculation\.drafts\[0\]\.weight: got 2"):
        bound(tmp_path, 3, drafts)
    with pytest.raises(ConfigError, match=r"^speculation\.cohort_assignment: got 'fast'"):
        bound(tmp_path, 3, cohort_assignment="fast")
