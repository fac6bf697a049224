"""`colitools inspect` command (not implemented yet)."""
