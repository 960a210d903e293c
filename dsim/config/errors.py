"""The one error type for user mistakes: it names where, what was given, what was expected."""


class ConfigError(ValueError):
    """A user input (scenario key, data file row, CLI flag) is invalid.

    The CLI prints ``str(err)`` on one line and exits with code 2.
    """

    def __init__(self, path: str, value=None, expected: str = "", *, show_value: bool = True):
        self.path = path
        self.value = value
        self.expected = expected
        self.show_value = show_value
        msg = f"{path}: "
        if show_value:
            msg += f"got {value!r}"
            if expected:
                msg += f", expected {expected}"
        else:
            msg += expected
        super().__init__(msg.replace("\n", " "))


class MissingAssetError(ConfigError):
    """A latency model has no data for this configuration (no VIDUR profile for the GPU, model or
    TP degree; no LUT file or rows for the pool).  Alone it is a ConfigError like any other; in a
    ``latency.fallback`` chain (dsim.latency.registry) it sends the pool to the next tier."""
