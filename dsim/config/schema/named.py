"""A value that is either the name of a shipped entry or a mapping that declares one.

``model: meta-llama/Llama-3.1-8B`` or ``model: {config: path/to/config.json}``; ``hardware: H100-SXM``
or ``hardware: {peak_tflops_bf16: ..., ...}``.  The string is looked up by the section's builder (a
catalogue or profile lookup is I/O, kept out of the schema); the mapping is validated here.  The
choice is made by the value's type, so a bad mapping is reported by its own keys, and a value that is
neither gets the section's own message instead of one message per alternative."""
from __future__ import annotations

from typing import Annotated, Any, Union


from ..errors import ConfigError
from .base import BeforeValidator, Discriminator, Section, Tag, check_str, checked

# tags of the two alternatives: never a YAML key, so parse() does not mistake them for the user's path
_NAME, _MAPPING = "<name>", "<mapping>"


def NameOr(section: type, expected: str, names: str):
    """A string (a name the builder resolves, described by ``names`` in the JSON Schema) or a
    ``section`` mapping; anything else is refused with ``expected`` (e.g. "a device profile name or
    a mapping")."""
    def pick(v: Any) -> str:
        return _MAPPING if isinstance(v, (dict, Section)) else _NAME

    def check(v: Any) -> Any:
        if isinstance(v, (str, dict, section)):
            return v
        raise ConfigError("", v, expected)
    name = checked(str, check_str, {"type": "string", "description": names})
    union = Union[Annotated[name, Tag(_NAME)], Annotated[section, Tag(_MAPPING)]]
    return Annotated[union, Discriminator(pick), BeforeValidator(check)]
