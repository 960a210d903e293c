"""dsim.core.malloc: freed large arrays go back to the operating system under the ``dsim`` command."""
import os
import platform
import subprocess
import sys

import pytest

# A 24 MiB array freed raises glibc's mmap threshold to 24 MiB; eight 8 MiB arrays then come from the
# heap, and with the last one kept the heap cannot shrink past the seven freed below it.
PROBE = """
import sys
import numpy as np
from dsim.core.malloc import hold_mmap_threshold
def rss():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * 4096 / 2**20
if sys.argv[1] == 'held':
    assert hold_mmap_threshold()
big = np.ones(3 << 20)
del big
base = rss()
held = [np.ones(1 << 20) for _ in range(8)]
last = held[-1]
del held
print(rss() - base)
"""


GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="glibc's allocator and /proc: Linux with glibc only")
def test_a_held_threshold_gives_freed_arrays_back():
    def grown(mode):
        # glibc's defaults: no allocator setting of the caller's (env vars, tunables) may change them
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                             env=env)
        return float(out.stdout)
    free_mb, held_mb = grown("free"), grown("held")
    # glibc keeps the seven freed 8 MiB arrays (~56 MiB) resident unless the threshold is held
    assert free_mb > 40, free_mb
    assert held_mb < 16, held_mb


def test_the_user_setting_wins(monkeypatch):
    from dsim.core.malloc import hold_mmap_threshold
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert hold_mmap_threshold() is False


def test_the_dsim_command_holds_the_threshold(monkeypatch, capsys):
    """The command, not the library: ``dsim.cli.main`` asks for the held threshold before it runs."""
    import dsim.core.malloc as malloc
    from dsim.cli import main
    calls = []
    monkeypatch.setattr(malloc, "hold_mmap_threshold", lambda: calls.append(1) or True)
    main(["schema", "--markdown"])
    capsys.readouterr()
    assert calls == [1]


def test_a_python_run_leaves_the_allocator_alone(monkeypatch):
    """A program that imports dsim and runs a scenario keeps its own allocator settings."""
    import json

    import dsim.core.malloc as malloc
    from dsim.bench import BENCH_SCENARIO
    from dsim.runner import run
    calls = []
    monkeypatch.setattr(malloc, "hold_mmap_threshold", lambda: calls.append(1) or True)
    scn = json.loads(json.dumps(BENCH_SCENARIO))
    scn["workload"]["num_requests"] = 5
    assert run(scn, plots=False).summary["requests"]["completed"] == 5
    assert calls == []
