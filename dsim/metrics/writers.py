"""Result files, written atomically: everything goes to a temporary folder, then is moved in."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..config.errors import ConfigError
from ..core.request import STATE_NAMES

COLUMNS = ("request_id", "label", "state", "arrival_s", "queued_s", "scheduled_s", "first_token_s",
           "completion_s", "prompt_tokens", "output_tokens", "generated_tokens", "ttft_ms", "tpot_ms",
           "e2e_ms", "queue_ms", "preemptions", "preempt_times_s", "cached_prefix_tokens", "prefix_group",
           "tenant", "session", "replica", "prefill_replica", "kv_ready_s", "reject_reason")


def _f(x, scale=1.0):
    return "" if x is None else f"{x * scale:.6f}"


def requests_csv(reqs) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in sorted(reqs, key=lambda r: r.rid):
        done = r.t_completion is not None
        tpot = (r.t_last_token - r.t_first_token) / (r.n_out - 1) if done and r.n_out > 1 else None
        w.writerow((r.rid, r.label, STATE_NAMES[r.state], _f(r.arrival), _f(r.t_queued), _f(r.t_scheduled),
                    _f(r.t_first_token), _f(r.t_completion), r.prompt_len, r.max_tokens, r.n_out,
                    _f(None if r.t_first_token is None else r.t_first_token - r.arrival, 1e3),
                    _f(tpot, 1e3), _f(r.t_completion - r.arrival if done else None, 1e3),
                    _f(None if r.t_scheduled is None else r.t_scheduled - r.arrival, 1e3),
                    len(r.preempt_times), ";".join(f"{t:.6f}" for t in r.preempt_times),
                    r.cached_tokens, r.prefix_group, r.tenant, r.session, r.replica or "",
                    r.prefill_replica or "", _f(r.t_kv_ready), r.reject_reason))
    return buf.getvalue()


def to_json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


class AtomicOutput:
    """Collect files in a temp folder beside ``out``; ``commit`` moves them in, ``abort`` drops them."""

    def __init__(self, out: Path):
        self.out = Path(out)
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(str(out), None, "an output folder (this is a file)", show_value=False)
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-", dir=self.out.parent))
        except OSError as e:
            raise ConfigError(str(out), None, f"an output folder that can be written ({e.strerror})",
                              show_value=False) from None

    def path(self, rel: str) -> Path:
        p = self.tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def write_text(self, rel: str, text: str) -> None:
        self.path(rel).write_text(text)

    # files a report may contain: on re-use of a folder, ones this run did not write are removed,
    # so a report never mixes two runs (other files in the folder are left alone)
    REPORT_FILES = ("summary.json", "manifest.json", "requests.csv", "timeline.json",
                    "plots/latency_cdf.png", "plots/timeline.png", "plots/network.png")

    def commit(self) -> Path:
        if not self.out.exists():
            os.replace(self.tmp, self.out)
            return self.out
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

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
