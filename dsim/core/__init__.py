"""The event engine: Simulation (owns the simpy.Environment and the clock checks), PartitionedRNG
(one random stream per named subsystem), Request and its lifecycle timestamps, invariant checks and
spilled column segments.  It knows nothing of LLMs."""
