"""The capture folder ``dsim observe`` writes and ``dsim cosim`` / ``dsim calibrate`` read.

Why a format of its own: a live server's run is only replayable exactly when the requests'
send schedule and prompt structure travel with the timings.  vLLM's bench JSON has no send times,
the LLMServingSim-style folder has engine-side timestamps but no prompt content; a capture holds
both, measured at the client.

Files (all written at once, atomically):

- ``capture.json``: ``{"format": "dsim-capture", "version": 1, ...}``: the endpoint, API, model,
  client, concurrency cap, how the capture ended, counts;
- ``scenario.yaml``: the resolved scenario the workload was drawn from (seed included);
- ``workload.jsonl``: every drawn request as ``dsim trace generate`` writes it (arrival_s,
  prompt_tokens, output_tokens, prefix_group, segments, ...), sent or not;
- ``requests.jsonl``: one line per request that was sent, in send order: ``index`` (line of
  workload.jsonl), ``scheduled_s`` / ``sent_s`` / ``first_token_s`` / ``last_token_s`` and
  ``chunk_s`` (every content chunk's arrival) on the capture's clock (seconds from its start),
  ``chunk_tokens`` (tokens per chunk, from the server's running usage when it reports one),
  ``prompt_tokens`` / ``completion_tokens`` as the server reported them (null when it did not),
  ``sent_prompt_tokens``, ``max_tokens``, ``status`` (HTTP), ``error`` (text or null),
  ``cancelled`` (stopped by Ctrl-C or the end of ``--duration``), and from ``dsim serve`` its own
  simulated timings of the request (``server_timing``: the ``dsim`` field of its last chunk).

Client-side metrics (ms), shared by the writer's summary and the reader:
TTFT = first content chunk - send; TPOT = (last - first) / (n_out - 1); ITL = gaps between
consecutive content chunks; E2E = last - send.
"""
from __future__ import annotations

FORMAT = "dsim-capture"
VERSION = 1
CAPTURE = "capture.json"
SCENARIO = "scenario.yaml"
WORKLOAD = "workload.jsonl"
REQUESTS = "requests.jsonl"


def output_tokens(rec: dict) -> int:
    """Output tokens of a request: the server's count when it gave one, else the chunks' tokens."""
    n = rec.get("completion_tokens")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        return n
    return int(sum(rec.get("chunk_tokens") or ()))


def succeeded(rec: dict) -> bool:
    """A request that streamed to its end: HTTP 200, no error, not cancelled, at least one token."""
    return (rec.get("status") == 200 and not rec.get("error") and not rec.get("cancelled")
            and rec.get("first_token_s") is not None and output_tokens(rec) >= 1)


def client_latencies(rec: dict) -> dict:
    """TTFT, TPOT (None for one output token), E2E in ms and the ITL gaps (ms) of a request that
    succeeded, measured from its send time."""
    sent, first, last = rec["sent_s"], rec["first_token_s"], rec["last_token_s"]
    n = output_tokens(rec)
    chunks = rec.get("chunk_s") or [first]
    return {"ttft": (first - sent) * 1e3, "e2e": (last - sent) * 1e3,
            "tpot": (last - first) * 1e3 / (n - 1) if n > 1 else None,
            "itl": [(b - a) * 1e3 for a, b in zip(chunks, chunks[1:])]}
