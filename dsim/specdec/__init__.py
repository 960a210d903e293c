"""Speculative decoding: draft devices and links, verification on targets, distributed / fused /
hybrid modes, acceptance models (curves, trained bundles, EAGLE-style trees), gamma (speculation
length) policies and the trained latency head, drafter portfolios.  The speculation section of
summary.json is computed in dsim.metrics.speculation."""
