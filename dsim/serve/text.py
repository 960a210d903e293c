"""Prompt tokens, their prefix-cache identity, and filler output text.

dsim serve has no real tokenizer.  A prompt given as text is split by ``TOKEN_RE``: every run of
word characters is one token and every other non-space character is one token (``"Hello, world!"``
is 4 tokens).  Real BPE tokenizers give about 1.3 tokens per English word, so a prompt counts fewer
tokens here than in vLLM; send ``prompt`` as a list of token ids to fix the count exactly.

Prefix caching needs content, not only a length: each token (a word, or an id) gets a stable 63-bit
number, and the prompt becomes ``Request.segments`` of ``CHUNK`` tokens each whose id chains every
token before it, so two prompts share simulated KV blocks exactly as far as their tokens agree.

Output text is filler: ``filler(start, n)`` is n words of a fixed cycle, each one token under
``TOKEN_RE`` and each preceded by a space, so the text of k tokens tokenizes back to k tokens.
"""
from __future__ import annotations

import hashlib
import re

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
CHUNK = 16          # tokens per prefix segment (segments need not align with KV blocks)
_WORDS = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut "
          "labore et dolore magna aliqua").split()


def words(text: str) -> list[str]:
    """The prompt's tokens (see the module docstring)."""
    return TOKEN_RE.findall(text)


def chat_text(messages: list) -> str:
    """The chat messages as one prompt: a role marker line before each message's text (a stand-in
    for a chat template: the same conversation prefix gives the same tokens)."""
    parts = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, list):
            c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
        parts.append(f"<|{m.get('role', '')}|>\n{c or ''}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def segments(tokens) -> tuple:
    """``Request.segments`` of a token sequence (words or ids): chunks of CHUNK tokens, each named
    by a hash of every token up to its end, so equal segment ids mean equal prefixes."""
    h = hashlib.blake2b(digest_size=8)
    out = []
    n = len(tokens)
    for i in range(0, n, CHUNK):
        chunk = tokens[i:i + CHUNK]
        h.update("\x1f".join(map(str, chunk)).encode() + b"\x1e")
        sid = int.from_bytes(h.copy().digest(), "big") >> 1       # >= 0: generated tokens use -(rid+1)
        out.append((sid, len(chunk)))
    return tuple(out)


def filler(start: int, n: int) -> str:
    """Output tokens start .. start+n-1 as text (a space and a word each)."""
    w = _WORDS
    return "".join(" " + w[(start + i) % len(w)] for i in range(n))
