"""The main job end to end on the bundled tiny model (``./dev demo``).

Runs the real commands one after another, printing each: convert the committed OLMoE oracle fixture to the
default recipe (int4-g64 experts, int8-row dense), inspect and verify the container, generate text from it,
and check every recipe of the fixture token by token against its transformers reference. Output goes to
``out/`` in the checkout; a second run resumes (nothing left to convert) and checks again.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "oracles" / "olmoe"


def _run(*args: str) -> None:
    shown = " ".join(shlex.quote(str(Path(a).relative_to(ROOT)) if a.startswith(str(ROOT)) else a) for a in args)
    print(f"\n$ colitools {shown}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "colitools", *args], cwd=ROOT)
    if proc.returncode != 0:
        print(f"demo: `colitools {shown}` failed with exit code {proc.returncode}", file=sys.stderr)
        sys.exit(proc.returncode)


def main() -> None:
    if not FIXTURE.is_dir():
        sys.exit(f"demo: the bundled fixture {FIXTURE} is missing (run from a colitools checkout)")
    out = ROOT / "out" / "olmoe-default"
    _run("convert", str(FIXTURE), str(out), "--min-free-gb", "0")
    _run("inspect", str(out), "--summary")
    _run("verify", "container", str(out))
    _run("run", str(out), "--prompt", "the router picks experts", "--max-new-tokens", "16")
    print("(a random tiny model: the text is noise; what matters is that it is the oracle's noise)")
    _run("verify", "oracle", str(FIXTURE))
    print("\ndemo: converted, ran and matched the oracle on every recipe (f32, default, int3, mxfp4, planar).")


if __name__ == "__main__":
    main()
