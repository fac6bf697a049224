"""The conversion pipeline: sources, dequantizers, recipes, planner, ledger, runner (``colitools.converters``)."""
