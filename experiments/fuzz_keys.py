"""Mutate every leaf key of every shipped scenario with hostile values and check each run ends
with exit 0 or a one-line exit-2 error (never a traceback, a hang or another exit code).

    python experiments/fuzz_keys.py                 # all scenarios, ~ a few minutes on 2 cores
    python experiments/fuzz_keys.py quickstart      # one scenario

Runs in-process with a small request count (workload.num_requests=30 where the scenario has
one) and an alarm per case; prints the failures, one line each.
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
from dsim.cli import main  # noqa: E402

VALUES = ["null", ".nan", ".inf", "-.inf", "-1", "0", "1.0e+30", "1000000000000", "''", "[]", "{}", "'ü\x00'"]


def leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix


class _Timeout(BaseException):          # not an Exception: the CLI's error handler must not catch it
    pass


def _alarm(*_):
    raise _Timeout()


def run_case(path: Path, extra: list, timeout: int = 20):
    # one folder per process: two campaigns at once (test workers, two users) must not replace each
    # other's report mid-run
    out = Path(tempfile.gettempdir()) / f"dsim-fuzz-out-{os.getpid()}"
    args = ["run", str(path), "--out", str(out), "--quiet", "--no-plots"]
    for e in extra:
        args += ["--set", e]
    err = io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(args)
    except _Timeout:
        return "hang", ""
    finally:
        signal.alarm(0)
    text = err.getvalue().strip()
    if rc == 0 or (rc == 2 and text.startswith("dsim: error:") and "\n" not in text):
        return None, text
    return f"rc={rc}", text.splitlines()[-1] if text else ""


def fuzz(names, values=VALUES, report=print):
    """Run every (scenario, leaf key, value) case; return (failures, total)."""
    bad = 0
    total = 0
    for name in names:
        path = ROOT / "scenarios" / f"{name}.yaml"
        doc = yaml.safe_load(path.read_text())
        small = ["workload.num_requests=30"] if isinstance(doc.get("workload"), dict) and "num_requests" in doc["workload"] else []
        for key in leaves(doc):
            if key in ("name", "description") or key.startswith("workload.path"):
                continue
            for v in values:
                total += 1
                what, text = run_case(path, small + [f"{key}={v}"])
                if what:
                    bad += 1
                    report(f"{name}: --set {key}={v}: {what}: {text[:160]}")
    return bad, total


def main_(argv):
    names = argv or sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))
    bad, total = fuzz(names, report=lambda line: print(line, flush=True))
    print(f"{bad} failures in {total} cases")


if __name__ == "__main__":
    main_(sys.argv[1:])
