"""Result files, written atomically: everything goes to a temporary folder, then is moved in."""
from __future__ import annotations

import csv
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from ..config.errors import ConfigError
from ..core.request import STATE_NAMES

COLUMNS = ("request_id", "label", "state", "arrival_s", "queued_s", "scheduled_s", "first_token_s",
           "completion_s", "prompt_tokens", "output_tokens", "generated_tokens", "ttft_ms", "tpot_ms",
           "e2e_ms", "queue_ms", "preemptions", "preempt_times_s", "cached_prefix_tokens", "prefix_group",
           "tenant", "session", "replica", "prefill_replica", "kv_ready_s", "reject_reason",
           "priority", "slo_class", "route_ms", "spec_device", "spec_rounds", "spec_fused_rounds",
           "spec_drafted_tokens", "spec_accepted_tokens", "spec_tvt_ms", "spec_drafter")


def _f(x, scale=1.0):
    return "" if x is None else f"{x * scale:.6f}"


def _opt(i: int):
    """Ids where -1 means 'none': written empty, like every other missing value."""
    return "" if i < 0 else i


def request_rows(reqs, raw: bool = False):
    """One tuple per request (by id) in COLUMNS order: formatted strings for the CSV, or with
    ``raw`` plain numbers and None for missing values (for DataFrames)."""
    f = (lambda x, scale=1.0: None if x is None else x * scale) if raw else _f
    opt = (lambda i: None if i < 0 else i) if raw else _opt
    empty = None if raw else ""
    for r in (reqs if hasattr(reqs, "col") else sorted(reqs, key=lambda r: r.rid)):   # a ledger is in id order
        done = r.t_completion is not None
        tpot = (r.t_last_token - r.t_first_token) / (r.n_out - 1) if done and r.n_out > 1 else None
        yield (r.rid, r.label, STATE_NAMES[r.state], f(r.arrival), f(r.t_queued), f(r.t_scheduled),
               f(r.t_first_token), f(r.t_completion), r.prompt_len, r.max_tokens, r.n_out,
               f(None if r.t_first_token is None else r.t_first_token - r.arrival, 1e3),
               f(tpot, 1e3), f(r.t_completion - r.arrival if done else None, 1e3),
               f(None if r.t_scheduled is None else r.t_scheduled - r.arrival, 1e3),
               len(r.preempt_times), ";".join(f"{t:.6f}" for t in r.preempt_times) or empty,
               r.cached_tokens, opt(r.prefix_group), r.tenant or empty, opt(r.session), r.replica or empty,
               r.prefill_replica or empty, f(r.t_kv_ready), r.reject_reason or empty, r.priority,
               r.slo_class or empty, f(None if r.t_routed is None else r.t_routed - r.arrival, 1e3),
               *_spec_cols(r.spec, f, empty))


def _spec_cols(st, f, empty) -> tuple:
    """Speculative decoding per request (dsim.specdec.runtime.SpecState): its draft device, rounds
    (of which fused), drafted and accepted tokens, its TVT (the largest over its rounds) and, with
    a drafter portfolio, the drafter it finished on."""
    if st is None:
        return (empty,) * 7
    dev = st.device.name if st.device is not None else empty
    return (dev, st.rounds, st.fused_rounds, st.drafted, st.accepted, f(st.tvt_max if st.rounds else None, 1e3),
            st.drafter_name or empty)


def write_requests_csv(reqs, f) -> None:
    """requests.csv into an open text file, row by row (a million requests never sit in memory as text)."""
    w = csv.writer(f, lineterminator="\n")
    w.writerow(COLUMNS)
    w.writerows(request_rows(reqs))


def _rounded(obj):
    """Floats to 12 significant digits: 0.9999999999999999 is written 1.0 (files only)."""
    if isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            return None                    # JSON has no NaN/Infinity: null (summary warnings say why)
        return float(f"{obj:.12g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v) for v in obj]
    return obj


def to_json(obj) -> str:
    return json.dumps(_rounded(obj), indent=2, sort_keys=True, default=str) + "\n"


class AtomicOutput:
    """Collect files in a temp folder beside ``out``; ``commit`` moves them in, ``abort`` drops them."""

    def __init__(self, out: Path):
        self.out = Path(out)
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(str(out), None, "an output folder (this is a file)", show_value=False)
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self._clean_stale()
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-{os.getpid()}-", dir=self.out.parent))
        except OSError as e:
            raise ConfigError(str(out), None, f"an output folder that can be written ({e.strerror})",
                              show_value=False) from None

    def _clean_stale(self) -> None:
        """Remove temp folders of earlier writes to this output whose process is gone (killed runs)."""
        for d in self.out.parent.glob(f".{self.out.name}.tmp-*"):
            pid = d.name[len(f".{self.out.name}.tmp-"):].split("-", 1)[0]
            if not pid.isdigit() or not d.is_dir():
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(d, ignore_errors=True)
            except OSError:
                pass                                   # alive under another user: leave it

    def path(self, rel: str) -> Path:
        p = self.tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def write_text(self, rel: str, text: str) -> None:
        self.path(rel).write_text(text)

    # files a report may contain: on re-use of a folder, ones this run did not write are removed,
    # so a report never mixes two runs (other files in the folder are left alone)
    REPORT_FILES = ("summary.json", "manifest.json", "requests.csv", "timeline.json", "vllm_traces.otlp.jsonl",
                    "plots/latency_cdf.png", "plots/timeline.png", "plots/network.png")

    def commit(self) -> Path:
        if not self.out.exists():
            os.replace(self.tmp, self.out)
            return self.out
        if self._swap_in():
            return self.out
        # no atomic exchange on this system: replace the report's files one by one
        for rel in self.REPORT_FILES:
            if not (self.tmp / rel).exists() and (self.out / rel).is_file():
                (self.out / rel).unlink()
        for src in sorted(self.tmp.rglob("*")):
            if src.is_file():
                dst = self.out / src.relative_to(self.tmp)
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return self.out

    def _swap_in(self) -> bool:
        """Put the new report in place of an existing folder in one step: the folder's other files
        (not a report's) are hard-linked (or copied) into the temp folder, which is then exchanged
        with the folder by Linux's renameat2(RENAME_EXCHANGE); a kill at any point leaves either the
        old folder or the new one, never a mix.  False where the exchange is not available."""
        exchange = _renameat2()
        if exchange is None or not self.out.is_dir() or self.out.is_symlink():
            return False
        report = set(self.REPORT_FILES)
        for src in sorted(self.out.rglob("*")):
            rel = src.relative_to(self.out)
            dst = self.tmp / rel
            if src.is_dir() and not src.is_symlink():
                dst.mkdir(exist_ok=True)
            elif rel.as_posix() not in report and not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                if src.is_symlink():
                    os.symlink(os.readlink(src), dst)
                else:
                    try:
                        os.link(src, dst)
                    except OSError:
                        shutil.copy2(src, dst)
        os.chmod(self.tmp, stat.S_IMODE(self.out.stat().st_mode))
        if exchange(str(self.tmp), str(self.out)) != 0:
            return False
        shutil.rmtree(self.tmp, ignore_errors=True)       # the old folder, now under the temp name
        return True

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def _renameat2():
    """``exchange(a, b) -> 0 | -1`` swapping two paths atomically (Linux renameat2 with
    RENAME_EXCHANGE, glibc >= 2.28), or None where the C library has no such call."""
    import ctypes
    import sys
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2

    def exchange(a: str, b: str) -> int:
        return fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return exchange
