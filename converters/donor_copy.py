"""The bytes of ``convert --replace`` (converters/reuse.py decides what is copied): a donor file read once, front
to back, hashed as it goes (``DonorStream``); a new file's copied tensors put into its writer's sink from it
(``Copying``, used by converters/unit_writer.py); a new file that is its donor byte for byte kept in place
(``KeptFile``). Whatever the donor file holds is checked against its recorded sha256 before anything made from
it is published: _DonorChanged otherwise, and the unit is converted without it."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from colitools.converters.planner import OutputFile, OutputGroup, TensorJob
from colitools.formats.dtypes import numpy_dtype
from colitools.formats.error_stats import ErrorStats
from colitools.formats.errors import ConvertError, SafetensorsError
from colitools.formats.safetensors_io import read_header


class _DonorChanged(ConvertError):
    """A donor file is not the bytes its record says (replaced, cut, edited): the unit is converted without it."""


@dataclass(frozen=True)
class FileCopy:
    """What one new file copies from one donor file (sent to a ``--workers`` process): the donor file (name,
    size, sha256), the jobs copied (output names) and their recorded error figures."""

    donor: str
    size: int
    sha256: str
    jobs: frozenset[str]
    errors: dict[str, list] = field(default_factory=dict)
    keep: bool = False  # the donor file is the new file, byte for byte: kept in place, only its sha256 checked


class DonorStream:
    """A donor file read once, front to back, hashed as it goes: ``take`` returns an entry's bytes (a later one
    than the last taken), ``verify`` reads the rest and raises _DonorChanged unless the file is its record's."""

    CHUNK = 8 << 20

    def __init__(self, outdir: Path, copy: FileCopy):
        self.copy = copy
        self.path = outdir / copy.donor
        try:
            self.tensors = read_header(self.path).tensors
            self._f = open(self.path, "rb", buffering=0)  # noqa: SIM115 - closed by ``close``
        except (OSError, SafetensorsError) as exc:
            raise _DonorChanged(f"{self.path}: donor file unreadable ({exc})") from None
        self._digest = hashlib.sha256()
        self._pos = 0

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self._f.readinto(view[got:])
            if not k:
                raise _DonorChanged(f"{self.path}: donor file shorter than recorded")
            got += k
        self._digest.update(buf)
        self._pos += n
        return buf

    def _skip_to(self, pos: int) -> None:
        while self._pos < pos:
            self._read(min(self.CHUNK, pos - self._pos))

    def _info(self, name: str, dtype: str, shape: tuple[int, ...]):
        info = self.tensors.get(name)
        if info is None or info.dtype != dtype or tuple(info.shape) != tuple(shape) or info.begin < self._pos:
            raise _DonorChanged(f"{self.path}: donor file does not hold {name} as planned")
        self._skip_to(info.begin)
        return info

    def take(self, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        info = self._info(name, dtype, shape)
        return np.frombuffer(self._read(info.nbytes), numpy_dtype(dtype))

    def take_parts(self, name: str, dtype: str, shape: tuple[int, ...]):
        """An entry's bytes in pieces of at most ``CHUNK`` (whole elements), in order: memory holds one piece,
        as the writer's row slabs keep a big tensor's (converters/unit_writer.py ``_Slabs``)."""
        info, dt = self._info(name, dtype, shape), numpy_dtype(dtype)
        step = max(dt.itemsize, self.CHUNK // dt.itemsize * dt.itemsize)
        for k in range(0, info.nbytes, step):
            yield np.frombuffer(self._read(min(step, info.nbytes - k)), dt)

    def verify(self) -> None:
        self._skip_to(self.copy.size)
        if self._f.read(1) or self._digest.hexdigest() != self.copy.sha256:
            raise _DonorChanged(f"{self.path}: donor file changed since it was recorded (sha256)")

    def close(self) -> None:
        self._f.close()


class Copying:
    """The copies of one new file while it is written (converters/unit_writer.py): its donor stream, which jobs
    it copies and their recorded error figures."""

    def __init__(self, outdir: Path, copy: FileCopy, out: OutputFile):
        self.copy = copy
        self.entries = {name: (dtype, shape) for name, dtype, shape in out.entries}
        self.stream = DonorStream(outdir, copy)

    def copies(self, group: OutputGroup, job: TensorJob) -> bool:
        """Whether ``job`` of ``group`` is copied (a stack's jobs: all of them or none)."""
        if group.stacks:
            return all(j.out_name in self.copy.jobs for j in group.jobs)
        return job.out_name in self.copy.jobs

    def take(self, name: str) -> np.ndarray:
        return self.stream.take(name, *self.entries[name])

    def put(self, sink, name: str) -> None:
        """Entry ``name`` from the donor into ``sink``: whole, or in pieces when larger than a piece."""
        dtype, shape = self.entries[name]
        if numpy_dtype(dtype).itemsize * math.prod(shape) <= DonorStream.CHUNK:
            sink.put(name, self.take(name))
            return
        for piece in self.stream.take_parts(name, dtype, shape):
            sink.put(name, piece, part=True)

    def _done(self, job: TensorJob, errors: dict, on_tensor) -> None:
        recorded = self.copy.errors.get(job.out_name)
        if recorded is not None:
            errors[job.out_name] = ErrorStats(*recorded)
        if on_tensor is not None:
            on_tensor(job.in_bytes)

    def whole_group(self, group: OutputGroup, sink, errors: dict, on_tensor) -> bool:
        """A stacked group copied whole: its entries put from the donor; False when it is not."""
        if not group.stacks or not self.copies(group, group.jobs[0]):
            return False
        for name, _, _ in group.entries:
            self.put(sink, name)
        for j in group.jobs:
            self._done(j, errors, on_tensor)
        return True

    def job(self, job: TensorJob, group: OutputGroup, sink, scales_after: list, errors: dict, on_tensor) -> bool:
        """``job`` copied: its weight put now, its scale next (a record) or with the group's scales (a callable
        read when its turn comes); False when it is not copied."""
        if group.stacks or job.out_name not in self.copy.jobs:
            return False
        wname, sname = job.target.tensor_names(job.out_name)
        self.put(sink, wname)
        if sname is not None and group.interleaved:
            self.put(sink, sname)
        elif sname is not None:
            scales_after.append((sname, lambda: self.take(sname)))
        self._done(job, errors, on_tensor)
        return True

    def verify(self) -> None:
        self.stream.verify()

    def close(self) -> None:
        self.stream.close()


class KeptFile:
    """A new file that is its donor file byte for byte (``FileCopy.keep``): left in place, read once to check
    its sha256 (_DonorChanged otherwise); stands for the file's sink in the unit writer (``result``, ``abort``)."""

    def __init__(self, outdir: Path, copy: FileCopy, out: OutputFile, errors: dict, on_tensor):
        stream = DonorStream(outdir, copy)
        try:
            stream.verify()
        finally:
            stream.close()
        self.record = (out.name, copy.size, copy.sha256)
        for job in out.jobs:
            recorded = copy.errors.get(job.out_name)
            if recorded is not None:
                errors[job.out_name] = ErrorStats(*recorded)
            if on_tensor is not None:
                on_tensor(job.in_bytes)

    def result(self):
        from colitools.converters.unit_writer import FileRecord

        return FileRecord(*self.record)

    def abort(self) -> None:
        pass  # nothing written: the file stays what it was, which is also what the new conversion wants
