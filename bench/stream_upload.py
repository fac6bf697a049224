"""Local disk of ``convert org/name OUT --upload-repo REPO --stream-upload`` against its bound, and against the
same conversion without streaming, on the tests' fake Hub (issue 42).

``.venv/bin/python bench/stream_upload.py [--shards 6] [--mib 100] [--runs 1] [--dir /dev/shm]``: generates a
BF16 MoE checkpoint (``bench/download.py``'s ``make_model``: one layer per shard), serves it from
``tests/converters/hubserver.py`` in a process of its own (uploads stored on ``--dir`` too, outside OUT), and
runs, as processes, (a) ``convert org/name OUT --upload-repo bench/stream --stream-upload`` and (b) ``convert
org/name OUT --upload-repo bench/after`` (convert, then upload the finished folder), each with
``--min-free-gb 0``. While each runs, this process samples OUT every 5 ms, in one pass per sample: the bytes its
files hold on disk (``st_blocks``; sparse stand-ins count only their blocks) and, of those, the downloads'
(``.colitools-download``: the source shards, those held ahead included). From ``--dry-run --json``'s plan: the
most source bytes one unit reads and the largest unit output; the bound without download ahead is their sum,
with it the downloads' peak + the largest unit output (download ahead fills the room above the floor: at
``--min-free-gb 0`` it may hold every shard). Prints each run's wall, the peaks against the bound, and what OUT
holds at the end.

``--kill``: instead, the fake Hub in this process (its request log readable), uploads throttled to
``--upload-mb`` MB/s; the streaming convert process is SIGKILLed once the ledger marks a unit's files confirmed
and the body of another file is on its way, then rerun to the end. Prints the files confirmed before the kill,
the LFS PUTs per object over both runs (from the server's request log), the units the rerun kept, and whether
the repo's main equals a plain local conversion of the same source byte for byte (``colitools.json`` but
``run``) and passes ``verify container``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "converters"))
MB = 1_000_000
REPO = "bench/model"

SERVER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from hubserver import HubServer
from hubupload import UploadState
hub = HubServer({sys.argv[2]: {"main": sys.argv[3]}})
hub.upload = UploadState(storage=Path(sys.argv[4]))
hub.start()
print(hub.endpoint, flush=True)
sys.stdin.read()
hub.stop()
"""


def disk_bytes(folder: Path) -> tuple[int, int]:
    """Bytes the files under ``folder`` take on disk (allocated blocks), and those of its download folder, in one
    pass (one instant); files vanishing meanwhile skipped."""
    total = downloads = 0
    stack = [(folder, False)]
    while stack:
        where, inside = stack.pop()
        try:
            entries = list(os.scandir(where))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((Path(entry.path), inside or entry.name == ".colitools-download"))
                elif entry.is_file(follow_symlinks=False):
                    n = entry.stat(follow_symlinks=False).st_blocks * 512
                    total += n
                    downloads += n if inside else 0
            except FileNotFoundError:
                pass
    return total, downloads


def run_sampled(command: list[str], out: Path, env: dict[str, str]) -> tuple[float, list[int]]:
    """Wall seconds of ``command`` and the peaks, sampled every 5 ms while it ran, of: OUT's bytes on disk, the
    downloads' (``.colitools-download``), the rest (outputs, ledger, stand-ins)."""
    peak = [0, 0, 0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            total, downloads = disk_bytes(out)
            for i, n in enumerate((total, downloads, total - downloads)):
                peak[i] = max(peak[i], n)
            time.sleep(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    thread.start()
    try:
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    finally:
        done.set()
        thread.join()
    return time.perf_counter() - start, peak


def bound(env: dict[str, str], out: Path, repo: Path) -> tuple[int, int, int]:
    """(the most source bytes one unit reads, the largest unit output, the whole output) from the plan."""
    dry = subprocess.run([sys.executable, "-m", "colitools", "convert", REPO, str(out), "--dry-run", "--json"],
                         check=True, env=env, capture_output=True, text=True)  # fmt: skip
    plan = json.loads(dry.stdout)["plan"]
    sizes = {p.name: p.stat().st_size for p in repo.glob("*.safetensors")}
    shards = max(sum(sizes[s] for s in u["shards"]) for u in plan["units"])
    return shards, max(u["out_bytes"] for u in plan["units"]), plan["out_bytes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument(
        "--kill", action="store_true", help="SIGKILL a streaming upload, rerun, count the PUTs"
    )
    parser.add_argument("--upload-mb", type=float, default=20.0, help="with --kill: upload rate, MB/s")
    args = parser.parse_args()
    from download import make_model

    if args.kill:
        with tempfile.TemporaryDirectory(prefix="colitools-bench-su-", dir=args.dir) as tmp:
            make_model(Path(tmp) / "repo", args.shards, args.mib)
            kill_and_resume(Path(tmp), args)
        return

    with tempfile.TemporaryDirectory(prefix="colitools-bench-su-", dir=args.dir) as tmp:
        base = Path(tmp)
        make_model(base / "repo", args.shards, args.mib)
        (base / "lfs").mkdir()
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(ROOT / "tests" / "converters"), REPO, str(base / "repo"),
             str(base / "lfs")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            endpoint = server.stdout.readline().strip()
            env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(base / "hf"), "HF_TOKEN": "bench",
                   "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
            report(base, env, args)
        finally:
            server.stdin.close()
            server.wait(60)


def report(base: Path, env: dict[str, str], args) -> None:
    shards, unit_out, whole = bound(env, base / "out", base / "repo")
    source = sum(p.stat().st_size for p in (base / "repo").glob("*.safetensors"))
    limit = shards + unit_out
    print(f"checkpoint {source / MB:.0f} MB in {args.shards} shards -> output {whole / MB:.1f} MB; one unit reads "
          f"at most {shards / MB:.1f} MB of shards and writes at most {unit_out / MB:.1f} MB: bound without "
          f"shards ahead {limit / MB:.1f} MB", flush=True)  # fmt: skip
    # --min-free-gb 0: download ahead holds every shard it can (the floor bounds it, not a count)
    for run in range(args.runs):
        for kind, extra in (("stream", ["--upload-repo", f"bench/s{run}", "--stream-upload"]),
                            ("after", ["--upload-repo", f"bench/a{run}"])):  # fmt: skip
            subprocess.run(["rm", "-rf", str(base / "out"), str(base / "hf")], check=True)
            command = [sys.executable, "-m", "colitools", "convert", REPO, str(base / "out"), "--min-free-gb",
                       "0", "--no-progress", *extra]  # fmt: skip
            wall, (total, downloads, rest) = run_sampled(command, base / "out", env)
            left = disk_bytes(base / "out")[0]
            print(f"run {run + 1} {kind:6s}: wall {wall:6.2f} s  peak local disk {total / MB:6.1f} MB, bound with "
                  f"the shards held ahead {(downloads + unit_out) / MB:.1f} MB (downloads peak {downloads / MB:.1f} "
                  f"MB + one unit's output); outputs and ledger peak {rest / MB:.1f} MB = {rest / unit_out:.2f} x "
                  f"one unit's output; left in OUT {left / MB:.2f} MB", flush=True)  # fmt: skip


def kill_and_resume(base: Path, args) -> None:
    from hubserver import HubServer
    from hubupload import UploadState, throttle_uploads
    from midkill import sigkill_when

    hub = HubServer({REPO: {"main": base / "repo"}})
    hub.upload = UploadState(storage=Path(tempfile.mkdtemp(dir=base)))
    with hub:
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(base / "hf"), "HF_TOKEN": "bench",
               "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
        convert = [sys.executable, "-m", "colitools", "convert", REPO]
        subprocess.run([*convert, str(base / "reference"), "--no-progress"], check=True, env=env,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        out = base / "out"
        command = [
            *convert,
            str(out),
            "--upload-repo",
            "bench/kill",
            "--stream-upload",
            "--no-progress",
            "--json",
        ]
        throttle_uploads(hub, args.upload_mb * MB)
        proc = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        sigkill_when(
            proc, lambda: bool(confirmed(out)) and bool(receiving(hub) - confirmed(out)), timeout=600
        )
        before = confirmed(out)
        throttle_uploads(hub, None)
        rerun = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        puts = lfs_puts(hub.log)
        summary = json.loads(rerun.stdout)
        print(
            f"SIGKILL with {len(before)} file(s) confirmed and a body on its way; the rerun kept "
            f"{summary['units_skipped']} of {summary['units_total']} units (redone: {summary['units_redone']})"
        )
        print(f"LFS PUTs per object over both runs: {sorted(puts.values())}; of the objects confirmed before the "
              f"kill: {[puts.get(oid) for oid in sorted(before)]}")  # fmt: skip
        print(
            f"main = the local conversion, byte for byte: {same_as(download(hub, base / 'back'), base / 'reference')}"
        )


def confirmed(out: Path) -> set[str]:
    try:
        units = json.loads((out / "colitools.json").read_text())["units"]
    except (OSError, ValueError, KeyError):
        return set()
    return {f["sha256"] for u in units.values() for f in u["files"] if f.get("uploaded")}


def receiving(hub) -> set[str]:
    with hub.upload.lock:
        return set(hub.upload.bodies) - set(hub.upload.stored)


def lfs_puts(log) -> dict[str, int]:
    counts: dict[str, int] = {}
    for method, path, status in list(log):
        if method == "PUT" and path.startswith("/lfs/") and status == 200:
            oid = path[len("/lfs/") :].split("?")[0]
            counts[oid] = counts.get(oid, 0) + 1
    return counts


def download(hub, dest: Path) -> Path:
    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi(endpoint=hub.endpoint, token="bench")
    for sibling in api.model_info("bench/kill").siblings:
        hf_hub_download("bench/kill", sibling.rfilename, local_dir=dest, token="bench", endpoint=hub.endpoint)
    return dest


def same_as(back: Path, reference: Path) -> bool:
    from colitools.verify.container import verify_container

    for path in reference.iterdir():
        if path.name.startswith(".") or not path.is_file():
            continue
        mine, theirs = (back / path.name).read_bytes(), path.read_bytes()
        if path.name == "colitools.json":
            mine, theirs = ({k: v for k, v in json.loads(x).items() if k != "run"} for x in (mine, theirs))
        if mine != theirs:
            return False
    return verify_container(back).ok


if __name__ == "__main__":
    main()
