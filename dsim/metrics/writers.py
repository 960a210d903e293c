"""Result files, written atomically: everything goes to a temporary folder, then is moved in."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..config.errors import ConfigError
from ..core.request import STATE_NAMES

# e2el_ms is vLLM's name (`vllm bench serve`'s e2el); e2e_ms, the same value, stays for one release
# as an alias for readers of older reports (docs/outputs: deprecated)
ALIASES = {"e2e_ms": "e2el_ms"}
COLUMNS = ("request_id", "label", "state", "arrival_s", "queued_s", "scheduled_s", "first_token_s",
           "completion_s", "prompt_tokens", "output_tokens", "generated_tokens", "ttft_ms", "tpot_ms",
           "e2el_ms", "e2e_ms", "queue_ms", "preemptions", "preempt_times_s", "cached_prefix_tokens", "prefix_group",
           "tenant", "session", "replica", "prefill_replica", "kv_ready_s", "reject_reason",
           "priority", "slo_class", "route_ms", "spec_device", "spec_rounds", "spec_fused_rounds",
           "spec_drafted_tokens", "spec_accepted_tokens", "spec_tvt_ms", "spec_drafter",
           "energy_j", "kv_peak_bytes", "decode_scheduled_s")


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
        e2el = f(r.t_completion - r.arrival if done else None, 1e3)
        yield (r.rid, r.label, STATE_NAMES[r.state], f(r.arrival), f(r.t_queued), f(r.t_scheduled),
               f(r.t_first_token), f(r.t_completion), r.prompt_len, r.max_tokens, r.n_out,
               f(None if r.t_first_token is None else r.t_first_token - r.arrival, 1e3),
               f(tpot, 1e3), e2el, e2el,
               f(None if r.t_scheduled is None else r.t_scheduled - r.arrival, 1e3),
               len(r.preempt_times), ";".join(f"{t:.6f}" for t in r.preempt_times) or empty,
               r.cached_tokens, opt(r.prefix_group), r.tenant or empty, opt(r.session), r.replica or empty,
               r.prefill_replica or empty, f(r.t_kv_ready), r.reject_reason or empty, r.priority,
               r.slo_class or empty, f(None if r.t_routed is None else r.t_routed - r.arrival, 1e3),
               *_spec_cols(r.spec, f, empty), f(r.energy_j), r.kv_peak_bytes, f(r.t_decode_scheduled))


def _spec_cols(st, f, empty) -> tuple:
    """Speculative decoding per request (dsim.specdec.state.SpecState): its draft device, rounds
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


MARKER = ".dsim-report"        # the files of a report, one relative path a line: what dsim may replace
SUBFOLDERS = ("plots", "deploy")   # a report's folders of files (plots/*.png, plan's deploy/): one level
# what reports written before the marker existed may hold (run, cosim, calibrate, oracle)
_LEGACY = frozenset(("summary.json", "manifest.json", "requests.csv", "timeline.json", "vllm_traces.otlp.jsonl",
                     "cosim.json", "cosim.md", "replay.jsonl", "scenario.yaml", "calibrated.yaml", "report.json",
                     "report.md", "oracle.csv", "oracle.json", "plan.md", "best.yaml", "top.csv", "pareto.csv",
                     "candidates.csv", "pareto.png", "capacity.json", "capacity.md", "capacity.png",
                     "report.html", "timeline.csv"))
_LEGACY_ANCHORS = ("manifest.json", "cosim.json", "calibrated.yaml", "oracle.json", "plan.md", "capacity.json")
_TMP = re.compile(r"^\..+\.tmp-(\d+)-[^/]+$")


def foreign_entry(folder: Path) -> str | None:
    """The first entry of an existing, non-empty ``folder`` that dsim did not write, or None when the
    folder is a dsim report (its marker lists everything in it; an older report: only report files
    beside its manifest).  Reads two levels (the folder and its plots/ or deploy/), never walks a tree."""
    try:
        top = sorted(os.listdir(folder))
    except OSError as e:
        return f"(unreadable: {e.strerror})"
    if not top:
        return None
    owned: set[str] | None = None
    if MARKER in top:
        try:
            owned = {ln for ln in (folder / MARKER).read_text().splitlines() if ln}
        except (OSError, UnicodeDecodeError):
            return MARKER
    elif not any(a in top for a in _LEGACY_ANCHORS):
        return top[0]
    for name in top:
        if name == MARKER:
            continue
        p = folder / name
        if name in SUBFOLDERS and p.is_dir() and not p.is_symlink():
            try:
                inner = sorted(os.listdir(p))
            except OSError:
                return name
            for f in inner:
                rel = f"{name}/{f}"
                legacy_ok = name == "plots" and f.endswith(".png") and (p / f).is_file()
                if (rel not in owned or not (p / f).is_file()) if owned is not None else not legacy_ok:
                    return rel
            continue
        if p.is_symlink() or not p.is_file() or ((name not in owned) if owned is not None else name not in _LEGACY):
            return name
    return None


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it in: readers see all or nothing.  The
    file gets the mode a plain ``open`` would give (mkstemp's is 0600: a trace or a fitted file
    another user or container could not read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class AtomicOutput:
    """Collect a report's files in a temp folder beside ``out``; ``commit`` puts it in place in one
    rename, ``abort`` drops it.  As a context manager (``with AtomicOutput(out) as ao:``, or
    ``output_folder``) it commits when the block ends and aborts when it raises, unless the block
    committed already (a search that writes its card, then reports the failure).

    Why so strict: ``--out`` may name any folder, and a user's folder is not ours.  An existing
    ``out`` must be empty or a dsim report holding nothing but the report (``foreign_entry``);
    anything else is refused before the run.  A report is replaced whole (exchanged with the new
    one, then the old one removed), so no file dsim did not write is ever moved, copied or deleted,
    and no tree is walked."""

    def __init__(self, out: Path):
        self.out = Path(out)
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(str(out), None, "an output folder (this is a file)", show_value=False)
        if self.out.is_dir():
            self._check_replaceable()
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self._clean_stale()
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-{os.getpid()}-", dir=self.out.parent))
        except OSError as e:
            raise ConfigError(str(out), None, f"an output folder that can be written ({e.strerror})",
                              show_value=False) from None
        self.done = False                              # committed or aborted: nothing left to do

    def __enter__(self) -> AtomicOutput:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if self.done:
            return
        if kind is not None:
            self.abort()                               # nothing half-written under the folder's name
            return
        try:
            self.commit()
        except BaseException:
            self.abort()
            raise

    def _check_replaceable(self) -> None:
        try:
            here = Path.cwd().resolve()
        except OSError:
            here = None
        real = self.out.resolve()
        if here is not None and (real == here or real in here.parents):
            raise ConfigError(str(self.out), None, "a folder that is not the current folder or one above it "
                              "(a report replaces its folder whole)", show_value=False)
        if self.out.is_symlink():
            raise ConfigError(str(self.out), None, "a real folder, not a symbolic link", show_value=False)
        bad = foreign_entry(self.out)
        if bad is not None:
            raise ConfigError(str(self.out), None, f"an empty folder or a dsim report folder (it holds {bad!r}, "
                              "which dsim did not write; nothing was changed: choose another --out)",
                              show_value=False)

    def _clean_stale(self) -> None:
        """Remove temp folders that dead dsim processes left in this parent (killed runs), whatever
        report they were for: only names of our own temp pattern, only when their process is gone."""
        try:
            names = os.listdir(self.out.parent)
        except OSError:
            return
        for name in names:
            m = _TMP.match(name)
            d = self.out.parent / name
            if m is None or d.is_symlink() or not d.is_dir():
                continue
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                shutil.rmtree(d, ignore_errors=True)
            except (OSError, OverflowError):
                pass                                   # alive under another user: leave it

    def path(self, rel: str) -> Path:
        p = self.tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def write_text(self, rel: str, text: str) -> None:
        self.path(rel).write_text(text)

    def _write_marker(self) -> None:
        files = []
        for name in sorted(os.listdir(self.tmp)):
            if name in SUBFOLDERS and (self.tmp / name).is_dir():
                files += [f"{name}/{f}" for f in sorted(os.listdir(self.tmp / name))]
            else:
                files.append(name)
        (self.tmp / MARKER).write_text("".join(f"{f}\n" for f in files))

    def commit(self) -> Path:
        self._write_marker()
        os.chmod(self.tmp, 0o777 & ~_umask())
        if not self.out.exists():
            os.replace(self.tmp, self.out)
            self.done = True
            return self.out
        self._check_replaceable()                      # still ours at the moment of the swap
        exchange = _renameat2()
        if exchange is not None and exchange(str(self.tmp), str(self.out)) == 0:
            shutil.rmtree(self.tmp, ignore_errors=True)   # the old report, now under the temp name
            self.done = True
            return self.out
        # no atomic exchange on this system: move the old report aside, the new one in, drop the old
        old = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-{os.getpid()}-", dir=self.out.parent))
        os.rmdir(old)
        os.replace(self.out, old)
        os.replace(self.tmp, self.out)
        shutil.rmtree(old, ignore_errors=True)
        self.done = True
        return self.out

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.done = True


def output_folder(out) -> AtomicOutput | contextlib.nullcontext:
    """``with output_folder(out) as ao:``: an ``AtomicOutput`` for ``out`` (opened now, so an
    unwritable folder fails before any work), committed when the block ends and dropped when it
    raises; ``ao`` is None when ``out`` is None (no folder asked for)."""
    return AtomicOutput(Path(out)) if out is not None else contextlib.nullcontext()


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


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
