"""The bytes: safetensors container I/O, the format registry and codecs, and the byte-arithmetic resolver.

Installed as ``colitools.formats``. Imports nothing else of colitools.
"""
