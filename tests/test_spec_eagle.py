"""``speculation.framework: eagle`` (dsim/specdec/eagle.py): fused rounds draft with an EAGLE head on
the target, one decoder layer + the LM head per drafted token."""
import pytest
from helpers import assert_refused
from test_specdec import run, spec_scn

from dsim.config.errors import ConfigError
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency.base import BatchShape
from dsim.latency.roofline import RooflineModel
from dsim.serving.speculative import SpeculativeSteps
from dsim.specdec.eagle import head_fraction


def test_head_fraction_by_hand():
    # Llama-3.1-8B: 32 layers, hidden 4096, 32 heads / 8 KV heads of 128, MLP 14336 (gated), vocab 128256
    attn = 4096 * 4096 * 2 + 2 * 4096 * 1024
    mlp = 3 * 4096 * 14336
    lm = 128256 * 4096
    p = 32 * (attn + mlp) + lm
    assert head_fraction(load_model("meta-llama/Llama-3.1-8B")) == pytest.approx((1 + lm / (p / 32)) / 32, rel=1e-12)
    assert 0.100 < (1 + lm / (p / 32)) / 32 < 0.102     # ~10.1 % of a decode step per draft token


def test_target_step_grows_by_exactly_the_heads_cost(monkeypatch):
    """The same run (everything accepted, so both runs verify the same rounds) with the head and with
    a drafter that costs nothing: every step differs by f x the target's decode steps of its drafts."""
    spec = {"mode": "fused", "framework": "eagle", "acceptance": {"geometric": 1.0}, "gamma": {"k": 3}}
    scn = spec_scn(spec, n=3, out=100, rate=50)
    rows = []
    orig = SpeculativeSteps._draft_time

    def record(self, spec_rows):
        t = orig(self, spec_rows)
        rows.append(([(r.num_computed, k) for r, k, _ in spec_rows if k and r.spec.fused], t))
        return t
    monkeypatch.setattr(SpeculativeSteps, "_draft_time", record)
    with_head = run(scn).fleet.replicas()[0].inst.log
    monkeypatch.setattr(SpeculativeSteps, "_draft_time", lambda self, spec_rows: 0.0)
    free = run(scn).fleet.replicas()[0].inst.log
    m = load_model("meta-llama/Llama-3.1-8B")
    target = RooflineModel(m, load_device("H100-SXM"), 1)
    f = (1 + m.vocab_size * m.hidden_size / (m.active_params / m.num_layers)) / m.num_layers

    def head(batch):                 # draft step j: the requests with k >= j, one batch
        t = 0.0
        for j in range(1, max(k for _, k in batch) + 1):
            live = [c for c, k in batch if k >= j]
            t += f * target.step_time(BatchShape(decode_tokens=len(live), decode_ctx_sum=sum(c + j for c in live),
                                                 num_sampled=len(live), running=len(live)))
        return t
    assert len(with_head.dur) == len(free.dur) and len(rows) > 15
    assert any(len(b) > 1 for b, _ in rows)           # batched drafts were costed too
    diffs = [a - b for a, b in zip(with_head.dur, free.dur) if abs(a - b) > 0]
    assert len(diffs) == len(rows)
    for d, (batch, t) in zip(diffs, rows):
        assert t == pytest.approx(head(batch), rel=1e-12)
        assert d == pytest.approx(t, rel=1e-9)


def test_head_cold_start_loads_the_heads_weights():
    spec = {"mode": "fused", "framework": "eagle", "acceptance": {"geometric": 0.7}, "gamma": {"k": 3},
            "cold_start": {"initially_warm": False}}
    ses = run(spec_scn(spec, out=20))
    (tgt,) = ses.spec.targets.values()
    m = load_model("meta-llama/Llama-3.1-8B")
    gpu = load_device("H100-SXM")
    assert tgt.cold_starts == 1
    assert tgt.load_s == pytest.approx(head_fraction(m) * m.active_params * 2 / gpu.weight_load_bytes_s, rel=1e-12)
    assert ses.spec.mechanisms_summary() == {"framework": "eagle"}


def test_eagle_is_refused_where_no_target_drafts(tmp_path, capsys):
    assert_refused("mobile_cloud_distributed", ["speculation.framework=eagle"], "speculation.framework",
                   tmp_path, capsys)
    assert_refused("eagle_fused", ["speculation.framework=tree"], "speculation.framework", tmp_path, capsys)


def test_a_fused_eagle_head_needs_no_drafter_of_the_targets_family():
    """A Qwen target: the default (Llama) drafter is refused for vanilla fused drafting, but a fused
    EAGLE head uses no drafter model at all."""
    qwen = {"model": "Qwen/Qwen2.5-7B-Instruct"}
    spec = {"mode": "fused", "acceptance": {"geometric": 0.7}, "gamma": {"k": 2}}
    with pytest.raises(ConfigError, match="speculation.drafter"):
        run(spec_scn(spec, out=8, **qwen))
    ses = run(spec_scn({**spec, "framework": "eagle"}, out=8, **qwen))
    assert ses.reqs[0].n_out == 8
