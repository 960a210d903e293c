"""Reading user files: UTF-8 text of a bounded size, JSON without recursion blow-ups; every failure
is a ConfigError naming the file (binary junk, Latin-1, 100k-deep nesting, 5,000-digit numbers)."""
from __future__ import annotations

import contextlib
import contextvars
import csv
import functools
import json
import re
import stat
import sys
from pathlib import Path

from .errors import ConfigError
from .limits import MAX_FILE_BYTES, MAX_YAML_VALUES


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


_READS: contextvars.ContextVar = contextvars.ContextVar("dsim_data_files_read", default=None)


def note_read(path) -> None:
    """Tell the scenario or run being built (``recording_reads``) that it read this data file; a
    reader with a cache calls it on a cache hit too, so the manifest lists what the run used."""
    reads = _READS.get()
    if reads is not None:
        reads.add(str(Path(path).resolve()))


@contextlib.contextmanager
def recording_reads():
    """Collect the resolved paths of the files read inside the block (``note_read``), for the
    manifest's content hashes; a recording inside another also counts for the outer one."""
    outer = _READS.get()
    mine: set = set()
    token = _READS.set(mine)
    try:
        yield mine
    finally:
        _READS.reset(token)
        if outer is not None:
            outer |= mine


def read_text(path, shown: str | None = None, limit: int = MAX_FILE_BYTES, what: str = "a file") -> str:
    """The file's UTF-8 text; more than ``limit`` bytes is refused before anything is read or parsed."""
    p = Path(path)
    note_read(p)
    shown = shown or str(p)
    too_big = f"{what} under {_size(limit)}"
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):      # /dev/zero, a FIFO, a folder: no size to trust, maybe no end
            raise ConfigError(shown, None, "a regular file (this is a "
                              + ("folder" if stat.S_ISDIR(st.st_mode) else "device, pipe or socket") + ")",
                              show_value=False)
        if st.st_size > limit:
            raise ConfigError(shown, None, f"{too_big} (it has {st.st_size:,} bytes)", show_value=False)
        with p.open("rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ConfigError(shown, None, too_big, show_value=False)
    except OSError as e:
        raise ConfigError(shown, None, f"a readable file ({e.strerror})", show_value=False) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(shown, None, f"UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start} is not)",
                          show_value=False) from None


def parse_json(text: str, shown: str, unique_keys: bool = False):
    """json.loads with the failures of hostile input as ConfigErrors; ``unique_keys`` refuses a key
    repeated in one object (json keeps the last one silently)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs(shown) if unique_keys else None)
    except ConfigError:
        raise
    except json.JSONDecodeError as e:
        raise ConfigError(f"{shown}:{e.lineno}", None, f"valid JSON ({e.msg})", show_value=False) from None
    except RecursionError:
        raise ConfigError(shown, None, "JSON nested less than ~1,000 levels deep", show_value=False) from None
    except ValueError as e:                       # e.g. integers of more than 4,300 digits
        raise ConfigError(shown, None, f"valid JSON ({str(e).split(';')[0]})", show_value=False) from None


def _unique_pairs(shown: str):
    def hook(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise ConfigError(f"{shown}: {k}", None, "each key once in a mapping (it is repeated; the "
                                  "second would silently replace the first)", show_value=False)
            out[k] = v
        return out
    return hook


# YAML 1.2 floats: PyYAML follows YAML 1.1, where an exponent without a dot ("1e9", "-1e-9") is a
# string, so `rate: 1e9` was refused as "expected a number"; scenarios, --set and grids read them as
# numbers (an integer without dot or exponent stays an integer)
_FLOAT_12 = re.compile(r"^[-+]?(?:(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)$")


def _safe_loader():
    import yaml
    return yaml.SafeLoader


def read_yaml(text: str, *, shipped: bool = False):
    """yaml.safe_load of a data file (YAML 1.1, as PyYAML reads it).

    ``shipped``: a file of dsim's own package data (device profiles, engine generations, GEMM fits),
    read on every run: libyaml's C parser reads it about ten times faster.  Never for a user's file:
    the C parser recurses on nesting and a deeply nested file crashes the process (the Python parser
    stops with a RecursionError, which the readers report)."""
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader) if shipped else yaml.SafeLoader
    return yaml.load(text, Loader=loader)   # noqa: S506 - a safe loader


@functools.lru_cache(maxsize=1)
def _base_loader():
    class Loader(_safe_loader()):
        pass
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))
    return Loader


def load_value(text: str):
    """One value written on a command line (``--set k=1e9``, a grid's ``1e-3``): YAML with 1.2 floats;
    text that is not YAML stays text."""
    import yaml
    if not text.strip():
        return ""
    try:
        return yaml.load(text, Loader=_base_loader())   # noqa: S506 - a safe loader's subclass
    except yaml.YAMLError:
        return text


def load_yaml(text: str, shown: str):
    """yaml.safe_load that refuses a key repeated in one mapping (PyYAML keeps the last one silently,
    so a scenario with two `rate:` lines runs with whichever came second) and reads YAML 1.2 floats."""
    import yaml

    class Loader(_base_loader()):
        pass

    def mapping(loader, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:           # an unhashable key: the base constructor reports it
                break
            if first is not None:
                raise ConfigError(f"{shown}:{key_node.start_mark.line + 1}", None,
                                  f"each key once in a mapping ({key!r} is repeated; first at line {first}; "
                                  "the second would silently replace the first)", show_value=False)
            seen[key] = key_node.start_mark.line + 1
        return loader.construct_mapping(node, deep=deep)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    doc = yaml.load(text, Loader=Loader)   # noqa: S506 - a safe loader's subclass
    check_expansion(doc, shown)
    return doc


def check_expansion(doc, shown: str, cap: int = MAX_YAML_VALUES) -> None:
    """Refuse a document whose aliases expand it past ``cap`` values or into itself: a few hundred
    bytes of nested ``*alias`` lists ("billion laughs") load as a small shared graph, but the first
    str(), copy or walk of it expands 9^10 values and never returns.  Counts each shared node once."""
    size: dict = {}
    seen: set = set()
    stack = [(doc, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        kids = list(node.values()) if isinstance(node, dict) else node
        if done:
            n = 1 + (len(node) if isinstance(node, dict) else 0) + sum(size.get(id(c), 1) for c in kids)
            if n > cap:
                raise ConfigError(shown, None, f"at most {cap:.0e} values once its YAML aliases are expanded "
                                  "(*alias lists nested in each other multiply)", show_value=False)
            size[id(node)] = n
            continue
        if id(node) in seen:
            if id(node) not in size:
                raise ConfigError(shown, None, "YAML without a value that contains itself (an &anchor "
                                  "used inside its own value)", show_value=False)
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in kids if isinstance(c, (dict, list)))


def input_error(e: BaseException) -> str | None:
    """A one-line message for the content errors a reader did not attribute to its file."""
    if isinstance(e, UnicodeDecodeError):
        return f"an input file is not UTF-8 text (byte at offset {e.start})"
    if isinstance(e, RecursionError):
        return "an input file is nested too deeply"
    if isinstance(e, csv.Error):
        return f"an input CSV file is malformed ({e})"
    if isinstance(e, ValueError) and "integer string conversion" in str(e):
        return f"an input file holds an integer of more than {sys.get_int_max_str_digits()} digits"
    return None


def package_folder(package: str) -> Path:
    """The folder of a data package dsim ships, read through importlib.resources, never from a path
    outside the package: ``dsim.device_profiles`` is the repository's top-level device_profiles/,
    which setup.py maps into the package (a wheel carries it inside dsim/, an editable install's
    import hook points at the checkout's folder)."""
    from importlib import resources
    try:
        return Path(str(resources.files(package)))
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"{package} is not installed: dsim was imported from a folder that is not installed, or from an "
            f"editable install made before setup.py mapped that folder in; run `pip install -e .` in the "
            f"checkout (or install the wheel)", name=package) from None
