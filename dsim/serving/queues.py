"""Waiting queues of a replica: the order in which waiting requests are admitted.

FCFS is a ``collections.deque`` (arrivals at the back, preempted requests back at the front), as in
vLLM's default policy.  Every other policy (``dsim.serving.policies``) gives each queued request a
key, ``r.sched_key``, and the waiting queue is kept sorted by it, preempted requests included.
"""
from __future__ import annotations

from bisect import bisect_right


class PriorityWaiting:
    """The deque operations the replica uses, over a list kept sorted by ``sched_key``."""

    __slots__ = ("_keys", "_items")

    def __init__(self):
        self._keys: list = []
        self._items: list = []

    def append(self, r) -> None:
        k = r.sched_key
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
