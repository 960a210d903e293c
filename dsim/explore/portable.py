"""Points that travel as data: a scenario with its ``--set`` applied and the bytes of every file it
reads, so a Dask or Ray worker needs only ``pip install dsim``.

Why: a point shipped as a path (``scenarios/trace.yaml``) was opened in the worker's own working
directory, so on a real cluster (another folder, another machine) every point failed.  The driver
packs each point; a worker unpacks it once per content into its temporary folder (inputs only:
results come back as data and only the driver writes the output folder).

A file's bytes travel once, not once per point: on a cluster the driver puts each distinct file
in the engine's own object store (``share``: Dask's scatter, Ray's ``ray.put``) and the points
carry only references, which a worker resolves when its folder lacks the file."""
from __future__ import annotations

import copy
import functools
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from ..config.errors import ConfigError

MARK = "dsim_portable_scenario"
# scenario keys whose string value names a file, relative to the scenario's folder (trace, length
# and LUT paths, HF config.json, coefficient files, acceptance curves and bundles, a gamma head)
FILE_KEYS = frozenset({"path", "config", "coefficients", "curve", "curves", "bundle", "head"})


def is_packed(source) -> bool:
    return isinstance(source, dict) and source.get(MARK) == 1


@functools.lru_cache(maxsize=64)
def _read(path: str, mtime_ns: int, size: int) -> tuple[str, bytes]:
    """(content name, bytes) of a file, read once per version: every point of a sweep that names the
    same trace shares one copy in the driver's memory."""
    blob = Path(path).read_bytes()
    return hashlib.sha256(blob).hexdigest()[:20], blob


def pack(source, overrides) -> dict:
    """The point's scenario (a path or a mapping, with ``overrides`` applied) and the files it names."""
    from ..config.scenario import apply_overrides, read_scenario_file
    if isinstance(source, dict):
        data, base = copy.deepcopy(source), None
    else:
        data, base = read_scenario_file(source), Path(source).resolve().parent
        data.setdefault("name", Path(source).stem)
    data = apply_overrides(data, list(overrides))
    files: dict = {}

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in FILE_KEYS and isinstance(v, str):
                    given = Path(v).expanduser()
                    p = given if given.is_absolute() or base is None else base / given
                    if p.is_file():
                        st = p.stat()
                        digest, blob = _read(str(p.resolve()), st.st_mtime_ns, st.st_size)
                        name = digest + "".join(Path(v).suffixes[-2:])
                        files[name] = blob
                        node[k] = name
                        continue
                    if base is not None and not given.is_absolute() and Path(v).suffix:
                        node[k] = str(p)          # missing here too: the worker names the driver's path
                        continue
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(data)
    return {MARK: 1, "scenario": data, "files": files}


def unpack(pkg: dict) -> tuple[dict, Path]:
    """(scenario mapping, folder holding its files): written once per content in this machine's
    temporary folder, atomically, so workers sharing a machine share one copy."""
    key = hashlib.sha256("\n".join(sorted(pkg["files"])).encode()).hexdigest()[:20]
    # one folder per user (a shared /tmp: another user's folders are not ours to write)
    folder = Path(tempfile.gettempdir()) / f"dsim-shipped-{_user()}" / key
    try:
        if not (folder.is_dir() and all((folder / n).is_file() for n in pkg["files"])):
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=folder.parent))
            for name, blob in pkg["files"].items():
                (tmp / name).write_bytes(blob.fetch() if isinstance(blob, Shared) else blob)
            if folder.is_dir():                      # files went missing (a temp cleaner): replace it
                shutil.rmtree(folder, ignore_errors=True)
            try:
                os.replace(tmp, folder)
            except OSError:                          # another worker put the same files there first
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        raise ConfigError(str(folder), None, f"a writable temporary folder on the worker for the point's "
                          f"files ({e.strerror or e})", show_value=False) from None
    return copy.deepcopy(pkg["scenario"]), folder


def _user() -> str:
    try:
        return str(os.getuid())
    except AttributeError:                           # no uid on this platform
        return "user"


def ship(call: tuple) -> tuple:
    """A call ``(source, overrides, *rest)`` of an exploration, with its scenario packed."""
    source, overrides, *rest = call
    if is_packed(source):
        return call
    return (pack(source, overrides), [], *rest)


FETCH_TIMEOUT_S = 60.0


class Shared:
    """A file's bytes held in a cluster engine's object store: what a shared point carries instead
    of the bytes.  Dask: ``ref`` is the driver's Future of the scatter (it keeps the data in the
    cluster) and only ``key``, (the data's key, the dataset it is published as), travels; Ray:
    ``ref`` is an ObjectRef, which travels as itself."""
    __slots__ = ("engine", "ref", "key")

    def __init__(self, engine: str, ref, key=None):
        self.engine, self.ref, self.key = engine, ref, key

    def __getstate__(self):
        return (self.engine, None, self.key) if self.engine == "dask" else (self.engine, self.ref, None)

    def __setstate__(self, state):
        self.engine, self.ref, self.key = state

    def fetch(self) -> bytes:
        if self.engine == "ray":
            import ray
            return ray.get(self.ref)
        from distributed import get_worker, worker_client
        data_key, name = self.key
        data = get_worker().data
        if data_key in data:                          # the broadcast copy is still here
            return data[data_key]
        # the active memory manager dropped this worker's copy, or the worker joined later: fetch
        # it by its dataset name, never waiting forever on the cluster
        with worker_client() as client:
            try:
                return client.get_dataset(name, default=None).result(timeout=FETCH_TIMEOUT_S)
            except (TimeoutError, AttributeError):
                from ..config.errors import ConfigError
                raise ConfigError("--backend dask", self.key, f"the cluster to deliver a scenario file within "
                                  f"{FETCH_TIMEOUT_S:g} s (this worker joined after the sweep started?)",
                                  show_value=False) from None


def share(calls: list, engine: str, put) -> list:
    """``calls`` with each packed point's file bytes replaced by a ``Shared`` reference; ``put(bytes)``
    (the engine's store) is called once per distinct file, however many points name it."""
    refs: dict = {}
    out = []
    for call in calls:
        pkg = call[0]
        if is_packed(pkg) and pkg["files"]:
            files = {}
            for name, blob in pkg["files"].items():
                if isinstance(blob, bytes):
                    if name not in refs:
                        ref = put(blob)
                        if isinstance(ref, tuple):    # Dask: (the scatter's Future, its dataset name)
                            ref = Shared(engine, ref[0], (ref[0].key, ref[1]))
                        else:
                            ref = Shared(engine, ref, getattr(ref, "key", None))
                        refs[name] = ref
                    blob = refs[name]
                files[name] = blob
            call = ({**pkg, "files": files}, *call[1:])
        out.append(call)
    return out
