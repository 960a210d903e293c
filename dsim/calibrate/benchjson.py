"""Checks of a ``vllm bench serve --save-detailed`` JSON before it is compared: every value the
reader uses, element by element, so a wrong type or a NaN is an error naming ``FILE.field[i]``,
never a TypeError deep in the reader or a TTFT silently left out of the comparison table."""
from __future__ import annotations

import math

from ..config.errors import ConfigError
from ..config.limits import MAX_TOKENS


def _int(v, where: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < lo:
        raise ConfigError(where, v, f"an integer >= {lo} (tokens)")
    if v > MAX_TOKENS:
        raise ConfigError(where, v, f"at most {MAX_TOKENS:.0e} tokens")
    return int(v)


def _secs(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(where, v, "a finite number of seconds >= 0")
    return float(v)


def _per_request(d: dict, key: str, p, n: int | None, optional: bool = False):
    v = d.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, list):
        raise ConfigError(f"{p}.{key}", v if not isinstance(v, (dict, str)) else type(v).__name__,
                          "a per-request list (save with --save-detailed)")
    if n is not None and len(v) != n:
        raise ConfigError(f"{p}.{key}", None, f"one entry per request: {len(v)} entries, input_lens has {n}",
                          show_value=False)
    return v


def bench_requests(d, p) -> dict:
    """The requests of a bench JSON ``d`` (read from ``p``) that completed with tokens: their
    lengths, TTFT and ITLs in seconds, and the file-level settings, all checked."""
    if not isinstance(d, dict):
        raise ConfigError(str(p), type(d).__name__, "a JSON object (the file vllm bench serve --save-result "
                          "--save-detailed writes)")
    inputs = _per_request(d, "input_lens", p, None)
    n = len(inputs)
    if n == 0:
        raise ConfigError(f"{p}.input_lens", [], "at least one request")
    outputs = _per_request(d, "output_lens", p, n)
    ttfts = _per_request(d, "ttfts", p, n)
    itls = _per_request(d, "itls", p, n, optional=True)
    errors = _per_request(d, "errors", p, n, optional=True)
    ok, rows = [], []
    for i in range(n):
        err = errors[i] if errors is not None else None
        if err is not None and not isinstance(err, str):
            raise ConfigError(f"{p}.errors[{i}]", err, "a message or empty text")
        n_out = _int(outputs[i], f"{p}.output_lens[{i}]", 0)
        if err or n_out == 0 or ttfts[i] is None:
            continue                    # failed, or nothing generated: not compared
        gaps = itls[i] if itls is not None else []
        if gaps is None:
            gaps = []
        if not isinstance(gaps, list):
            raise ConfigError(f"{p}.itls[{i}]", gaps, "a list of gaps in seconds")
        ok.append(i)
        rows.append({"input": _int(inputs[i], f"{p}.input_lens[{i}]", 1), "output": n_out,
                     "ttft": _secs(ttfts[i], f"{p}.ttfts[{i}]"),
                     "itls": [_secs(g, f"{p}.itls[{i}][{j}]") for j, g in enumerate(gaps)]})
    if not rows:
        raise ConfigError(str(p), None, f"at least one request that completed and generated tokens: no request "
                          f"of the {n} in the file did (every one errored or has output_lens 0)", show_value=False)
    burst = d.get("burstiness")
    if burst is None:
        burst = 1.0
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not (math.isfinite(burst) and burst > 0):
        raise ConfigError(f"{p}.burstiness", burst, "a finite number > 0 (1 = Poisson)")
    dur = d.get("duration")
    if dur is not None and (isinstance(dur, bool) or not isinstance(dur, (int, float)) or not math.isfinite(dur)
                            or dur < 0):
        raise ConfigError(f"{p}.duration", dur, "the benchmark's duration: a finite number of seconds >= 0")
    starts = _per_request(d, "start_times", p, n, optional=True)     # dsim's export adds send times
    if starts is not None:
        starts = [_secs(v, f"{p}.start_times[{i}]") for i, v in enumerate(starts)]
        t0 = min(starts)
        starts = [v - t0 for v in starts]
    return {"n": n, "ok": ok, "rows": rows, "burstiness": float(burst), "duration": float(dur or 0.0),
            "starts": starts}
