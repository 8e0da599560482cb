"""The house rules of docs/architecture.md, checked on the source: every package exists,
imports point one way (no forbidden import, no circle), and no runtime file grows past
300 lines. Imports inside functions count as much as those at the top."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("api", "service", "workers", "migrations")
PACKAGES = (
    "migrations",
    "api/cli",
    "workers/contract",
    "workers/storage",
    "workers/runtime",
    "workers/runtime/supervisor",
    "workers/runtime/placement",
    "workers/engine",
    "workers/engine/checkpoint",
)
# package prefix -> what no module under it may import (a name and everything below it)
FORBIDDEN = {
    "workers.contract": (
        "torch",
        "ray",
        "service",
        "api",
        "workers.storage",
        "workers.runtime",
        "workers.engine",
    ),
    "workers.storage": ("torch", "ray", "service", "api", "workers.runtime", "workers.engine"),
    "workers.engine": ("ray", "service", "api", "workers.runtime"),
    "workers.runtime": ("service", "api", "sqlalchemy", "fastapi", "httpx", "starlette"),
    "service": ("workers.engine", "torch", "api"),
    # The API process never imports the engine; the CLI's local commands may.
    "api": ("workers.engine", "torch"),
}
ALLOWED = {"api.cli": ("workers.engine", "torch")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for top in SOURCES:
        for path in (ROOT / top).rglob("*.py"):
            found[module_name(path)] = path
    return found


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """Every module `path` imports (a package's submodule where `from p import m` names one)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{a.name}" for a in node.names} & known.keys()
            out.update(submodules)
            if len(submodules) < len(node.names):  # names defined in the module itself
                out.add(node.module)
    return out


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


GRAPH = {name: imports_of(path, modules()) for name, path in modules().items()}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_of_the_layout_exists(package: str) -> None:
    assert (ROOT / package / "__init__.py").is_file(), package


def test_no_module_imports_what_its_layer_may_not() -> None:
    broken = []
    for name, imported in GRAPH.items():
        for prefix, forbidden in FORBIDDEN.items():
            if not under(name, prefix):
                continue
            allowed = next((a for p, a in ALLOWED.items() if under(name, p)), ())
            broken += [
                f"{name} imports {i}"
                for i in imported
                if any(under(i, f) for f in forbidden) and not any(under(i, a) for a in allowed)
            ]
    assert broken == []


def test_no_import_circles() -> None:
    ours = {n: {i for i in imported if i in GRAPH} for n, imported in GRAPH.items()}
    circles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(ours[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(ours):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_no_runtime_file_is_over_300_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "workers" / "runtime").rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300
    }
    assert long == {}


def test_contract_and_storage_load_neither_torch_nor_ray() -> None:
    names = sorted(n for n in GRAPH if under(n, "workers.contract") or under(n, "workers.storage"))
    probe = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"
