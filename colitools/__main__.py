"""Entry point for ``python -m colitools``."""
from colitools.cli import main

main()
