"""Content hashes of a request's full KV blocks, for prefix caching.

A request's tokens are described by segments (id, length); its generated tokens form the
segment ``-(rid + 1)``.  Block i's hash chains the previous block's hash with the pieces of
segments that fall inside block i, so equal hashes mean equal token prefixes (vLLM hashes the
token ids themselves; segment ids stand in for them).  Hashes are built from ints only, so they
are the same in every process.
"""
from __future__ import annotations


def may_be_cached(r) -> bool:
    """Whether a cache can hold any of r's blocks: shared content (segments), or its own blocks,
    kept when it was preempted.  A unique prompt never preempted has nothing to find, so callers
    skip building its hashes (a list per block, for nothing)."""
    return r.segments is not None or bool(r.preempt_times)


def block_hashes(r, n_blocks: int, bs: int) -> list:
    """Hashes of the first ``n_blocks`` full blocks of request r's token sequence."""
    have = r.block_hashes
    if have is not None and len(have) >= n_blocks:
        return have[:n_blocks]
    if r.segments is None:
        rid = r.rid
        out = [("u", rid, i) for i in range(n_blocks)]
        r.block_hashes = out
        return out
    segs = list(r.segments)
    if r.n_out:
        segs.append((-(r.rid + 1), r.n_out))
    out = []
    prev = 0
    seg_i, seg_off = 0, 0
    for _ in range(n_blocks):
        need = bs
        sig = []
        while need:
            if seg_i >= len(segs):
                return out  # not enough known tokens (cannot happen for valid callers)
            sid, ln = segs[seg_i]
            take = min(need, ln - seg_off)
            sig.append((sid, seg_off, seg_off + take))
            seg_off += take
            need -= take
            if seg_off == ln:
                seg_i, seg_off = seg_i + 1, 0
        prev = hash((prev, tuple(sig)))
        out.append(prev)
    r.block_hashes = out
    return out
