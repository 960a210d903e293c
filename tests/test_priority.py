"""engine.scheduling_policy: priority (vLLM's --scheduling-policy priority): waiting order by
(priority, arrival), preempted requests by their key, the victim the largest (priority, arrival)."""
from types import SimpleNamespace as R

import dsim
from dsim.serving.policies import Priority
from dsim.serving.queues import PriorityWaiting

from helpers import assert_refused, scenario


def test_waiting_order_by_hand():
    q = PriorityWaiting()
    a, b, c, d = (R(priority=p, arrival=t, rid=i) for i, (p, t) in enumerate([(1, 0.0), (0, 1.0), (1, 2.0), (0, 3.0)]))
    for r in (a, b, c, d):
        r.sched_key = Priority().key(r)
        q.append(r)
    assert [q[i].rid for i in range(len(q))] == [1, 3, 0, 2]          # (priority, arrival)
    assert q.popleft() is b
    q.appendleft(b)                                                    # a preempted request: by its key
    assert q[0] is b and len(q) == 4
    del q[1]
    assert [r.rid for r in q] == [1, 0, 2]


def _mix(policy, **engine):
    # two classes arriving together: "batch" (priority 1) first, then "chat" (priority 0)
    cls = [{"name": "batch", "priority": 1, "type": "poisson", "rate": 200, "num_requests": 40,
            "prompt_tokens": 200, "output_tokens": 50},
           {"name": "chat", "priority": 0, "type": "poisson", "rate": 200, "num_requests": 40,
            "prompt_tokens": 200, "output_tokens": 50}]
    return dsim.run(scenario(latency={"model": "blackbox", "beta": [2000, 0, 0]},
                             engine={"max_num_seqs": 4, "scheduling_policy": policy, **engine},
                             workload={"type": "mix", "classes": cls}), check_invariants=True)


def _ttft(res, tenant):
    v = sorted(r.t_first_token - r.arrival for r in res.requests if r.tenant == tenant)
    return v[len(v) // 2]


def test_priority_protects_the_high_class_under_overload_and_fcfs_does_not():
    fcfs, prio = _mix("fcfs"), _mix("priority")
    for res in (fcfs, prio):
        assert res.summary["requests"]["completed"] == 80
    assert _ttft(prio, "chat") < 0.5 * _ttft(prio, "batch")
    assert 0.5 < _ttft(fcfs, "chat") / _ttft(fcfs, "batch") < 2.0
    # every admission under priority took the best waiting key at that moment
    first = sorted(prio.requests, key=lambda r: (r.t_scheduled, r.rid))
    for r in first:
        waiting = [x for x in prio.requests if x.arrival <= r.t_scheduled and x.t_scheduled > r.t_scheduled]
        assert all((r.priority, r.arrival) <= (x.priority, x.arrival) for x in waiting), r.rid


def _pressure(tmp_path, policy):
    """Three batch requests (priority 1) run; a chat request (priority 0) joins; KV then runs out."""
    import json
    rows = {"batch": [(0.0, 200, 300), (0.001, 200, 300), (0.002, 200, 300)], "chat": [(0.05, 200, 300)]}
    cls = []
    for name, prio in (("batch", 1), ("chat", 0)):
        p = tmp_path / f"{name}.jsonl"
        p.write_text("".join(json.dumps({"arrival_s": t, "prompt_tokens": a, "output_tokens": b}) + "\n"
                             for t, a, b in rows[name]))
        cls.append({"name": name, "priority": prio, "type": "trace", "path": str(p)})
    return dsim.run(scenario(latency={"model": "blackbox", "beta": [2000, 0, 0]},
                             engine={"max_num_seqs": 4, "scheduling_policy": policy, "num_gpu_blocks": 70,
                                     "enable_prefix_caching": False},
                             workload={"type": "mix", "classes": cls}), check_invariants=True)


def test_the_victim_is_the_lowest_priority_not_the_last_admitted(tmp_path):
    def first_victim(res):
        pre = [(r.preempt_times[0], r.tenant) for r in res.requests if r.preempt_times]
        return min(pre)[1] if pre else None
    fcfs, prio = _pressure(tmp_path, "fcfs"), _pressure(tmp_path, "priority")
    assert first_victim(fcfs) == "chat"          # vLLM FCFS: the last request in the running order
    assert first_victim(prio) == "batch"         # priority: the largest (priority, arrival)
    chat = [r for r in prio.requests if r.tenant == "chat"][0]
    assert not chat.preempt_times
    for res in (fcfs, prio):
        assert res.summary["requests"]["completed"] == 4


def test_bad_policy_or_priority_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    assert_refused("priority_classes", ["engine.scheduling_policy=lifo"], "engine.scheduling_policy:", tmp_path, capsys)
    assert_refused("priority_classes", ["workload.classes[0].priority=1.5"], "workload.classes[0].priority:",
                   tmp_path, capsys)
