"""Speculative decoding: acceptance models (draft devices, verification, modes and gamma policies to come)."""
