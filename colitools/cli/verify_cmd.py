"""`colitools verify` command (not implemented yet)."""
