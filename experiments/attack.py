"""Attack suite beyond leaf values (issue 36, item 6): three deterministic mutators whose every case
must end with exit 0 or a one-line exit-2 error, within an alarm, leaving no output folder on
exit 2 and writing nothing outside its tmp folder.

    python experiments/attack.py structural --n 300 --seed 0   # scenario sections moved/swapped/...
    python experiments/attack.py data --n 300                  # hostile data files of every kind
    python experiments/attack.py flags --n 300                 # numeric CLI flags at/past bounds
    python experiments/attack.py flags --seed 0 --only 17      # reproduce one case

Case ``i`` of a mutator is built from ``random.Random(f"{mutator}/{seed}/{i}")`` (flags: a seeded
permutation of every (command, flag, value)), so (mutator, seed, index) reproduces it exactly.
Cases run in-process through ``dsim.cli.main`` (fuzz_keys' pattern): a process per case would
spend ~1 s importing.  tests/test_attack.py runs a fixed sample of each.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import io
import json
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
sys.path.insert(0, str(ROOT / "experiments"))
from fuzz_keys import _alarm, _Timeout  # noqa: E402  (fuzz_keys: the in-process alarm pattern)

from dsim.cli import main as dsim_main  # noqa: E402
from dsim.config.files import load_yaml  # noqa: E402

SCN = ROOT / "scenarios"
REAL = ROOT / "examples" / "real"
SMALL = 30                                   # requests per simulated case
MEM_LIMIT = 8 * 1024 ** 3                    # address space of a case: a blow-up is a MemoryError, not an OOM kill
PATH_KEYS = ("path", "file", "config", "head", "bundle", "space")


@dataclass
class Case:
    """One attack: ``build(dir)`` writes its inputs and returns the dsim argv."""
    mutator: str
    seed: int
    index: int
    what: str
    build: object
    ok_codes: tuple = (0, 2)
    names: str | None = None       # an exit-2 message must hold this (the flag a flag case sets)

    def describe(self) -> str:
        return f"{self.mutator} seed={self.seed} #{self.index}: {self.what}"

    def reproduce(self) -> str:
        return f"python experiments/attack.py {self.mutator} --seed {self.seed} --only {self.index}"


@dataclass
class Result:
    case: Case
    rc: int | None
    verdict: str | None            # None = the oracle holds
    err: str = ""
    seconds: float = 0.0
    kind: str = field(default="ok")   # ok | hang | memory | internal | other | unnamed (passes)


# ---- scenarios --------------------------------------------------------------------------------------
def _absolute(node, base: Path):
    """A shipped scenario's relative data paths made absolute, so a copy elsewhere still finds them."""
    if isinstance(node, dict):
        return {k: (str((base / v).resolve()) if k in PATH_KEYS and isinstance(v, str) and (base / v).exists()
                    else _absolute(v, base)) for k, v in node.items()}
    if isinstance(node, list):
        return [_absolute(v, base) for v in node]
    return node


_DOCS: dict = {}


def scenario(name: str) -> dict:
    if name not in _DOCS:
        p = SCN / f"{name}.yaml"
        _DOCS[name] = _absolute(load_yaml(p.read_text(), str(p)), SCN)
    return copy.deepcopy(_DOCS[name])


def scenario_names() -> list:
    return sorted(p.stem for p in SCN.glob("*.yaml"))


def _small_set(doc) -> list:
    """--set that keeps a run short: num_requests where the workload has one, else a horizon."""
    if isinstance(doc, dict):
        w = doc.get("workload")
        if isinstance(w, dict) and isinstance(w.get("num_requests"), int) and not isinstance(w["num_requests"], bool):
            return ["--set", f"workload.num_requests={SMALL}"]
    return ["--set", "horizon_s=5"]


def _run_argv(path: Path, d: Path, doc=None) -> list:
    return ["run", str(path), "--quiet", "--no-plots", "--out", str(d / "out")] + _small_set(doc)


def yaml_dump(doc) -> str:
    import yaml
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=1_000_000)


# ---- 1. structural mutator ----------------------------------------------------------------------------
SECTIONS = ("engine", "latency", "cluster", "network", "workload", "slo", "speculation", "output", "model", "hardware")
FEATURES = {"network": "pd_network", "speculation": "hybrid_rtt", "cluster": "router_comparison",
            "latency": "lut", "workload": "staged_shared_prefix", "engine": "kv_offload_cpu"}
SCALARS = (0, -1, "x", True, None, 1e308, "")


def _with(names, rng, key=None):
    """A scenario that has ``key`` (any if None)."""
    pool = [n for n in names if key is None or key in scenario(n)]
    return rng.choice(pool)


def _structural(rng: random.Random, names: list, op: str):
    """(description, file bytes) of one structural mutation."""
    a = _with(names, rng)
    doc = scenario(a)
    if op == "engine_under_pool":
        src = _with(names, rng, "cluster")
        doc = scenario(src)
        pools = doc["cluster"].get("pools") if isinstance(doc["cluster"], dict) else None
        if isinstance(pools, list) and pools and isinstance(pools[0], dict) and "engine" in doc:
            pools[0]["engine"] = doc.pop("engine")
            return f"{src}: engine moved under cluster.pools[0]", doc
        doc.setdefault("cluster", {})["engine"] = doc.pop("engine", {})
        return f"{src}: engine moved under cluster", doc
    if op in ("move_section", "swap_section"):
        key = rng.choice([k for k in SECTIONS if any(k in scenario(n) for n in names)])
        src = _with(names, rng, key)
        if op == "swap_section":
            dst = rng.choice(names)
            doc = scenario(dst)
            doc[key] = scenario(src)[key]
            return f"{key} of {src} put into {dst}", doc
        host = rng.choice([k for k in SECTIONS if k != key])
        doc = scenario(src)
        v = doc.pop(key)
        if isinstance(doc.get(host), dict):
            doc[host][key] = v
        else:
            doc[host] = {key: v}
        return f"{src}: {key} moved under {host}", doc
    if op == "combine":
        feats = rng.sample(sorted(FEATURES), 5)
        doc = scenario(rng.choice(names))
        for f in feats:
            doc[f] = scenario(FEATURES[f])[f]
        return f"{doc.get('name')} + {', '.join(f'{f} of {FEATURES[f]}' for f in feats)}", doc
    keys = [k for k in doc if k not in ("name", "description")] or ["name"]
    key = rng.choice(keys)
    if op == "delete":
        del doc[key]
        return f"{a}: {key} deleted", doc
    if op == "duplicate_in_list":
        doc[key] = [doc[key], copy.deepcopy(doc[key])]
        return f"{a}: {key} duplicated under a list", doc
    if op == "wrap_in_list":
        doc[key] = [doc[key]]
        return f"{a}: {key} wrapped in a list", doc
    if op == "scalar":
        v = rng.choice(SCALARS)
        doc[key] = v
        return f"{a}: {key} replaced by {v!r}", doc
    if op == "rename":
        doc[key + "s"] = doc.pop(key)
        return f"{a}: {key} renamed {key}s", doc
    raise ValueError(op)


def _raw_structural(rng: random.Random, names: list, op: str):
    """(description, bytes, the scenario it still holds or None) of a mutation only expressible as text."""
    a = rng.choice(names)
    doc = scenario(a)
    what, data = _raw_text(rng, a, doc, op)
    if op in ("top_list", "empty"):
        return what, data, None
    return what, data, doc


def _raw_text(rng, a: str, doc: dict, op: str):
    text = yaml_dump(doc)
    if op == "anchors":
        key = rng.choice([k for k in ("engine", "slo", "latency", "workload") if k in doc] or ["name"])
        body = yaml_dump({key: doc[key]}).split("\n", 1)
        head = body[0].replace(f"{key}:", f"{key}: &shared", 1)
        rest = {k: v for k, v in doc.items() if k != key}
        where = rng.choice(["extra_alias", "cluster_alias", "self_alias"])
        tail = {"extra_alias": "extra: *shared\n", "self_alias": "description: &me [1, *me]\n",
                "cluster_alias": "cluster: {pools: [{name: p, replicas: 1, engine: *shared}]}\n"}[where]
        if where == "self_alias":
            rest.pop("description", None)
        return f"{a}: {key} anchored and aliased ({where})", (head + "\n" + body[1] + yaml_dump(rest) + tail).encode()
    if op == "alias_bomb":
        chain = ['&l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
        chain += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10)]
        bomb = "[" + ", ".join(chain) + "]"
        key = rng.choice(["seed", "name", "description", "workload.rate", "engine.max_num_seqs", "slo.ttft_ms",
                          "workload.prompt_tokens"])
        top, _, sub = key.partition(".")
        rest = {k: v for k, v in doc.items() if k != top}
        if sub:
            inner = doc.get(top) if isinstance(doc.get(top), dict) else {}
            tail = yaml_dump({top: {**inner, sub: "BOMB"}}).replace("BOMB", bomb)
        else:
            tail = f"{top}: {bomb}\n"
        return f"{a}: billion-laughs aliases (9^10 leaves) as {key}", (yaml_dump(rest) + tail).encode()
    if op == "deep_nesting":
        depth = 10_000
        key = rng.choice(["workload", "engine", "extra", "speculation"])
        form = rng.choice(["flow_map", "flow_list"])
        nest = ("{a: " * depth + "1" + "}" * depth) if form == "flow_map" else ("[" * depth + "1" + "]" * depth)
        rest = {k: v for k, v in doc.items() if k != key}
        doc.pop(key, None)
        return f"{a}: {key} nested {depth} deep ({form})", (yaml_dump(rest) + f"{key}: {nest}\n").encode()
    if op == "non_utf8":
        pos = rng.randrange(len(text))
        b = text.encode()
        junk = rng.choice([b"\xff\xfe", b"\xc3\x28", b"\x80", b"\xed\xa0\x80"])
        return f"{a}: bytes {junk!r} inserted at offset {pos}", b[:pos] + junk + b[pos:]
    if op == "duplicate_key":
        key = rng.choice([k for k in doc if k != "name"] or ["name"])
        return f"{a}: top-level {key} repeated", (text + yaml_dump({key: doc[key]})).encode()
    if op == "top_list":
        return f"{a}: the whole scenario inside a top-level list", yaml_dump([doc]).encode()
    if op == "empty":
        v = rng.choice(["", "\n", "# only a comment\n", "null\n", "---\n", "~\n"])
        return f"empty file {v!r}", v.encode()
    if op == "multi_doc":
        return f"{a}: two YAML documents", (text + "---\n" + text).encode()
    if op == "python_tag":
        tag = rng.choice(["!!python/object/apply:os.getcwd []", "!!python/name:os.system", "!!binary aGVsbG8=",
                          "!!set {a, b}", "2001-12-14t21:59:43.10-05:00", "!!timestamp 2001-12-14", "!custom 1"])
        key = rng.choice(["seed", "model", "engine", "workload"])
        rest = {k: v for k, v in doc.items() if k != key}
        doc.pop(key, None)
        return f"{a}: {key}: {tag}", (yaml_dump(rest) + f"{key}: {tag}\n").encode()
    if op == "json_form":
        body = json.dumps(doc)
        mut = rng.choice(["nan", "trailing_comma", "bom"])
        if mut == "nan":
            body = json.dumps({**doc, "seed": float("nan")})          # json writes the bare token NaN
        elif mut == "trailing_comma":
            body = body[:-1] + ",}"
        else:
            return f"{a}: as JSON with a UTF-8 BOM", b"\xef\xbb\xbf" + body.encode()
        return f"{a}: as JSON ({mut})", body.encode()
    raise ValueError(op)


DOC_OPS = ("engine_under_pool", "move_section", "swap_section", "combine", "delete", "duplicate_in_list",
           "wrap_in_list", "scalar", "rename")
RAW_OPS = ("anchors", "alias_bomb", "deep_nesting", "non_utf8", "duplicate_key", "top_list", "empty",
           "multi_doc", "python_tag", "json_form")
STRUCT_OPS = DOC_OPS + RAW_OPS


def structural_case(seed: int, i: int) -> Case:
    rng = random.Random(f"structural/{seed}/{i}")
    op = STRUCT_OPS[i % len(STRUCT_OPS)] if i < len(STRUCT_OPS) * 2 else rng.choice(STRUCT_OPS)
    names = scenario_names()
    if op in DOC_OPS:
        what, doc = _structural(rng, names, op)
        data, small = yaml_dump(doc).encode(), doc
    else:
        what, data, small = _raw_structural(rng, names, op)
    ext = ".json" if op == "json_form" else ".yaml"

    def build(d: Path):
        p = d / f"scenario{ext}"
        p.write_bytes(data)
        return _run_argv(p, d, small)
    return Case("structural", seed, i, f"[{op}] {what}", build)


# ---- 2. data-file mutator ----------------------------------------------------------------------------
def _read_rows(text: str, fmt: str):
    if fmt == "jsonl":
        return [json.loads(x) for x in text.splitlines() if x.strip()]
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(text)))
    if fmt == "json":
        return json.loads(text)
    return load_yaml(text, "data")


def _write_rows(obj, fmt: str) -> bytes:
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in obj).encode()
    if fmt == "csv":
        cols = list(dict.fromkeys(k for r in obj for k in r)) or ["x"]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, restval="")
        w.writeheader()
        w.writerows(obj)
        return buf.getvalue().encode()
    if fmt == "json":
        return json.dumps(obj).encode()
    return yaml_dump(obj).encode()


def _paths(obj, prefix=()):
    """Leaf paths of a JSON-like object as tuples."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list) and obj:
        for j, v in enumerate(obj):
            yield from _paths(v, prefix + (j,))
    else:
        yield prefix


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


HUGE = {"json": 10 ** 30, "csv": "1" + "0" * 40, "yaml": 10 ** 30}
BYTE_MUTS = ("truncate", "empty", "directory", "fifo", "dev_zero", "binary")
FIELD_MUTS = ("wrong_type", "nan", "inf", "negative", "unsorted", "huge", "missing_column")
DATA_MUTS = BYTE_MUTS + FIELD_MUTS


def _mutate_structure(obj, fmt: str, mut: str, rng: random.Random):
    """(description, mutated object) for a field-level mutation."""
    obj = copy.deepcopy(obj)
    rows = obj if isinstance(obj, list) else None
    if mut == "unsorted":
        if rows is not None:
            rows.reverse()
            return "rows reversed", obj
        lists = [p for p in _containers(obj) if isinstance(_get(obj, p), list)]
        if not lists:
            return "nothing to reorder", obj
        p = rng.choice(lists)
        _get(obj, p).reverse()
        return f"{'.'.join(map(str, p))} reversed", obj
    if mut == "missing_column":
        if rows is not None and rows and isinstance(rows[0], dict):
            col = rng.choice(sorted(rows[0]))
            for r in rows:
                r.pop(col, None)
            return f"column {col} removed", obj
        keys = [p for p in _containers(obj) if p and isinstance(_get(obj, p[:-1]), dict)]
        if not keys:
            return "nothing to remove", obj
        p = rng.choice(keys)
        del _get(obj, p[:-1])[p[-1]]
        return f"{'.'.join(map(str, p))} removed", obj
    paths = [p for p in _paths(obj) if p]
    if not paths:
        return "no fields", obj
    p = rng.choice(paths)
    num = {"json": lambda x: x, "yaml": lambda x: x, "csv": str}[fmt if fmt != "jsonl" else "json"]
    wrong = ["abc", [1, 2], {"a": 1}, True, None] if fmt != "csv" else ["abc", "[1]", "true", ""]
    value = {"wrong_type": lambda: rng.choice(wrong),
             "nan": lambda: num(float("nan")), "inf": lambda: num(rng.choice([float("inf"), float("-inf")])),
             "negative": lambda: num(rng.choice([-1, -1e9, -0.5])),
             "huge": lambda: HUGE["csv" if fmt == "csv" else "json"]}[mut]()
    _set(obj, p, value)
    return f"{'.'.join(map(str, p))} = {value!r}", obj


def _containers(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _containers(v, prefix + (k,))
    elif isinstance(obj, list):
        for j, v in enumerate(obj[:3]):
            yield from _containers(v, prefix + (j,))


def _get(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def _trace_scn(d: Path, f: Path) -> Path:
    p = d / "s.yaml"
    p.write_text(yaml_dump({"name": "attack", "model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
                            "workload": {"type": "trace", "path": str(f)}, "output": {"plots": False}}))
    return p


def _jsonl_head(src: Path, n: int) -> bytes:
    return "".join(src.read_text().splitlines(True)[:n]).encode()


def _kinds():
    """name -> (source files {name: bytes}, the file to mutate, its format, argv builder(d, target))."""
    acc_logs = "".join(json.dumps({"context_len": 64 * j, "k": 4, "accepted": j % 5, "drafter": "d", "verifier": "v"}) + "\n"
                       for j in range(400)).encode()
    cfg = (ROOT / "dsim" / "config" / "catalog" / "llama-3.1-8b-instruct.json").read_bytes()
    head = (ROOT / "dsim" / "data" / "heads" / "latency_head.yaml").read_bytes()

    def run(doc_fn):
        def argv(d, t):
            doc = doc_fn(t)
            p = d / "s.yaml"
            p.write_text(yaml_dump(doc))
            return _run_argv(p, d, doc)
        return argv

    def gamma_doc(t):
        doc = scenario("trained_gamma_head")
        doc["speculation"]["gamma"] = {"policy": "latency_head", "head": str(t)}
        return doc

    def lut_doc(t):
        doc = scenario("lut")
        doc["latency"]["path"] = str(t)
        return doc

    def cfg_doc(t):
        return {"name": "attack", "model": {"config": str(t)}, "hardware": "H100-SXM",
                "workload": {"type": "poisson", "rate": 10, "num_requests": SMALL, "prompt_tokens": 256,
                             "output_tokens": 32}}
    lss = {f"lss/{n}": (REAL / "RTX4090_Llama-3.1-8B" / n).read_bytes() for n in ("meta.json", "requests.jsonl")}
    ip_dir = REAL / "h100-llama-2-7b-tp1-general"
    ip = {f"ip/{p.relative_to(ip_dir)}": p.read_bytes() for p in sorted(ip_dir.rglob("*")) if p.is_file()}
    cosim = lambda sub: lambda d, t: ["cosim", str(d / sub), "--out", str(d / "out"), "--no-plots"]  # noqa: E731
    return {
        "trace_jsonl": ({"t.jsonl": _jsonl_head(SCN / "data" / "sample_trace.jsonl", 40)}, ["t.jsonl"], "jsonl",
                        lambda d, t: _run_argv(_trace_scn(d, t), d)),
        "trace_csv": ({"t.csv": (ROOT / "tests" / "fixtures" / "traces" / "burstgpt_sample.csv").read_bytes()},
                      ["t.csv"], "csv", lambda d, t: _run_argv(_trace_scn(d, t), d)),
        "bench_json": ({"b.json": (ROOT / "tests" / "fixtures" / "vllm_bench_detailed.json").read_bytes()}, ["b.json"],
                       "json", lambda d, t: ["cosim", str(t), "--hardware", "H100-SXM", "--out", str(d / "out"),
                                             "--no-plots"]),
        "meta_requests": (lss, ["lss/meta.json", "lss/requests.jsonl"], None, cosim("lss")),
        "inference_perf": (ip, [k for k in ip if k.endswith((".json", ".yaml"))], None, cosim("ip")),
        "lut_check": ({"l.csv": (ROOT / "luts" / "llama-2-7b_h100_tp1.csv").read_bytes()}, ["l.csv"], "csv",
                      lambda d, t: ["lut", "check", str(t)]),
        "lut_run": ({"l.csv": (ROOT / "luts" / "llama-2-7b_h100_tp1.csv").read_bytes()}, ["l.csv"], "csv", run(lut_doc)),
        "hf_config": ({"config.json": cfg}, ["config.json"], "json", run(cfg_doc)),
        "gamma_head": ({"head.yaml": head}, ["head.yaml"], "yaml", run(gamma_doc)),
        "acceptance_logs": ({"logs.jsonl": acc_logs}, ["logs.jsonl"], "jsonl",
                            lambda d, t: ["acceptance", "train", str(t), "--out", str(d / "out.joblib")]),
        "acceptance_bundle": ({"b.joblib": (ROOT / "acceptance" / "example_llama31_8b.joblib").read_bytes(),
                               "logs.jsonl": acc_logs[:4000].rsplit(b"\n", 1)[0] + b"\n"}, ["b.joblib"], "bytes",
                              lambda d, t: ["acceptance", "evaluate", str(t), str(d / "logs.jsonl"),
                                            "--json", str(d / "out.json")]),
    }


_KINDS: dict = {}


def _fmt_of(name: str) -> str:
    return {".jsonl": "jsonl", ".csv": "csv", ".json": "json", ".yaml": "yaml"}.get(Path(name).suffix, "bytes")


def data_case(seed: int, i: int) -> Case:
    if not _KINDS:
        _KINDS.update(_kinds())
    combos = [(k, m) for k in sorted(_KINDS) for m in DATA_MUTS]
    random.Random(f"data/{seed}").shuffle(combos)
    kind, mut = combos[i % len(combos)]
    rng = random.Random(f"data/{seed}/{i}")
    files, targets, fmt, argv = _KINDS[kind]
    target = rng.choice(targets)
    fmt = _fmt_of(target) if fmt is None else fmt
    if mut in FIELD_MUTS and fmt == "bytes":
        mut = rng.choice(BYTE_MUTS)
    src = files[target]
    what, data = mut, None
    if mut == "truncate":
        cut = rng.randrange(1, max(2, len(src)))
        what, data = f"truncated to {cut} of {len(src)} bytes", src[:cut]
    elif mut == "empty":
        data = b""
    elif mut == "binary":
        data = bytes(rng.randrange(256) for _ in range(rng.choice([1, 64, 4096])))
        what = f"{len(data)} random bytes"
    elif mut in FIELD_MUTS:
        what, obj = _mutate_structure(_read_rows(src.decode(), fmt), fmt, mut, rng)
        what = f"{mut}: {what}"
        data = _write_rows(obj, fmt)

    def build(d: Path):
        for name, b in files.items():
            q = d / name
            q.parent.mkdir(parents=True, exist_ok=True)
            if name != target:
                q.write_bytes(b)
        t = d / target
        if mut == "directory":
            t.mkdir()
        elif mut == "fifo":
            os.mkfifo(t)
        elif mut == "dev_zero":
            t.symlink_to("/dev/zero")
        else:
            t.write_bytes(data)
        return argv(d, t)
    ok = (0, 1, 2) if kind == "lut_check" else (0, 2)     # lut check: exit 1 = findings
    return Case("data", seed, i, f"[{kind}] {target}: {what}", build, ok_codes=ok)


# ---- 3. flag mutator ---------------------------------------------------------------------------------
SCALAR_VALUES = ("0", "-1", "1", "nan", "inf", "-inf", "1e308", str(10 ** 30), "abc", "")
LIST_VALUES = ("0", "-1", "nan", "inf", "1e308", str(10 ** 30), "abc", ",", "1,,2", "-1,2")


def _acc_logs(d: Path) -> Path:
    p = d / "logs.jsonl"
    p.write_text("".join(json.dumps({"context_len": 64 * j, "k": 4, "accepted": j % 5}) + "\n" for j in range(300)))
    return p


def _oracle_dir(d: Path) -> Path:
    """A tiny oracle folder for `specdec train-head` (written by the real command once per campaign)."""
    cache = Path(tempfile.gettempdir()) / f"dsim-attack-oracle-{os.getuid()}"
    if not (cache / "oracle.csv").exists():
        scn = _spec_scn(d)
        tmp = Path(tempfile.mkdtemp(prefix="dsim-attack-oracle-"))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            dsim_main(["specdec", "oracle", str(scn), "--out", str(tmp / "o"), "--gammas", "2,4"])
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(tmp / "o", cache)
        shutil.rmtree(tmp, ignore_errors=True)
    return cache


def _spec_scn(d: Path) -> Path:
    doc = scenario("mobile_cloud_distributed")
    doc["workload"]["num_requests"] = SMALL
    p = d / "spec.yaml"
    p.write_text(yaml_dump(doc))
    return p


QUICK = str(SCN / "quickstart.yaml")
N30 = ["--set", f"workload.num_requests={SMALL}"]
SLO = ["--slo", "ttft_p99_ms=500"]
BASES = {      # a working invocation of each subcommand; {o} = output path
    ("run",): lambda d: ["run", QUICK, "--quiet", "--no-plots", "--emit-vllm-traces", "--out", str(d / "o")] + N30,
    ("validate",): lambda d: ["validate", QUICK],
    ("bench",): lambda d: ["bench", "--requests", "200"],
    ("lut", "check"): lambda d: ["lut", "check", str(ROOT / "luts" / "llama-2-7b_h100_tp1.csv")],
    ("lut", "build"): lambda d: ["lut", "build", "--model", "meta-llama/Llama-2-7b-hf", "--hardware", "H100-SXM",
                                 "--contexts", "128,256", "--microbatches", "1,2", "--out", str(d / "o.csv")],
    ("cosim",): lambda d: ["cosim", str(REAL / "RTX4090_Llama-3.1-8B"), "--no-plots", "--out", str(d / "o")],
    ("fit",): lambda d: ["fit", str(REAL / "RTX4090_Llama-3.1-8B"), "--max-evals", "1", "--out", str(d / "o.yaml")],
    ("calibrate",): lambda d: ["calibrate", str(REAL / "RTX4090_Llama-3.1-8B"), "--max-evals", "1", "--no-loro",
                               "--out", str(d / "o")],
    ("acceptance", "train"): lambda d: ["acceptance", "train", str(_acc_logs(d)), "--out", str(d / "o.joblib")],
    ("acceptance", "evaluate"): lambda d: ["acceptance", "evaluate", str(ROOT / "acceptance" / "example_llama31_8b.joblib"),
                                           str(_acc_logs(d)), "--json", str(d / "o.json")],
    ("specdec", "oracle"): lambda d: ["specdec", "oracle", str(_spec_scn(d)), "--gammas", "2,4", "--out", str(d / "o")],
    ("specdec", "train-head"): lambda d: ["specdec", "train-head", str(_oracle_dir(d)), "--hidden", "0",
                                          "--out", str(d / "o.yaml")],
    ("sweep",): lambda d: ["sweep", QUICK, "--grid", "workload.rate=5,10", "--quiet", "--out", str(d / "o")] + N30,
    ("capacity",): lambda d: ["capacity", QUICK, "--no-band", "--out", str(d / "o")] + SLO + N30,
    ("examples",): lambda d: ["examples", str(d / "o")],
    ("schema",): lambda d: ["schema", "--markdown"],
    ("report",): lambda d: ["report", str(_run_dir(d))],
    ("plot",): lambda d: ["plot", str(_run_dir(d)), "--out", str(d / "o")],
    ("baseline",): lambda d: ["baseline", QUICK, "--seeds", "2", "--out", str(d / "o.json")] + N30,
    ("compare",): lambda d: ["compare", str(_run_dir(d)), str(_run_dir(d)), "--tolerance", "0.05"],
    ("trace", "generate"): lambda d: ["trace", "generate", QUICK, "--out", str(d / "o.jsonl")] + N30,
    ("profile",): lambda d: ["profile", QUICK, "--out", str(d / "o.json")],
    # no server on port 9: flags are checked, then the unreachable URL is refused (exit 2, nothing written)
    ("observe",): lambda d: ["observe", "http://127.0.0.1:9", "--scenario", QUICK, "--out", str(d / "o")] + N30,
    # a speculative scenario: flags are checked, then serve refuses it (exit 2) before binding a port, so
    # no mutated case leaves a server running
    ("serve",): lambda d: ["serve", str(_spec_scn(d)), "--port", "0"],
    ("plan",): lambda d: ["plan", QUICK, "--gpus", "2", "--space", str(SCN / "spaces" / "small.yaml"), "--no-band",
                          "--out", str(d / "o")] + SLO + N30,
}


def _run_dir(d: Path) -> Path:
    """A finished run's folder for `dsim report` to rebuild."""
    out = d / "run"
    if not out.exists():
        from dsim.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            main(["run", QUICK, "--quiet", "--out", str(out)] + N30)
    return out


def _is_number_list(text) -> bool:
    parts = str(text).split(",")
    try:
        [float(x) for x in parts]
        return True
    except ValueError:
        return False


def subcommands(parser=None, prefix=()):
    """(path, subparser) of every leaf subcommand of the dsim parser."""
    if parser is None:
        from dsim.cli import _parser
        parser = _parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, p in subs[0].choices.items():
        yield from subcommands(p, prefix + (name,))


def numeric_flags(parser) -> list:
    """(flag, 'scalar'|'list') of every option that takes a number or a comma-separated number list."""
    out = []
    for a in parser._actions:
        if not a.option_strings or a.nargs == 0 or a.choices:
            continue
        flag = max(a.option_strings, key=len)
        if a.type in (int, float):
            out.append((flag, "scalar"))
        elif (isinstance(a.default, str) and _is_number_list(a.default)) or "comma-separated" in (a.help or "") \
                and "=" not in (a.metavar or ""):
            out.append((flag, "list"))
    return out


def flag_space() -> list:
    """Every (subcommand path, flag, value) in a fixed order."""
    space = []
    for path, p in subcommands():
        for flag, kind in numeric_flags(p):
            for v in (SCALAR_VALUES if kind == "scalar" else LIST_VALUES):
                space.append((path, flag, v))
    return space


def _with_flag(argv: list, flag: str, value: str) -> list:
    """The base argv with ``flag`` set to ``value`` (replacing the base's own value)."""
    argv = list(argv)
    if flag in argv:
        j = argv.index(flag)
        del argv[j:j + 2]
    return argv + [f"{flag}={value}"]


def flag_case(seed: int, i: int) -> Case:
    space = flag_space()
    random.Random(f"flags/{seed}").shuffle(space)
    path, flag, value = space[i % len(space)]
    extra = []
    if i >= len(space):                        # past one sweep: a second flag of the same command too
        rng = random.Random(f"flags/{seed}/{i}")
        others = [(f, v) for (p, f, v) in space if p == path and f != flag]
        if others:
            extra = [rng.choice(others)]
    base = BASES.get(path, lambda d: list(path))

    def build(d: Path):
        argv = _with_flag(base(d), flag, value)
        for f, v in extra:
            argv = _with_flag(argv, f, v)
        return argv
    what = " ".join(path) + f" {flag}={value!r}" + "".join(f" {f}={v!r}" for f, v in extra)
    ok = (0, 1, 2) if path == ("lut", "check") else (0, 2)
    return Case("flags", seed, i, what, build, ok_codes=ok, names=None if extra else flag)


MUTATORS = {"structural": structural_case, "data": data_case, "flags": flag_case}


# ---- running a case and its oracle --------------------------------------------------------------------
WATCHED = [ROOT, SCN, SCN / "data", SCN / "spaces", ROOT / "luts", ROOT / "acceptance", REAL, ROOT / "tests" / "fixtures",
           ROOT / "dsim" / "data" / "heads", ROOT / "experiments", Path.home()]


def _snapshot() -> set:
    """Entries of the folders a case could wrongly write into (the repository's data folders, $HOME)."""
    out = set()
    for w in WATCHED + [p for p in REAL.iterdir() if p.is_dir()]:
        with contextlib.suppress(OSError):
            out |= {f"{w}/{n}" for n in os.listdir(w)}
    return out


def _listing(d: Path) -> set:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def execute(case: Case, tmp: Path, timeout: int = 20) -> Result:
    """Build the case under ``tmp``, run it in-process (cwd = its folder) and judge it."""
    d = tmp / f"{case.mutator}-{case.seed}-{case.index}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    argv = case.build(d)
    before, watched = _listing(d), _snapshot()
    err = io.StringIO()
    cwd = os.getcwd()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    rc, kind = None, "ok"
    t0 = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        os.chdir(d)
        resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT if hard == resource.RLIM_INFINITY else min(MEM_LIMIT, hard), hard))
        signal.alarm(timeout)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = dsim_main(argv)
    except _Timeout:
        kind = "hang"
    except MemoryError:
        kind = "memory"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        os.chdir(cwd)
    secs = time.perf_counter() - t0
    text = err.getvalue()
    lines = [x for x in text.strip().splitlines() if not x.startswith("dsim: warning:")]
    verdict = None
    if kind != "ok":
        verdict = f"{kind} after {secs:.1f} s"
    elif "MemoryError" in text:
        kind, verdict = "memory", f"exit {rc}: MemoryError"
    elif "internal error" in text or "Traceback" in text:
        kind, verdict = "internal", f"exit {rc}: internal error"
    elif rc not in case.ok_codes:
        kind, verdict = "other", f"exit {rc}"
    elif rc == 2 and (len(lines) != 1 or not lines[0].startswith("dsim: error:")):
        kind, verdict = "other", f"exit 2 with {len(lines)} stderr lines"
    elif rc == 2 and lines[0].startswith("dsim: error: an input"):    # cli's fallback: names no file
        kind, verdict = "other", "exit 2 without naming the file"
    elif rc == 2 and _listing(d) != before:
        kind, verdict = "other", f"exit 2 left {sorted(_listing(d) - before)[:3]}"
    if verdict is None and rc == 2 and case.names and case.names not in lines[0]:
        kind = "unnamed"     # not a failure: the flag became a scenario key (bench --rate -> workload.rate)
    new = _snapshot() - watched
    if new:
        kind, verdict = "other", f"wrote outside its folder: {sorted(new)[:3]}"
    return Result(case, rc, verdict, (lines[-1] if lines else "")[:300], secs, kind)


def campaign(mutator: str, n: int, seed: int = 0, only=None, timeout: int = 20, report=print, keep=False,
             verbose=False) -> list:
    """Run cases 0..n-1 (or ``only``) of one mutator; returns every Result."""
    tmp = Path(tempfile.mkdtemp(prefix=f"dsim-attack-{mutator}-"))
    results = []
    try:
        for i in ([only] if only is not None else range(n)):
            case = MUTATORS[mutator](seed, i)
            r = execute(case, tmp, timeout)
            results.append(r)
            if r.verdict:
                report(f"FAIL {case.describe()}: {r.verdict}: {r.err}  [{case.reproduce()}]")
            elif only is not None or verbose:
                report(f"ok {case.describe()}: exit {r.rc} in {r.seconds:.1f} s: {r.err}")
            if not keep:
                shutil.rmtree(tmp / f"{mutator}-{seed}-{i}", ignore_errors=True)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return results


def summary(mutator: str, results: list) -> str:
    codes = {}
    for r in results:
        codes[r.rc] = codes.get(r.rc, 0) + 1
    k = {k: sum(r.kind == k for r in results) for k in ("hang", "memory", "internal", "other", "unnamed")}
    return (f"{mutator}: {len(results)} cases, exit codes {dict(sorted(codes.items(), key=str))}, hangs {k['hang']}, "
            f"memory {k['memory']}, internal errors {k['internal']}, other failures {k['other']}, "
            + (f"{k['unnamed']} exit-2 messages name a scenario key, not the flag, " if k["unnamed"] else "")
            + f"{sum(r.seconds for r in results):.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mutator", nargs="?", choices=sorted(MUTATORS), default=None, help="default: all three")
    ap.add_argument("--n", type=int, default=100, help="cases per mutator (default 100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=int, default=None, help="run just this case index (reproduce a failure)")
    ap.add_argument("--timeout", type=int, default=20, help="alarm per case, seconds")
    ap.add_argument("--keep", action="store_true", help="keep the case folders")
    ap.add_argument("--verbose", action="store_true", help="one line per case, passing ones too")
    a = ap.parse_args(argv)
    bad = 0
    for m in [a.mutator] if a.mutator else sorted(MUTATORS):
        res = campaign(m, a.n, a.seed, a.only, a.timeout, report=lambda line: print(line, flush=True), keep=a.keep,
                       verbose=a.verbose)
        bad += sum(r.verdict is not None for r in res)
        print(summary(m, res), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
