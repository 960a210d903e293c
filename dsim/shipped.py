"""The example scenarios and the small files they read, for users of a wheel: ``dsim examples DIR``
copies them out, ``dsim run quickstart`` finds one by name.

A wheel carries them under ``dsim/_examples/`` (setup.py's build step copies the repository's
folders in); a checkout or an editable install reads the repository's own folders.  Both have the
same layout, so ``lut.yaml``'s ``../luts/`` and the README's commands work from the copied folder.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from .config.errors import ConfigError

SHIPPED = ("scenarios", "luts", "examples/real")      # kept in step with setup.py
DEFAULT_DIR = "dsim-examples"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def root() -> Path | None:
    """The folder that holds scenarios/, luts/ and examples/real/, or None (a broken install)."""
    pkg = Path(__file__).resolve().parent
    for cand in (pkg / "_examples", pkg.parent):
        if (cand / "scenarios").is_dir() and (cand / "luts").is_dir():
            return cand
    return None


def names() -> list[str]:
    base = root()
    return sorted(p.stem for p in (base / "scenarios").glob("*.yaml")) if base else []


def resolve(arg: str, flag: str = "scenario") -> str:
    """``arg`` itself when it is a file (or looks like a path); a shipped scenario's path when it is
    a bare name such as ``quickstart``; otherwise an error listing the shipped names."""
    if Path(arg).exists() or not _NAME.fullmatch(arg) or arg.endswith((".yaml", ".yml", ".json")):
        return arg
    have = names()
    if arg in have:
        return str(root() / "scenarios" / f"{arg}.yaml")
    raise ConfigError(flag, arg, "a scenario file, or the name of a shipped scenario: " + ", ".join(have)
                      + " (dsim examples DIR copies them out)")


def copy_examples(dest) -> list[str]:
    """Copy the shipped folders into ``dest`` (created; refused when it exists and is not empty);
    return the copied scenario names."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError("DIR", str(dest), "a new or empty folder (dsim examples never overwrites files)")
    base = root()
    if base is None:
        raise ConfigError("dsim examples", None, "an installation that ships the examples (this one has no "
                          "dsim/_examples: reinstall dsim)", show_value=False)
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for rel in SHIPPED:
            shutil.copytree(base / rel, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    except OSError as e:
        raise ConfigError("DIR", str(dest), f"a writable folder ({e.strerror or e})") from None
    return names()
