"""The declared scenario schema: one typed section model per concern, aggregated in ScenarioConfig.

Imported only when a scenario is loaded (pydantic costs about 0.1 s to import; ``import dsim`` does
not pay it)."""
