"""Dual-SSD mirrors: plan, stage, verify (docs/CLI.md "mirror")."""
