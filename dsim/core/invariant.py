"""Invariant checks that stay on under ``python -O`` (plain ``assert`` statements are stripped,
which would silently disable ``--check-invariants`` and the end-of-run checks)."""


class InvariantError(AssertionError):
    """The simulation broke one of its own invariants (a bug in dsim, never a user error)."""


def check(cond, msg: str = "") -> None:
    if not cond:
        raise InvariantError(msg)
