"""Operator-level step time trained from real GPU profiles (in the spirit of VIDUR).

VIDUR profiles every non-attention operator of a transformer layer on a real GPU (mlp.csv:
median CUDA time in ms by num_tokens and TP degree) and the collectives by message size
(all_reduce.csv).  Here each operator gets two parts:

* a physically shaped fit, time = a + b x n (NNLS, a, b >= 0) on the upper half of the profiled
  range, where the kernels are throughput-bound; it carries predictions beyond the profiled
  range (VIDUR's random forests flat-line there);
* a depth-capped regression tree (n_jobs=1) on the residuals inside the range, which captures
  tile quantisation and small-batch kernel floors; beyond the range its edge value is kept.

The tabulated time is made non-decreasing in tokens (a running maximum), since profile noise can
dip and a larger batch never costs less than a smaller one.  A step is: embedding once, per layer the ten profiled operators (two residual adds), two TP
all-reduces per layer, plus attention and the LM head from the roofline (not in the profiles)
and a fixed per-step overhead.  The per-layer time for every token count up to the scheduler's
budget is tabulated once, so a step is an array lookup.  Trained models are cached with joblib
under a key that hashes the profile bytes, the architecture, TP and this module's version.
"""
from __future__ import annotations

import csv
import hashlib
import io
import os
from importlib import resources
from functools import lru_cache
from pathlib import Path

import joblib
import numpy as np
from scipy.optimize import nnls
from sklearn.tree import DecisionTreeRegressor

from ..config.errors import MissingAssetError
from ..config.files import note_read
from .base import BatchShape
from .collectives import all_reduce_terms

VERSION = "1"
OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
       "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
LAYER_OPS = {op: (2 if op == "add" else 1) for op in OPS if op != "emb"}   # calls per layer
DEVICE_DIRS = {"H100-SXM": ("h100", "h100_dgx"), "A100-80GB": ("a100", "a100_dgx"),
               "A100-40GB": ("a100", "a100_dgx"), "A40": ("a40", None)}
# package data: the H100 Llama-2 subset (data/vidur/PROVENANCE.md); DSIM_VIDUR_DATA names a full copy
DEFAULT_DATA = Path(str(resources.files("dsim").joinpath("data/vidur")))
TREE_DEPTH = 6


def data_dir() -> Path:
    return Path(os.environ.get("DSIM_VIDUR_DATA", DEFAULT_DATA))


def cache_dir() -> Path:
    return Path(os.environ.get("DSIM_CACHE_DIR", Path.home() / ".cache" / "dsim")) / "vidur"


class OperatorModel:
    """time(n) = a + b*n  +  tree residual (n clamped to the profiled range)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, depth: int = TREE_DEPTH):
        x = np.asarray(x, float)
        y = np.asarray(y, float)
        upper = x >= np.median(x)
        A = np.column_stack([np.ones(upper.sum()), x[upper]])
        (self.a, self.b), _ = nnls(A, y[upper])
        self.x_lo, self.x_hi = float(x.min()), float(x.max())
        self.tree = DecisionTreeRegressor(max_depth=depth, min_samples_leaf=2, random_state=0)
        self.tree.fit(x.reshape(-1, 1), y - (self.a + self.b * x))

    def predict(self, n) -> np.ndarray:
        n = np.asarray(n, float)
        resid = self.tree.predict(np.clip(n, self.x_lo, self.x_hi).reshape(-1, 1))
        return np.maximum(self.a + self.b * n + resid, 0.0)


def _read_csv(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def _arch(model) -> tuple:
    """Layer shapes that set the profiled operators' cost (the vocabulary only sizes the
    embedding gather, and VIDUR pads it, so it is not compared)."""
    return (model.num_heads, model.num_kv_heads, model.hidden_size, model.intermediate_size,
            bool(model.gated_mlp))


def _row_arch(r: dict) -> tuple:
    return (int(r["n_head"]), int(r["n_kv_head"]), int(r["n_embd"]), int(r["n_expanded_embd"]),
            r["use_gated_mlp"].strip().lower() == "true")


def network_devices(root: Path | None = None) -> list[str]:
    """The network profiles (folders of all_reduce.csv / send_recv.csv) under the data folder."""
    base = (root or data_dir()) / "network"
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def find_profile(model, device_name: str, root: Path | None = None,
                 network: str | None = None) -> tuple[Path, Path | None]:
    """(mlp.csv of the profiled model with ``model``'s architecture, all_reduce.csv or None).
    ``network``: the network profile folder (VIDUR's network_device, e.g. h100_pairwise_nvlink);
    None: the GPU's DGX profile."""
    root = root or data_dir()
    if device_name not in DEVICE_DIRS:
        raise MissingAssetError("hardware", device_name, f"a GPU with VIDUR profiles: {', '.join(DEVICE_DIRS)}")
    gpu, net = DEVICE_DIRS[device_name]
    if network is not None:
        if not (root / "network" / network).is_dir():
            raise MissingAssetError("latency.network_device", network, "a VIDUR network profile under "
                                    f"{root / 'network'}: {', '.join(network_devices(root)) or 'none'}")
        net = network
    base = root / "compute" / gpu
    if not base.is_dir():
        raise MissingAssetError("latency.model", "vidur", f"VIDUR profiles under {base} (set DSIM_VIDUR_DATA)")
    seen = []
    want = _arch(model)
    for f in sorted(base.glob("*/*/mlp.csv")):
        with f.open() as fh:
            first = next(csv.DictReader(fh))
        seen.append(f"{f.parent.parent.name}/{f.parent.name}")
        if _row_arch(first) == want:
            ar = root / "network" / net / "all_reduce.csv" if net else None
            ar = ar if ar is not None and ar.exists() else None
            for used in (f, ar):
                if used is not None:
                    note_read(used)
            return f, ar
    if model.is_moe:
        raise MissingAssetError("model", model.name, "a dense model: the VIDUR profiles have no MoE layers")
    raise MissingAssetError("model", model.name, f"a model whose layer shapes were profiled on {gpu}: {', '.join(seen)}")


def _train(mlp_csv: Path, ar_csv: Path | None, tp: int, per_node: int | None = None) -> dict:
    rows = [r for r in _read_csv(mlp_csv) if int(r["num_tensor_parallel_workers"]) == tp]
    if not rows:
        tps = sorted({int(r["num_tensor_parallel_workers"]) for r in _read_csv(mlp_csv)})
        raise MissingAssetError("engine.tensor_parallel_size", tp, f"one of the profiled TP degrees {tps}")
    x = np.array([float(r["num_tokens"]) for r in rows])
    present = [op for op in OPS if f"time_stats.{op}.median" in rows[0]]   # phi-2 has no post-attn norm
    ops = {op: OperatorModel(x, np.array([float(r[f"time_stats.{op}.median"]) for r in rows])) for op in present}
    allreduce = None
    if tp > 1 and ar_csv is not None:
        ar = [r for r in _read_csv(ar_csv) if int(r["num_workers"]) == tp
              and int(r["devices_per_node"]) == (per_node or tp)]
        if ar:
            allreduce = OperatorModel(np.array([float(r["size"]) for r in ar]),
                                      np.array([float(r["time_stats.all_reduce.median"]) for r in ar]))
    return {"ops": ops, "allreduce": allreduce, "max_tokens": float(x.max())}


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
    return h.hexdigest()[:20]


@lru_cache(maxsize=16)
def trained(mlp_csv: str, ar_csv: str | None, tp: int, per_node: int | None = None) -> dict:
    """Operator models for (profile, TP, GPUs per node of the all-reduce: None all on one node):
    from memory, else the joblib cache, else trained."""
    m, a = Path(mlp_csv), Path(ar_csv) if ar_csv else None
    parts = (tp,) if per_node in (None, tp) else (tp, per_node)
    key = _digest(m.read_bytes(), a.read_bytes() if a else b"", *parts, VERSION, TREE_DEPTH)
    f = cache_dir() / f"{key}.joblib"
    if f.exists():
        try:
            return joblib.load(f)
        except Exception:  # a corrupt or incompatible cache entry: retrain and overwrite
            pass
    out = _train(m, a, tp, per_node)
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(f".{os.getpid()}.tmp")
        joblib.dump(out, tmp)
        os.replace(tmp, f)
    except OSError:
        pass  # a read-only home still runs, it just retrains next time
    return out


class VidurModel:
    name = "vidur"
    DEFAULTS = {"attn_compute_efficiency": 0.8, "attn_memory_efficiency": 0.8}

    def __init__(self, model, device, tp: int = 1, max_tokens: int = 8192, profiles: Path | None = None,
                 tp_comm: str = "profile", all_reduce: str | None = None, network_device: str | None = None,
                 **params):
        unknown = set(params) - set(self.DEFAULTS)
        if unknown:
            raise TypeError(f"unknown vidur parameters: {sorted(unknown)}")
        p = {**self.DEFAULTS, **params}
        mlp, ar = find_profile(model, device.name, profiles, network_device)
        self.profile = str(mlp)
        self.network_profile = str(ar) if ar else None
        # a TP group beyond hardware.gpus_per_node: the profile's rows of that many GPUs per node, if any
        across = device.crosses_nodes(tp)
        per_node = device.gpus_per_node if across else None
        t = trained(str(mlp), str(ar) if ar else None, tp, per_node)
        self.ops = t["ops"]
        L = model.num_layers
        n = np.arange(max_tokens + 1, dtype=float)
        per_layer = sum(k * self.ops[op].predict(n) for op, k in LAYER_OPS.items() if op in self.ops)
        table = self.ops["emb"].predict(n) + L * per_layer
        bpp = model.bytes_per_param
        # (TP, GPUs per node, layers, all-reduce bytes per token, is the all-reduce the profiled one)
        self._noise_args = (tp, per_node or tp, L, model.hidden_size * bpp, False)
        self._sigma: dict = {}
        if tp > 1:
            if t["allreduce"] is not None and tp_comm == "profile":
                self._noise_args = self._noise_args[:4] + (True,)
                table = table + 2 * L * t["allreduce"].predict(n * model.hidden_size * bpp)
                self.comm = "profiled all_reduce" + (f" ({per_node} GPUs per node)" if across else "")
            else:
                fixed, coef, bw = all_reduce_terms(device, tp, all_reduce)
                table = table + 2 * L * 1e3 * (fixed + coef * n * model.hidden_size * bpp / bw)
                self.comm = ("roofline all_reduce" + (f" ({all_reduce})" if all_reduce else "")
                             + ("" if tp_comm == "roofline" else " (across nodes)" if across else " (no profile)"))
        else:
            self.comm = "none"
        table[0] = 0.0
        # profile noise (medians at small n, the all-reduce sweep) can dip; more tokens never cost
        # less than fewer (a kernel could pad), so the table is made non-decreasing
        table = np.maximum.accumulate(table)
        self.table_s = table * 1e-3          # seconds, index = tokens in the step
        self.max_tokens = max_tokens
        self.profiled_max_tokens = t["max_tokens"]
        self._flops_pair = model.attn_flops_per_pair / tp / (device.peak_flops * p["attn_compute_efficiency"])
        self._kv_tok = model.kv_bytes_per_token / model.kv_shards(tp) / (device.hbm_bytes_s * p["attn_memory_efficiency"])
        self._head_c = model.flops_lm_head / tp / (device.peak_flops * p["attn_compute_efficiency"])
        self._head_m = model.lm_head_params * bpp / tp / (device.hbm_bytes_s * p["attn_memory_efficiency"])
        self.params = p

    # ---- per-shape kernel noise (dsim.latency.kernel_noise) -------------------------------------
    def _sigma_of(self, correlation: str):
        """(std in s by token count up to max_tokens, the same as a function of any count)."""
        got = self._sigma.get(correlation)
        if got is None:
            from .kernel_noise import allreduce_noise, operator_noise, step_sigma_ms
            tp, per_node, L, ar_bytes, profiled_ar = self._noise_args
            ops = operator_noise(self.profile, tp, OPS)
            ar = allreduce_noise(self.network_profile, tp, per_node) if profiled_ar else None

            def f(tokens):
                return step_sigma_ms(tokens, ops, LAYER_OPS, L, ar, ar_bytes, correlation) * 1e-3
            table = f(np.arange(self.max_tokens + 1, dtype=float))
            table[0] = 0.0
            got = self._sigma[correlation] = (table, f)
        return got

    def step_sigma(self, b: BatchShape, correlation: str = "correlated") -> float:
        """std (s) of this step's time from the profiled operators' run-to-run noise at its token
        count (attention and the LM head, not profiled, add none)."""
        tokens = b.prefill_tokens + b.decode_tokens
        table, f = self._sigma_of(correlation)
        return float(table[tokens]) if tokens <= self.max_tokens else float(f(tokens))

    def linear_time(self, tokens: int) -> float:
        if tokens <= self.max_tokens:
            return float(self.table_s[tokens])
        # beyond the table: extend with the last tabulated slope (linear, as the fit)
        slope = self.table_s[-1] - self.table_s[-2]
        return float(self.table_s[-1] + slope * (tokens - self.max_tokens))

    def step_time(self, b: BatchShape) -> float:
        tokens = b.prefill_tokens + b.decode_tokens
        if tokens == 0:
            return 0.0
        pairs = b.prefill_attn_pairs + b.decode_ctx_sum
        attn_c = self._flops_pair * pairs
        attn_m = self._kv_tok * (b.decode_ctx_sum + b.prefill_ctx_tokens + tokens)
        head_c = self._head_c * b.num_sampled
        head = head_c if head_c > self._head_m else self._head_m
        return self.linear_time(tokens) + (attn_c if attn_c > attn_m else attn_m) + head
