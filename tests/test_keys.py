"""--set and sweep keys reach every key a scenario has, and a key it does not have fails at once."""
from pathlib import Path

import pytest

import dsim

ROOT = Path(__file__).resolve().parents[1]


def test_set_reaches_keys_with_dashes_and_negative_indices():
    scn = dsim.load_scenario(ROOT / "scenarios" / "pd_network.yaml",
                             overrides=["network.clos.attach.prefill-0=1", "cluster.pools[-1].replicas=3"])
    assert scn.raw["network"]["clos"]["attach"]["prefill-0"] == 1       # was: "dotted keys" refused
    before = dsim.load_scenario(ROOT / "scenarios" / "pd_network.yaml").raw["cluster"]["pools"]
    pools = scn.raw["cluster"]["pools"]
    assert len(pools) > 1 and pools[-1]["replicas"] == 3 and pools[:-1] == before[:-1]
    with pytest.raises(dsim.ConfigError, match=r"\[-9\]|-9"):
        dsim.load_scenario(ROOT / "scenarios" / "pd_network.yaml", overrides=["cluster.pools[-9].replicas=3"])


def test_a_sweep_over_a_misspelt_key_fails_before_any_point(tmp_path):
    with pytest.raises(dsim.ConfigError, match="did you mean 'rate'"):
        dsim.sweep(ROOT / "scenarios" / "quickstart.yaml", ["workload.rat=1,2"],
                   overrides=["workload.num_requests=20"], out=tmp_path / "sw")
    assert not (tmp_path / "sw").exists()
    # a bad value is still one failed point among good ones, not a failed sweep
    rows = dsim.sweep(ROOT / "scenarios" / "quickstart.yaml", ["workload.rate=0,2"],
                      overrides=["workload.num_requests=20"], out=tmp_path / "ok")
    assert sorted(r["status"] for r in rows) == ["error", "ok"]


@pytest.mark.parametrize("call, where", [
    (lambda q: dsim.sweep(q, 5), "grid"),
    (lambda q: dsim.sweep(q, ["workload.rate=1"], jobs="a"), "--jobs"),
    (lambda q: dsim.sweep(q, ["workload.rate=1"], seeds="2"), "--seeds"),
    (lambda q: dsim.plan(q, str(ROOT / "scenarios" / "spaces" / "small.yaml"), gpus=1, slos=["ttft_p99_ms=500"],
                         top=0), "--top"),
    (lambda q: dsim.capacity(q, ["ttft_p99_ms=500"], jobs="x"), "--jobs"),
    (lambda q: dsim.run(q, out_dir=5), "out_dir"),
])
def test_the_python_api_checks_its_arguments_like_the_cli(call, where):
    """Each raised a raw TypeError from deep inside (or, for top=0, planned with an empty top list)."""
    with pytest.raises(dsim.ConfigError, match=f"^{where}"):
        call(str(ROOT / "scenarios" / "quickstart.yaml"))
