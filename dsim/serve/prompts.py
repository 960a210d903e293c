"""Prompt content for a drawn request: deterministic filler built from its segments.

A dsim request's prompt is a list of segments ``(id, tokens)``: equal ids are equal content (a
group's system prompt, a pooled question, an earlier turn).  To make a real server's prefix cache
see what dsim models, each segment becomes filler that depends only on (segment id, position): two
requests that share leading segments send the same leading tokens, and a segment cut shorter in one
request (a trace's prefix group) is a prefix of the longer one.  A request without segments is
one segment of its own.

Token ids (``/v1/completions`` with ``prompt`` as a list of ids, which vLLM accepts): the count the
server sees is exact.  Text (``/v1/chat/completions``): one word a token from a list of short common
words that BPE tokenizers keep whole after a space; the chat template adds tokens and a tokenizer
may still split a word, so the count is approximate and the capture keeps the server's own count.
"""
from __future__ import annotations

import numpy as np

# ids in [LO, HI) exist in every tokenizer dsim's catalogue models use (vocabularies of 32,000 and up)
TOKEN_LO, TOKEN_HI = 1000, 30000
_OWN = 1 << 56           # segment id of a request's own prompt when it has no segments
WORDS = tuple("""the of and to in is was for on with as by at from that this it be are or an not but
have has had were which you one all can her his their there been more if will would who so about out
up them some what time when into only other new than then may over these its also after first two
use well way our many any such make like just where most day very see much good long both work
each even back here life year part same made world own how under last never city high old place great
still take set home small end hand large while might next show house again line state big give name
land open word read near form seem low real tree ask keep run food sea eye face wood main plan
play song sun rain fish bird ship farm door room hill road river park lake star game book page""".split())


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised (uint64 arithmetic wraps, as intended)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _codes(sid: int, n: int) -> np.ndarray:
    """n pseudo-random uint64 codes of segment ``sid`` at positions 0..n-1."""
    base = np.uint64(sid % (1 << 64)) * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        return _mix(base + np.arange(n, dtype=np.uint64))


def segments_of(rec: dict, index: int) -> list:
    """The request's segments as [(id, tokens)], or one segment of its own when it has none."""
    segs = rec.get("segments")
    if segs:
        return [(int(s), int(n)) for s, n in segs]
    return [(_OWN + index, int(rec["prompt_tokens"]))]


def token_ids(segments, lo: int = TOKEN_LO, hi: int = TOKEN_HI) -> list:
    """The prompt as token ids in [lo, hi)."""
    with np.errstate(over="ignore"):
        parts = [(_codes(s, n) % np.uint64(hi - lo)).astype(np.int64) + lo for s, n in segments if n > 0]
    return np.concatenate(parts).tolist() if parts else []


def text(segments) -> str:
    """The prompt as words, one per token of each segment."""
    w = np.asarray(WORDS, dtype=object)
    with np.errstate(over="ignore"):
        idx = [(_codes(s, n) % np.uint64(len(WORDS))).astype(np.int64) for s, n in segments if n > 0]
    return " ".join(w[np.concatenate(idx)].tolist()) if idx else ""
