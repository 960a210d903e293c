"""Accuracy of dsim's VIDUR-style operator regressors on the real GPU profiles.

    python experiments/vidur_operator_accuracy.py      # ~30 s on 2 cores

For every (GPU, model, TP, operator) in ../shared/data/profiling/vidur/compute:
* held-out: train on even rows, predict odd rows (interpolation inside the profiled range);
* extrapolation: train on num_tokens <= 2048, predict the rows above (up to 4096), against a
  random forest of the kind VIDUR uses (which flat-lines beyond its training range).
Error = weighted absolute percentage error (sum |pred - real| / sum real) per operator.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from sklearn.ensemble import RandomForestRegressor

sys.path.append(str(Path(__file__).resolve().parents[1]))    # an installed dsim wins over the checkout
from dsim.latency.vidur import OPS, OperatorModel, _read_csv  # noqa: E402

# every profile (the package ships only the H100 Llama-2 subset)
FULL = Path(os.environ.get("DSIM_VIDUR_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "profiling" / "vidur"))


def wape(p, y):
    return float(np.sum(np.abs(p - y)) / np.sum(y))


def main():
    held, ext, forest = [], [], []
    for f in sorted((FULL / "compute").glob("*/*/*/mlp.csv")):
        rows = _read_csv(f)
        for tp in sorted({int(r["num_tensor_parallel_workers"]) for r in rows}):
            rr = [r for r in rows if int(r["num_tensor_parallel_workers"]) == tp]
            x = np.array([float(r["num_tokens"]) for r in rr])
            for op in OPS:
                if f"time_stats.{op}.median" not in rr[0]:
                    continue
                y = np.array([float(r[f"time_stats.{op}.median"]) for r in rr])
                even = np.arange(len(x)) % 2 == 0
                held.append(wape(OperatorModel(x[even], y[even]).predict(x[~even]), y[~even]))
                lo = x <= 2048
                ext.append(wape(OperatorModel(x[lo], y[lo]).predict(x[~lo]), y[~lo]))
                rf = RandomForestRegressor(n_estimators=20, max_depth=8, random_state=0, n_jobs=1)
                rf.fit(x[lo].reshape(-1, 1), y[lo])
                forest.append(wape(rf.predict(x[~lo].reshape(-1, 1)), y[~lo]))
    print(f"{len(held)} (GPU, model, TP, operator) series")
    print(f"held-out rows, inside the range:  WAPE median {np.median(held):.1%}, mean {np.mean(held):.1%}")
    print(f"beyond the range (n > 2048):      WAPE median {np.median(ext):.1%}, mean {np.mean(ext):.1%}")
    print(f"random forest, same split:        WAPE median {np.median(forest):.1%}, mean {np.mean(forest):.1%}")


if __name__ == "__main__":
    main()
