"""`colitools usage` command (not implemented yet)."""
