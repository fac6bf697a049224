"""Minimal numpy reference runtime for converted containers."""
