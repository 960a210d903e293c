"""The declared scenario schema: one typed section model per concern, aggregated in ScenarioConfig.

Imported only when a scenario is loaded (``import dsim`` does not pay for it)."""
