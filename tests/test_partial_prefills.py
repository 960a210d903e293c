"""engine.max_num_partial_prefills / max_long_partial_prefills: vLLM's concurrent partial prefills
(dsim.serving.scheduling.PartialPrefills)."""
import pytest

import dsim
from dsim.config.engine import load_engine
from dsim.config.errors import ConfigError

from helpers import scenario, trace_file

LONG, SHORT = 6000, 100
ROWS = [(0.0, LONG, 4), (0.0, LONG, 4), (0.0, SHORT, 4)]      # A, B long; C short behind them


def _run(tmp_path, **engine):
    p = trace_file(tmp_path, ROWS)
    res = dsim.run(scenario(workload={"type": "trace", "path": str(p)},
                            engine={"max_num_batched_tokens": 2048, "max_model_len": 8192, **engine}),
                   check_invariants=True)
    a, b, c = sorted(res.requests, key=lambda r: r.rid)
    return res, a, b, c


def test_off_by_default_one_prefill_takes_the_whole_budget(tmp_path):
    res, a, b, c = _run(tmp_path)
    assert res.instance.log.prefill_tokens[0] == 2048          # A alone in the first step
    assert b.t_scheduled < a.t_first_token                      # B starts while A is still prefilling
    assert c.t_first_token > a.t_first_token                    # C waits behind both long prompts


def test_two_partial_prefills_split_the_budget_and_hold_back_a_second_long_prompt(tmp_path):
    res, a, b, c = _run(tmp_path, max_num_partial_prefills=2)
    log = res.instance.log
    # step 1: A and C are the two prefills it could schedule (B is long while A is): 2048 // 2 for A
    assert log.prefill_tokens[0] == 1024 + SHORT
    assert c.t_first_token == pytest.approx(log.t_end[0])       # C's first token after one step
    # B (long) waits while A is a long partial prefill: admitted only once A's prompt is done
    assert b.t_scheduled >= a.t_first_token
    (tmp_path / "off").mkdir()
    _, a1, _, c1 = _run(tmp_path / "off", max_num_partial_prefills=1)
    assert c.t_first_token - c.arrival < (c1.t_first_token - c1.arrival) / 3


def test_two_long_partial_prefills_may_run_together(tmp_path):
    res, a, b, c = _run(tmp_path, max_num_partial_prefills=3, max_long_partial_prefills=2)
    # A, B and C all schedulable: 2048 // 3 = 682 tokens each for A and B, C whole
    assert res.instance.log.prefill_tokens[0] == 682 + 682 + SHORT
    assert b.t_scheduled == a.t_scheduled


def test_prefix_cache_rounds_a_partial_chunk_down_to_whole_blocks(tmp_path):
    res, *_ = _run(tmp_path, max_num_partial_prefills=3, max_long_partial_prefills=2,
                   enable_prefix_caching=True, block_size=16)
    assert res.instance.log.prefill_tokens[0] == 672 + 672 + SHORT     # 682 // 16 * 16


def test_threshold_default_and_rules():
    e = load_engine({"max_num_partial_prefills": 2, "max_model_len": 8192})
    assert e.long_partial_threshold == 327 and e.long_prefill_token_threshold == 0
    assert load_engine({"max_num_partial_prefills": 2, "long_prefill_token_threshold": 500}).long_partial_threshold == 500
    assert load_engine({}).max_num_partial_prefills == 1 and load_engine({}).long_partial_threshold == 0
    with pytest.raises(ConfigError, match="engine.max_num_partial_prefills"):
        load_engine({"max_num_partial_prefills": 2, "enable_chunked_prefill": False, "max_model_len": 2048})
    with pytest.raises(ConfigError, match="engine.max_long_partial_prefills"):
        load_engine({"max_num_partial_prefills": 2, "max_long_partial_prefills": 3})


def test_a_share_smaller_than_a_block_is_refused_not_a_stalled_scheduler():
    """budget // N below one block (prefix cache on) scheduled no prefill at all: a run ended in
    "scheduler made no progress" (an internal error); it is a configuration error now."""
    with pytest.raises(ConfigError, match=r"engine.max_num_partial_prefills: got 8, expected at most "
                                          r"max_num_batched_tokens // 16 = 4"):
        load_engine({"max_num_partial_prefills": 8, "max_num_batched_tokens": 64, "max_model_len": 64,
                     "enable_prefix_caching": True, "enable_chunked_prefill": True})
    e = load_engine({"max_num_partial_prefills": 4, "max_num_batched_tokens": 64, "max_model_len": 64,
                     "enable_prefix_caching": True})
    assert e.max_num_partial_prefills == 4                  # exactly one block each: allowed
    load_engine({"max_num_partial_prefills": 8, "max_num_batched_tokens": 64, "max_model_len": 64,
                 "enable_prefix_caching": False})           # without the cache a share is 8 tokens
