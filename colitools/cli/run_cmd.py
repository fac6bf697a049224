"""`colitools run` command (not implemented yet)."""
