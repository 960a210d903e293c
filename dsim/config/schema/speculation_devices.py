"""Draft-device memory keys of the ``speculation`` section: the drafter's KV kept across rounds and
the turns of a session (``draft_kv``), and the drafter's weights loaded or not (``draft_load``).

Declared apart from dsim.config.schema.speculation so the device memory model (dsim.specdec.devmem)
has its keys in one place; the section imports them.
"""
from __future__ import annotations

from .base import Bool, Choice, Float, Int, Section


class DraftKv(Section):
    """A draft device's drafter KV cache (docs/specdec.md, "Draft KV reuse"): with it, a round pays a
    drafter prefill of the context tokens whose KV the device does not hold; the device keeps each
    conversation's KV between its rounds and after it ends (for the session's next turn), evicting
    the least recently used conversation when the cache is full."""
    cache_tokens: Int(0)
    """Drafter KV a device holds, tokens over all its conversations (0: nothing is kept, every
    round re-prefills its context)."""
    session_reuse: Bool = True
    """A session's next turn reuses the KV of the prefix it shares with the previous turn's prompt
    and answer (by the prompts' segments); false: only a conversation's own rounds reuse it."""


class DraftLoad(Section):
    """Draft devices load the drafter's weights before drafting (seed 002 6.4 and Appendix A item 6:
    cold starts and checkpoint locality).  A cold device pays the weights' bytes (as deployed, at the
    profile's weight_bits) over its storage bandwidth before its first round; it stays warm for
    warm_retention_s after its last round."""
    storage_gb_s: Float(0, lo_open=True) = 1.0
    """Storage read bandwidth, GB/s, for profiles without their own storage_gb_s."""
    warm_retention_s: Float(0) = 600.0
    """An idle device keeps the drafter loaded this long, s (its drafter KV goes with it)."""
    warm_at_start: Int(0) | None = None
    """Devices of each group with the drafter loaded at the start (the first ones; None: all)."""
    placement: Choice("bound", "warm_first") = "bound"
    """Which device drafts a new conversation of an open-loop group: bound (the trace's or the
    round-robin binding) | warm_first (a device with the drafter loaded, the least busy one, while it
    has fewer than max_active conversations; else the least busy device, warm before cold)."""
    max_active: Int(1) = 4
    """warm_first: conversations a warm device takes before a cold one is used."""
