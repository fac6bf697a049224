"""The dependency graph of docs/INTERNALS.md is the real one: every ``import`` of our own packages, read from the
source with ``ast`` (function-local imports included), goes only along the documented edges."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> source folder
PACKAGES = {
    "colitools.formats": ROOT / "formats",
    "colitools.converters": ROOT / "converters",
    "colitools.verify": ROOT / "verify",
    "colitools.runtime": ROOT / "colitools" / "runtime",
    "colitools.mirror": ROOT / "colitools" / "mirror",
    "colitools.cli": ROOT / "colitools" / "cli",
}
# what each package may import of ours besides itself (docs/INTERNALS.md, "Dependency direction");
# colitools.errors is the error hierarchy every layer above formats raises.
ALLOWED = {
    "colitools.formats": set(),
    "colitools.converters": {"colitools.formats", "colitools.errors"},
    "colitools.runtime": {"colitools.formats", "colitools.errors"},
    "colitools.mirror": {"colitools.formats", "colitools.errors"},
    "colitools.verify": {"colitools.formats", "colitools.errors", "colitools.converters", "colitools.runtime"},
    "colitools.cli": set(PACKAGES) | {"colitools.errors", "colitools"},
}


def _our_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m == "colitools" or m.startswith("colitools.")}


def _package_of(module: str) -> str | None:
    for pkg in sorted(PACKAGES, key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    if module == "colitools.errors" or module.startswith("colitools.errors."):
        return "colitools.errors"
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_imports_follow_the_documented_direction(package: str) -> None:
    bad = []
    for path in sorted(PACKAGES[package].rglob("*.py")):
        for module in sorted(_our_imports(path)):
            target = _package_of(module)
            if target is None:
                # ``import colitools`` reads the package's version string; any other top-level module
                # (``colitools.demo``, ``colitools.__main__``) is an entry point nothing may import but the CLI
                target = "colitools" if module in ("colitools", "colitools.__version__") else module
            if target == "colitools" and package != "colitools.formats":
                continue
            if target != package and target not in ALLOWED[package]:
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, "\n".join(bad)


def test_formats_imports_nothing_of_ours_outside_formats() -> None:
    for path in sorted(PACKAGES["colitools.formats"].rglob("*.py")):
        outside = {m for m in _our_imports(path) if _package_of(m) != "colitools.formats"}
        assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"
