"""`colitools formats` command (not implemented yet)."""
