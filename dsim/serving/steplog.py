"""The replica's per-step series (what summary.json, plots and the memory bound read)."""
from __future__ import annotations

from array import array


class StepLog:
    """Per-step series as typed arrays: 8 bytes a value instead of a list slot plus a float object
    (~32 bytes), and appends as cheap as a list's; numpy reads them without a copy."""

    __slots__ = ("t_end", "dur", "prefill_tokens", "decode_tokens", "itl_count", "running", "waiting", "kv_used")
    FLOATS = ("t_end", "dur")

    def __init__(self):
        for k in self.__slots__:
            setattr(self, k, array("d" if k in self.FLOATS else "i"))     # counts fit in int32

