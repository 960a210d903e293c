"""Real-time front ends: ``dsim observe``, a load generator that captures a live OpenAI-compatible
server's timings in the folder ``dsim cosim`` and ``dsim calibrate`` read."""
