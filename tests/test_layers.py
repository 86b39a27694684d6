"""The package's import graph: no circles, and the compat layer only on the
training runtime's public seam. Read from the source (every import, those
inside functions too), so a circle that only lazy imports kept from failing
at import time is still found."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import raydist

pytestmark = pytest.mark.unit

ROOT = Path(raydist.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        if "_proto" in path.parts:
            continue  # generated
        name = ".".join(("raydist", *path.relative_to(ROOT).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("raydist"):
            assert node.module is not None
            out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
            if node.module in known:
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others() -> None:
    known = _modules()
    graph = {name: _imports(path, known) - {name} for name, path in known.items()}
    assert _circles(graph) == []


def test_compat_uses_only_the_training_runtimes_public_seam() -> None:
    known = _modules()
    private = {name for name in known if name.startswith("raydist.train.") and (
        name.rsplit(".", 1)[1].startswith("_") or name in ("raydist.train.session", "raydist.train.warm_run"))}
    reaching = {name: sorted(_imports(path, known) & private) for name, path in known.items()
                if name.startswith("raydist.compat")}
    assert {name: found for name, found in reaching.items() if found} == {}


#: docs/architecture.md's layers, lowest first: a module imports only its own
#: layer's and lower ones (the package root runs first for any import: not a layer).
LAYERS = (
    ("raydist._proto",),
    ("raydist.errors", "raydist.paths", "raydist.spec", "raydist.observed", "raydist.backoff"),
    ("raydist.engine", "raydist.jobs", "raydist.ray_jobs"),
    ("raydist.data", "raydist.train"),
    ("raydist.compat", "raydist.control"),
    ("raydist.api",),
    ("raydist.cli", "raydist.cli_jobs", "raydist.cli_view", "raydist.cli_dashboard", "raydist.cli_serve",
     "raydist.testing"),
)


def _rank(module: str, table: tuple[tuple[str, ...], ...], name: str) -> int:
    """Where ``module`` stands in ``table`` (lowest first)."""
    for rank, tops in enumerate(table):
        if any(module == top or module.startswith(top + ".") for top in tops):
            return rank
    raise AssertionError(f"{module} is in no entry of {name}: add it there (and to docs/architecture.md)")


def _layer(module: str) -> int:
    return _rank(module, LAYERS, "LAYERS")


def test_imports_run_downward_only() -> None:
    """A training run used to reach the Python API's private registry
    (train/session.py -> raydist.api), and with it the control plane the API
    imports: the circle check could not see a layer crossed downward-upward."""
    known = _modules()
    upward = sorted(f"{name} -> {target}" for name, path in known.items() if name != "raydist"
                    for target in _imports(path, known) - {"raydist"} if _layer(target) > _layer(name))
    assert upward == []


#: The engine's rooms, lowest first (docs/architecture.md, raydist/engine/__init__.py).
ENGINE_ROOMS = (
    ("raydist.engine.sizing", "raydist.engine.ports", "raydist.engine.threads", "raydist.engine.auth",
     "raydist.engine.nodelogs", "raydist.engine.connection"),
    ("raydist.engine.spark",),
    ("raydist.engine.link",),
    ("raydist.engine.node",),
    ("raydist.engine.cluster",),
    ("raydist.engine.registry",),
)


def _room(module: str) -> int:
    return _rank(module, ENGINE_ROOMS, "ENGINE_ROOMS")


def test_the_engines_rooms_import_downward_only() -> None:
    """The engine is shown as rooms (the link, the Spark side, a node, the
    cluster): a node's supervisor runs in a Spark task and must never reach
    the cluster's code, and the link, which both ends share, knows neither
    the node's processes nor the cluster."""
    known = {name: path for name, path in _modules().items() if name.startswith("raydist.engine.")}
    upward = sorted(f"{name} -> {target}" for name, path in known.items()
                    for target in _imports(path, known) if _room(target) > _room(name))
    assert upward == []
