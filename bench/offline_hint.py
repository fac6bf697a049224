"""A Hub endpoint refusing the connection while the Hugging Face cache holds the whole model (issue 42): the wall
time of ``colitools convert org/name OUT`` until its one error line, and that line.

``.venv/bin/python bench/offline_hint.py [--runs 3]``: lays a generated checkpoint out as huggingface_hub's cache
(``tests/converters/hubserver.write_hf_cache``), points ``HF_ENDPOINT`` at a port of 127.0.0.1 nobody listens on
(a real ECONNREFUSED), and runs the console script ``--runs`` times; then once more with ``HF_HUB_OFFLINE=1`` (the
conversion the hint points to). Run it on a checkout before ``converters/cache_hint.py`` for the old figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "converters"))
CLI = str(Path(sys.executable).with_name("colitools"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    from hubserver import write_hf_cache
    from tinyckpt import Tiny, make_checkpoint

    work = Path(tempfile.mkdtemp(prefix="bench-offline-hint-"))
    try:
        make_checkpoint(work / "repo", Tiny(layers=2, experts=2, hidden=128, inter=64, shards=3))
        write_hf_cache(work / "cache", "org/tiny", work / "repo")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "HF_HUB_CACHE": str(work / "cache"), "HF_ENDPOINT": f"http://127.0.0.1:{port}",
               "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"}  # fmt: skip
        for run in range(a.runs):
            t = time.monotonic()
            r = subprocess.run(
                [CLI, "convert", "org/tiny", str(work / "out")], capture_output=True, text=True, env=env
            )
            lines = r.stderr.splitlines()
            print(
                f"run {run + 1}: {time.monotonic() - t:.1f} s, exit {r.returncode}, {len(lines)} stderr line(s)"
            )
        print(f"  {lines[-1] if lines else ''}")
        t = time.monotonic()
        r = subprocess.run([CLI, "convert", "org/tiny", str(work / "out"), "--min-free-gb", "0"],
                           capture_output=True, text=True, env={**env, "HF_HUB_OFFLINE": "1"})  # fmt: skip
        print(f"with HF_HUB_OFFLINE=1: {time.monotonic() - t:.1f} s, exit {r.returncode}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
