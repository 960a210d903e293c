"""Waiting queues of a replica: the order in which waiting requests are admitted.

FCFS is a ``collections.deque`` (arrivals at the back, preempted requests back at the front), as in
vLLM's default policy.  ``engine.scheduling_policy: priority`` mirrors vLLM's ``--scheduling-policy
priority``: the waiting queue is ordered by (priority, arrival time), lower first, preempted
requests included, and under KV pressure the running request with the largest (priority, arrival)
is preempted: the replica walks its running requests in ``priority_key`` order and preempts from
the end of that order.
"""
from __future__ import annotations

from bisect import bisect_right


class PriorityWaiting:
    """The deque operations the replica uses, over a list kept sorted by (priority, arrival, rid)."""

    __slots__ = ("_keys", "_items")

    def __init__(self):
        self._keys: list = []
        self._items: list = []

    def append(self, r) -> None:
        k = priority_key(r)
        i = bisect_right(self._keys, k)
        self._keys.insert(i, k)
        self._items.insert(i, r)

    appendleft = append          # a preempted request goes back by its key, not to the front

    def popleft(self):
        self._keys.pop(0)
        return self._items.pop(0)

    def __getitem__(self, i):
        return self._items[i]

    def __delitem__(self, i) -> None:
        del self._keys[i]
        del self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items)


def priority_key(r) -> tuple:
    """The priority policy's order: lower priority value first, then earlier arrival."""
    return (r.priority, r.arrival, r.rid)

