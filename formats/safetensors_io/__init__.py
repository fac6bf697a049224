"""safetensors container I/O: a strict reader and a streaming, crash-safe writer (docs/FORMATS.md §1).

* ``reader.py``: ``SafetensorsFile`` validates the whole header before touching tensor data and reports every
  problem as one ``SafetensorsError`` line naming the file, the tensor and the numbers at fault. Tensor data
  is fetched with positional reads of exactly its byte range (never a whole-file load or mmap); ``read_many``
  fetches adjacent tensors with one read.
* ``writer.py``: ``SafetensorsWriter`` computes the header up front from ``(name, dtype, shape)`` entries, so
  that a planner knows every output size before any data exists, then streams tensors one at a time into a
  temporary file in the target directory and publishes it with an atomic rename. A file that was not
  completely written never appears under its final name.
* ``header.py``: what both share (limits, alignment, the length field, ``TensorInfo``, tensor byte counts).

Byte order: safetensors data is little-endian; arrays are read and written as little-endian.
"""

from colitools.formats.safetensors_io.header import ALIGNMENT, MAX_HEADER_BYTES, TensorInfo
from colitools.formats.safetensors_io.reader import SafetensorsFile, coalesce_ranges, read_header
from colitools.formats.safetensors_io.writer import Entry, SafetensorsWriter, write_safetensors

__all__ = [
    "ALIGNMENT",
    "MAX_HEADER_BYTES",
    "Entry",
    "SafetensorsFile",
    "SafetensorsWriter",
    "TensorInfo",
    "coalesce_ranges",
    "read_header",
    "write_safetensors",
]
