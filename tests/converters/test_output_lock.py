"""One conversion per output folder: a second one fails at once, naming the folder, and touches nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tinyckpt import Tiny, make_checkpoint

from colitools.converters.runner import LOCKFILE, convert
from colitools.errors import ConvertError

_HOLD = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_second_conversion_into_a_locked_folder_fails_at_once(tmp_path):
    make_checkpoint(tmp_path / "src", Tiny(layers=1, experts=2, hidden=64, inter=64, shards=1))
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out / LOCKFILE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(ConvertError, match=r"out: another colitools convert is working in this folder$"):
            convert(str(tmp_path / "src"), out)
        assert sorted(p.name for p in out.iterdir()) == [LOCKFILE]  # nothing else written
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    convert(str(tmp_path / "src"), out)  # the holder is gone: the lock is free again
    assert not (out / LOCKFILE).exists() and (out / "colitools.json").is_file()
