"""``colitools upload`` of a ~2 GB output, with the manifest's sha256 (what ``publish.upload_output`` does) and
without (huggingface_hub hashing every file itself first, its default), to the fake Hub of the tests.

``.venv/bin/python bench/upload.py [--gb 2] [--shards 4] [--runs 2] [--dir /dev/shm]``: writes an output
folder of ``--shards`` safetensors files (one U8 tensor each, random bytes) with a complete ``colitools.json``
on the tmpfs, then per run starts a fresh fake Hub (``tests/converters/hubserver.py``, storage on the same
tmpfs, LFS transfer: ``HF_HUB_DISABLE_XET``) and times, interleaved: ``manifest`` = ``upload_output`` (the
manifest's sha256 handed to huggingface_hub), ``hashing`` = the same files and card through ``create_commit``
without a sha256 (huggingface_hub reads each file once to hash it, then again to send it), and ``sha256`` alone
(one thread, ``hashlib`` over the files: what the second read costs by itself). The fake Hub hashes what it
receives on the same 2 cores, so both uploads carry that cost equally. Prints best and median seconds, GB/s and
the ratio hashing / manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "converters"))
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_TOKEN", "bench")


def make_output(folder: Path, total: int, shards: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    size = total // shards
    records = []
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        header = json.dumps(
            {f"model.layers.{k}.blob": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}
        )
        header += " " * (-len(header) % 8)
        digest = hashlib.sha256()
        with open(folder / name, "wb") as out:
            head = struct.pack("<Q", len(header)) + header.encode()
            out.write(head)
            digest.update(head)
            for _ in range(size // (64 << 20)):
                block = os.urandom(64 << 20)
                out.write(block)
                digest.update(block)
            rest = os.urandom(size % (64 << 20))
            out.write(rest)
            digest.update(rest)
        records.append({"name": name, "size": (folder / name).stat().st_size, "sha256": digest.hexdigest()})
    manifest = {
        "format": 1, "tool": {"name": "colitools", "version": "bench"}, "state": "complete",
        "source": {"kind": "local", "path": "bench"}, "recipe": {"experts": "int4-g64"}, "fallbacks": [],
        "plan": {"files": [{"name": r["name"], "size": r["size"]} for r in records]},
        "units": {f"model.{k}": {"files": [r]} for k, r in enumerate(records)},
    }  # fmt: skip
    (folder / "colitools.json").write_text(json.dumps(manifest))


def upload_with_manifest(out: Path, repo: str, endpoint: str) -> float:
    from colitools.converters.publish import upload_output

    start = time.perf_counter()
    upload_output(out, repo, endpoint=endpoint, progress=False)
    return time.perf_counter() - start


def upload_hashing(out: Path, repo: str, endpoint: str) -> float:
    from huggingface_hub import CommitOperationAdd, HfApi

    from colitools.converters.manifest import Manifest
    from colitools.converters.model_card import build_card
    from colitools.converters.publish import upload_files

    start = time.perf_counter()
    manifest, files = upload_files(out)
    card = build_card(out, manifest, repo, [(f.name, f.size) for f in files])
    ops = [CommitOperationAdd(f.name, str(out / f.name)) for f in files]
    ops.append(CommitOperationAdd("README.md", card.encode()))
    api = HfApi(endpoint=endpoint, token="bench")
    api.create_repo(repo, exist_ok=True)
    api.create_commit(repo, ops, commit_message="bench")
    assert isinstance(manifest, Manifest)
    return time.perf_counter() - start


def sha256_only(out: Path) -> float:
    start = time.perf_counter()
    for path in sorted(out.glob("*.safetensors")):
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while block := fh.read(8 << 20):
                digest.update(block)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", default="/dev/shm")
    args = parser.parse_args()
    from hubserver import HubServer
    from hubupload import UploadState

    total = int(args.gb * 1e9)
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        out = Path(work) / "out"
        make_output(out, total, args.shards)
        times: dict[str, list[float]] = {"manifest": [], "hashing": [], "sha256": []}
        for run in range(args.runs):
            for kind in ("manifest", "hashing", "sha256"):
                if kind == "sha256":
                    times[kind].append(sha256_only(out))
                    continue
                server = HubServer()
                server.upload = UploadState(storage=Path(tempfile.mkdtemp(dir=work)))
                with server:
                    upload = upload_with_manifest if kind == "manifest" else upload_hashing
                    times[kind].append(upload(out, f"bench/run{run}", server.endpoint))
        gb = total / 1e9
        for kind, values in times.items():
            best, median = min(values), statistics.median(values)
            print(
                f"{kind:9s} best {best:7.2f} s  median {median:7.2f} s  {gb / best:5.2f} GB/s  (load {os.getloadavg()[0]:.1f})"
            )
        ratio = min(times["hashing"]) / min(times["manifest"])
        print(f"hashing / manifest (best): {ratio:.2f}x; the second read alone: {min(times['sha256']):.2f} s")


if __name__ == "__main__":
    main()
