"""Async scheduling (vLLM --async-scheduling): the scheduler plans step n+1 while step n runs, so a
request that arrives during step n first runs in step n+2: one step more to its first token, and
nothing else changes."""
import pytest
from helpers import scenario, trace_file

import dsim
from dsim.config.engine import load_engine


def _run(tmp_path, **engine):
    # A decodes in 1 ms steps from t = 0 (blackbox: 1000 us a step); B arrives in the middle of a step
    t = trace_file(tmp_path, [(0.0, 100, 30), (0.0105, 100, 3)])
    res = dsim.run(scenario(engine={"tensor_parallel_size": 2, **engine},
                            workload={"type": "trace", "path": str(t)}))
    return {r.rid: r for r in res.requests}


def test_a_request_arriving_mid_step_waits_one_more_step(tmp_path):
    sync = _run(tmp_path, async_scheduling=False)
    on = _run(tmp_path)                                  # TP 2, newest vLLM: on by default
    step = 1e-3
    assert sync[1].t_scheduled == pytest.approx(0.011)   # the next step after its arrival
    assert on[1].t_scheduled == pytest.approx(sync[1].t_scheduled + step)
    ttft = lambda r: r.t_first_token - r.arrival         # noqa: E731
    assert ttft(on[1]) - ttft(sync[1]) == pytest.approx(step)
    assert on[0].t_first_token == sync[0].t_first_token  # an idle engine schedules at once either way


def test_default_follows_vllm_version_and_executor():
    assert load_engine({"tensor_parallel_size": 2}).async_scheduling              # newest, multiprocess workers
    assert not load_engine({}).async_scheduling                                    # one in-process worker
    assert not load_engine({"tensor_parallel_size": 2, "vllm_version": "0.12.0"}).async_scheduling
    assert load_engine({"tensor_parallel_size": 2, "vllm_version": "0.15.1"}).async_scheduling
    assert not load_engine({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}).async_scheduling
    assert load_engine({"async_scheduling": True}).async_scheduling               # explicit wins
    with pytest.raises(dsim.ConfigError, match="engine.async_scheduling"):
        load_engine({"async_scheduling": "yes"})
