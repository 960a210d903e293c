"""Reading user files: UTF-8 text of a bounded size, JSON without recursion blow-ups; every failure
is a ConfigError naming the file (binary junk, Latin-1, 100k-deep nesting, 5,000-digit numbers)."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from .errors import ConfigError
from .limits import MAX_FILE_BYTES


def read_text(path, shown: str | None = None) -> str:
    p = Path(path)
    shown = shown or str(p)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(shown, None, f"a file under {MAX_FILE_BYTES >> 30} GiB", show_value=False)
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(shown, None, f"a readable file ({e.strerror})", show_value=False) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(shown, None, f"UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start} is not)",
                          show_value=False) from None


def parse_json(text: str, shown: str):
    """json.loads with the failures of hostile input as ConfigErrors."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{shown}:{e.lineno}", None, f"valid JSON ({e.msg})", show_value=False) from None
    except RecursionError:
        raise ConfigError(shown, None, "JSON nested less than ~1,000 levels deep", show_value=False) from None
    except ValueError as e:                       # e.g. integers of more than 4,300 digits
        raise ConfigError(shown, None, f"valid JSON ({str(e).split(';')[0]})", show_value=False) from None


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
