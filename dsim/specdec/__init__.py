"""Speculative decoding: draft devices and links, verification on targets, distributed / fused /
hybrid modes, acceptance models, gamma (speculation length) policies, drafter portfolios and the
per-request speculation report."""
