"""Checks: container verification, oracle runs, conformance (``colitools.verify``)."""
