"""Dual-SSD mirrors: plan, stage, verify (README "Mirrors")."""
