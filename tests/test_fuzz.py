"""Property-based fuzzing of scenario keys (hypothesis): any key path of a shipped scenario set to a
hostile value, deleted, or replaced by the wrong kind of container must end with exit 0 or a
one-line exit-2 error -- never a traceback, a hang or another exit code.

CI draws a fixed example set (the "ci" profile in conftest.py derandomizes); a wider search:
``DSIM_FUZZ_EXAMPLES=5000 pytest tests/test_fuzz.py --hypothesis-profile=explore``.
experiments/fuzz_keys.py is the exhaustive sweep of every (scenario, key, listed value) case."""
import os
import sys
from pathlib import Path

import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
from fuzz_keys import leaves, run_case  # noqa: E402

SCENARIOS = ("quickstart", "pd_network", "router_comparison", "hybrid_rtt", "staged_shared_prefix",
             "closed_loop", "edf_slo_classes", "kv_offload_cpu", "pipeline_parallel", "dp_ep_moe")
KEYS = {n: [k for k in leaves(yaml.safe_load((ROOT / "scenarios" / f"{n}.yaml").read_text()))
            if k not in ("name", "description") and not k.startswith("workload.path")] for n in SCENARIOS}

HOSTILE = st.one_of(
    st.sampled_from(["null", ".nan", ".inf", "-.inf", "-1", "0", "''", "[]", "{}", "[1, 2]", "{a: 1}", "true"]),
    st.integers(min_value=-10 ** 30, max_value=10 ** 30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: yaml.safe_dump(x).split("\n")[0]),
    st.text(max_size=12).map(lambda t: yaml.safe_dump(t, allow_unicode=False).split("\n")[0]),
)


@st.composite
def mutation(draw):
    name = draw(st.sampled_from(SCENARIOS))
    key = draw(st.sampled_from(KEYS[name]))
    value = draw(HOSTILE)
    return name, key, value


WIDE = "DSIM_FUZZ_EXAMPLES" in os.environ          # a long search: report the first failure unshrunk


@settings(max_examples=int(os.environ.get("DSIM_FUZZ_EXAMPLES", "120")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate] if WIDE else list(Phase))
@given(mutation())
def test_any_key_set_to_a_hostile_value_ends_cleanly(m):
    name, key, value = m
    path = ROOT / "scenarios" / f"{name}.yaml"
    small = ["workload.num_requests=30"] if key != "workload.num_requests" else []
    what, text = run_case(path, small + [f"{key}={value}"])
    assert what is None, f"{name}: --set {key}={value}: {what}: {text}"


# ---- data files: a trace JSONL/CSV whose rows are drawn from plausible and broken values ----------
FIELD = st.one_of(st.integers(min_value=-5, max_value=5000), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(max_size=6), st.none(), st.lists(st.integers(), max_size=2))
ROW = st.fixed_dictionaries({}, optional={"arrival_s": FIELD, "prompt_tokens": FIELD, "output_tokens": FIELD,
                                          "prefix_group": FIELD, "request_id": FIELD, "extra": FIELD})


@settings(max_examples=int(os.environ.get("DSIM_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate] if WIDE else list(Phase))
@given(rows=st.lists(ROW, min_size=0, max_size=6), csv_form=st.booleans())
def test_any_trace_file_ends_cleanly(tmp_path_factory, rows, csv_form):
    """Missing columns, wrong types, NaN/inf, negative or unsorted arrivals, empty files: a trace
    either replays or is refused on one line naming the file (and row)."""
    import csv as _csv
    import io
    import json
    d = tmp_path_factory.mktemp("trace")
    if csv_form:
        cols = sorted({k for r in rows for k in r}) or ["arrival_s"]
        buf = io.StringIO()
        w = _csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in cols})
        trace = d / "t.csv"
        trace.write_text(buf.getvalue())
    else:
        trace = d / "t.jsonl"
        trace.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
    scn = d / "s.yaml"
    scn.write_text(yaml.safe_dump({"name": "fuzz", "model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
                                   "workload": {"type": "trace", "path": str(trace)}, "output": {"plots": False}}))
    what, text = run_case(scn, [])
    assert what is None, f"{rows} ({'csv' if csv_form else 'jsonl'}): {what}: {text}"
    if text:
        assert str(trace) in text or "workload" in text, text
