"""Two checkouts of dsim timed as whole processes, run by run (A B A B ...), so a noisy machine
slows both alike: medians of each side and the median of the per-pair ratios B/A.

    python experiments/interleaved_pairs.py OLD_CHECKOUT NEW_CHECKOUT 12 \\
        run scenarios/quickstart.yaml --no-plots --quiet --set workload.num_requests=100 --out {o}
    python experiments/interleaved_pairs.py OLD_CHECKOUT NEW_CHECKOUT 6 bench

Each checkout runs on its own PYTHONPATH, from its own folder; ``{o}`` in the arguments becomes a fresh
output folder per run.  PYTHONDONTWRITEBYTECODE is dropped and each side runs once before the pairs,
so both start from cached bytecode, as an installed package does.  (The issue 37 speed figures in the
closing note of 2026-11-26 were measured with this script.)
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time


def once(root: str, args: list, env: dict) -> float:
    out = tempfile.mkdtemp()
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dsim.cli"] + [a.replace("{o}", out + "/o") for a in args], cwd=root,
                   env=dict(env, PYTHONPATH=root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def main() -> None:
    a, b, n, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    once(a, args, env)
    once(b, args, env)
    ta, tb = [], []
    for _ in range(n):
        ta.append(once(a, args, env))
        tb.append(once(b, args, env))
    print(f"A median {statistics.median(ta):.3f} s  B median {statistics.median(tb):.3f} s  "
          f"median ratio B/A {statistics.median(y / x for x, y in zip(ta, tb)):.3f}  ({n} pairs)")


if __name__ == "__main__":
    main()
