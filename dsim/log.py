"""dsim's diagnostics through stdlib ``logging`` (results stay on stdout; everything else goes to stderr).

One logger, ``dsim``, its children per module (``logging.getLogger(__name__)``).  The command line
sets its level from ``-v``/``-q``/``--log-level``; library users configure logging as they like
(nothing is configured on import).  ``quiet()`` tells the cluster backends to keep Ray and Dask to
errors too, since their own loggers print INFO and WARNING lines of no use to a dsim user.
"""
from __future__ import annotations

import logging
import sys

LEVELS = ("debug", "info", "warning", "error", "critical")
THIRD_PARTY = ("ray", "distributed", "dask", "bokeh", "tornado", "asyncio")
_state = {"configured": False, "level": logging.INFO}


class _Format(logging.Formatter):
    """``dsim: warning: ...`` like the one-line errors; INFO lines plain, as progress was before."""

    def format(self, record):
        msg = record.getMessage()
        if record.levelno == logging.INFO:
            return msg
        return f"dsim: {record.levelname.lower()}: {msg}"


def level_of(verbose: int = 0, quiet: int = 0, name: str | None = None) -> int:
    """INFO by default (progress of long commands); -v DEBUG; -q WARNING; -qq ERROR; --log-level wins."""
    if name:
        return getattr(logging, name.upper())
    return max(logging.DEBUG, min(logging.ERROR, logging.INFO + 10 * (quiet - verbose)))


def configure(level: int) -> None:
    """A stderr handler on the ``dsim`` logger and on ``py.warnings`` (Python warnings, ours and
    libraries', through logging); third-party loggers at WARNING, or ERROR once dsim is quieter
    than INFO.  Called again (tests, several main() calls), it only updates the levels."""
    log = logging.getLogger("dsim")
    warn = logging.getLogger("py.warnings")
    if not _state["configured"]:
        h = logging.StreamHandler(_Stderr())
        h.setFormatter(_Format())
        for lg in (log, warn):
            lg.addHandler(h)
            lg.propagate = False
        logging.captureWarnings(True)
        _state["configured"] = True
    _state["level"] = level
    log.setLevel(level)
    warn.setLevel(max(level, logging.WARNING))
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(third_party_level())


def third_party_level() -> int:
    """What Ray and Dask may print: warnings normally, only errors under --quiet."""
    return logging.ERROR if _state["level"] > logging.INFO else logging.WARNING


def quiet() -> bool:
    """True when the command line asked for less than INFO (no progress bars, no chatter)."""
    return _state["level"] > logging.INFO


class _Stderr:
    """sys.stderr looked up at each write, so pytest's capture (and a redirected stderr) sees it."""

    def write(self, s):
        return sys.stderr.write(s)

    def flush(self):
        sys.stderr.flush()
