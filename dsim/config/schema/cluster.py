"""The ``cluster``: section of a scenario (declared schema; see dsim.config.schema.base for the rules)."""
from __future__ import annotations

from .base import Raw

# placeholder until the section is declared field by field: the builder still validates it
ClusterField = Raw({"type": "object"})
