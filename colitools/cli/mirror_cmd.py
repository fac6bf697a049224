"""`colitools mirror` command (not implemented yet)."""
