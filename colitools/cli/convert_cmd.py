"""`colitools convert` command (not implemented yet)."""
