"""Dual-SSD mirrors: plan, stage, verify (MIRROR-SPEC)."""
