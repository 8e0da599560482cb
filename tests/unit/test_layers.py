"""The house rules of docs/architecture.md, checked on the source: every package exists,
imports point one way (no forbidden import, no circle), inside the engine too, and the
half of the model families the control plane reads loads no torch. Imports inside
functions count as much as those at the top."""

from __future__ import annotations

import ast
import re
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
    "workers/engine/data",
    "workers/engine/experimental",
    "workers/engine/models",
    "workers/engine/models/llama",
)
# The half of the engine that the control plane reads when a job is submitted, no torch:
# the model families' registry and config adapters (a config.json), and the readers of
# records, tokenizers and chat templates (a sample of the data).
TORCH_FREE_ENGINE = re.compile(
    r"^shardline\.workers\.engine\.models(\.registry|\.\w+\.config)?$"
    r"|^shardline\.workers\.engine\.data\."
    r"(records|chat|tokenizers|documents|token_cache|preflight)$"
)
# package prefix -> what no module under it may import (a name and everything below it)
FORBIDDEN = {
    "shardline.workers.contract": (
        "torch",
        "ray",
        "shardline.service",
        "shardline.api",
        "shardline.workers.storage",
        "shardline.workers.runtime",
        "shardline.workers.engine",
    ),
    "shardline.workers.storage": (
        "torch",
        "ray",
        "shardline.service",
        "shardline.api",
        "shardline.workers.runtime",
        "shardline.workers.engine",
    ),
    "shardline.workers.engine": (
        "ray",
        "shardline.service",
        "shardline.api",
        "shardline.workers.runtime",
    ),
    "shardline.workers.runtime": (
        "shardline.service",
        "shardline.api",
        "sqlalchemy",
        "fastapi",
        "httpx",
        "starlette",
    ),
    "shardline.service": ("shardline.workers.engine", "torch", "shardline.api"),
    # The API process never imports the engine; the CLI's local commands may.
    "shardline.api": ("shardline.workers.engine", "torch"),
}
ALLOWED = {"shardline.api.cli": ("shardline.workers.engine", "torch")}
# Inside the engine: part -> what it may not import. The model families, the data
# pipeline and the checkpoint manager are handed what they need; the experimental
# strategies are named by the core, never imported by it (see below).
ENGINE_FORBIDDEN = {
    "shardline.workers.engine.models": (
        "shardline.workers.engine.trainer",
        "shardline.workers.engine.data",
        "shardline.workers.engine.checkpoint",
        "shardline.workers.engine.experimental",
    ),
    "shardline.workers.engine.data": (
        "shardline.workers.engine.models",
        "shardline.workers.engine.trainer",
        "shardline.workers.engine.checkpoint",
        "shardline.workers.engine.experimental",
    ),
    "shardline.workers.engine.checkpoint": (
        "shardline.workers.engine.trainer",
        "shardline.workers.engine.models",
        "shardline.workers.engine.data",
        "shardline.workers.engine.experimental",
        "shardline.workers.engine.dp_strategy",
    ),
}


def module_name(path: Path) -> str:
    parts = ("shardline", *path.relative_to(ROOT).with_suffix("").parts)
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
                if any(under(i, f) for f in forbidden)
                and not any(under(i, a) for a in allowed)
                and not TORCH_FREE_ENGINE.match(i)
            ]
    assert broken == []


def test_the_engine_s_parts_import_only_what_they_may() -> None:
    broken = [
        f"{name} imports {i}"
        for name, imported in GRAPH.items()
        for part, forbidden in ENGINE_FORBIDDEN.items()
        if under(name, part)
        for i in imported
        if any(under(i, f) for f in forbidden)
    ]
    assert broken == []


def test_nothing_outside_experimental_imports_it() -> None:
    inside = "shardline.workers.engine.experimental"
    broken = [
        f"{name} imports {i}"
        for name, imported in GRAPH.items()
        if not under(name, inside) and not name.startswith("tests.")
        for i in imported
        if under(i, inside)
    ]
    assert broken == []


def test_the_torch_free_half_of_the_families_imports_only_the_contract() -> None:
    half = sorted(n for n in GRAPH if TORCH_FREE_ENGINE.match(n))
    assert "shardline.workers.engine.models.llama.config" in half
    broken = [
        f"{name} imports {i}"
        for name in half
        for i in GRAPH[name]
        if under(i, "shardline.workers")
        and not under(i, "shardline.workers.contract")
        and not TORCH_FREE_ENGINE.match(i)
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


def test_contract_storage_and_the_families_configs_load_neither_torch_nor_ray() -> None:
    names = sorted(
        n
        for n in GRAPH
        if under(n, "shardline.workers.contract")
        or under(n, "shardline.workers.storage")
        or TORCH_FREE_ENGINE.match(n)
    )
    probe = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"


def test_nothing_imports_the_folders_by_their_bare_names() -> None:
    """The wheel installs one package, `shardline`; `import api` would find a user's own
    `api` module (or nothing) once installed, and works here only because the repository's
    root is on the path."""
    bare = ("api", "service", "workers", "migrations")
    broken = [
        f"{name} imports {i}"
        for name, imported in GRAPH.items()
        for i in imported
        if any(under(i, b) for b in bare)
    ]
    assert broken == []
