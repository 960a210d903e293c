"""The ``model``: section of a scenario (declared schema; see dsim.config.schema.base for the rules).

A model is a catalogue name (``meta-llama/Llama-3.1-8B``, a file stem of dsim/config/catalog/, case
insensitive) or a mapping naming a HuggingFace config.json.  What the model *is* (layers, heads,
experts, dtype, ``quantization_config``) comes from that config.json, read and checked by
dsim.config.model (errors name the file and its key); the scenario declares only where to find it.
"""
from __future__ import annotations

from .base import Section, Str
from .named import NameOr


class ModelSection(Section):
    """A model given by its HuggingFace config.json (architecture, torch_dtype, quantization_config)."""
    config: Str
    """Path to the model's HuggingFace config.json (relative paths from the scenario's folder)."""
    name: Str | None = None
    """Name shown in reports (None: the name of the folder that holds config.json)."""


ModelField = NameOr(ModelSection, "a catalogue model name or {config: path/to/config.json}",
                    "A catalogue model: a HuggingFace id (meta-llama/Llama-3.1-8B) or a file stem of "
                    "dsim/config/catalog/, case-insensitive") | None
