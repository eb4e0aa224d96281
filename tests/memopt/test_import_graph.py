"""The layering, read from the source: core <- adapters <- api <- cli/plot.

The import graph is built with ``ast`` from every module of ``memopt`` and
``autobatch`` (module-level and function-level imports alike; ``from . import
x`` counts as an import of the submodule ``x``, and importing ``a.b.c`` runs
``a/__init__`` and ``a/b/__init__`` too).  It must have no cycle, and:

- a core module (anything of memopt not listed below) imports no adapter
  (``memopt.paddle.*``), no API or face module, and neither Paddle nor
  TensorFlow;
- an adapter imports no API-layer (``memopt.api``, ``memopt.policy``,
  ``memopt.pipeline.*``) or face module and not the planner
  (:mod:`memopt.planner`): adapters read programs and apply plans, the API
  wires them to the planner;
- memopt never imports autobatch.
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("memopt", "autobatch")

#: memopt's API layer (the entry points, the policy choosing what runs, the
#: per-IR pipelines wiring adapters to the planner) and faces: they may
#: import anything of memopt (the API layer no face).
API = {"memopt.api", "memopt.policy"}
API_PREFIX = "memopt.pipeline"
FACES = {"memopt.cli", "memopt.plot"}
#: Test and bench fixtures (as ``numpy.testing``): faces too -- they may import
#: anything of memopt, and nothing below the faces imports them.
TESTING_PREFIX = "memopt.testing"
#: Adapters: Paddle imported inside; may import the core.
ADAPTER_PREFIX = "memopt.paddle"
PLANNER = {"memopt.planner"}


def _modules():
    """``{module name: path}`` of every module of the packages."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                found[".".join(rel)] = os.path.join(folder, name)
    return found


def _is_package(path: str) -> bool:
    return os.path.basename(path) == "__init__.py"


def imports_of(name: str, path: str, modules) -> set:
    """Every module ``name`` imports (absolute names; outside packages kept
    as their top-level name, e.g. ``paddle``), at any depth of the code."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = name if _is_package(path) else name.rpartition(".")[0]
    out = set()

    def add(target: str) -> None:
        parts = target.split(".")
        if parts[0] not in PACKAGES:
            out.add(parts[0])
            return
        # importing a.b.c runs a/__init__ and a/b/__init__ first, except the
        # packages holding the importer itself: they ran before it did
        for k in range(1, len(parts) + 1):
            prefix = ".".join(parts[:k])
            if prefix in modules and (k == len(parts) or not name.startswith(prefix + ".")):
                out.add(prefix)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            add(target)
            for alias in node.names:  # from package import submodule
                if f"{target}.{alias.name}" in modules:
                    add(f"{target}.{alias.name}")
    out.discard(name)
    return out


def import_graph():
    modules = _modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def _layer(name: str) -> str:
    if name in API or name == API_PREFIX or name.startswith(API_PREFIX + "."):
        return "api"
    if name in FACES or name == TESTING_PREFIX or name.startswith(TESTING_PREFIX + "."):
        return "face"
    if name == ADAPTER_PREFIX or name.startswith(ADAPTER_PREFIX + "."):
        return "adapter"
    if name.startswith("memopt"):
        return "core"
    return "autobatch"


def find_cycle(graph):
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    state = {}
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_function_level_and_relative_imports():
    """The reader finds what the layering depends on (a check that could
    pass by reading nothing would prove nothing)."""
    graph = import_graph()
    assert "memopt.liveness" in graph["autobatch.ir.flow"]  # the passes share it there
    assert {"memopt.planner", "memopt.paddle.legacy.program",
            "memopt.paddle.flags"} <= graph["memopt.pipeline.legacy"]
    assert {"memopt.policy", "memopt.paddle.ir"} <= graph["memopt.api"]
    # function-level: cli imports the API inside its commands
    assert "memopt.api" in graph["memopt.cli"]
    assert "paddle" in graph["memopt.paddle.legacy.program"]
    # and a cycle is found when there is one
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_anywhere():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_each_layer_imports_only_below_it():
    bad = []
    for name, deps in sorted(import_graph().items()):
        layer = _layer(name)
        for dep in sorted(deps):
            dep_layer = _layer(dep) if dep.split(".")[0] in PACKAGES else dep
            if layer == "core" and dep_layer in ("adapter", "api", "face", "paddle",
                                                 "tensorflow"):
                bad.append(f"core module {name} imports {dep}")
            elif layer == "adapter" and (dep_layer in ("api", "face") or dep in PLANNER):
                bad.append(f"adapter {name} imports {dep}")
            elif layer == "api" and dep_layer == "face":
                bad.append(f"{name} imports the face {dep}")
            if name.startswith("memopt") and dep_layer == "autobatch":
                bad.append(f"{name} imports {dep} (memopt never imports autobatch)")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", ["memopt.graph", "memopt.liveness", "memopt.planner",
                                    "memopt.candidates", "memopt.analysis"])
def test_core_modules_are_core(module):
    """The layer table above puts the planner's modules in the core."""
    assert _layer(module) == "core"


@pytest.mark.parametrize("module", ["memopt.paddle.pir.program", "memopt.paddle.legacy.program",
                                    "memopt.paddle.guards.fetch", "memopt.paddle.flags"])
def test_adapter_modules_are_adapters(module):
    assert _layer(module) == "adapter"


@pytest.mark.parametrize("module", ["memopt.api", "memopt.policy", "memopt.pipeline.legacy",
                                    "memopt.pipeline.pir"])
def test_api_layer(module):
    """The pipelines and the policy are the API layer: no core module or
    adapter may import them, and they import no face."""
    assert _layer(module) == "api"


@pytest.mark.parametrize("module", ["memopt.testing", "memopt.testing.models",
                                    "memopt.testing.fleet_models", "memopt.testing.dist_sweep"])
def test_fixtures_are_faces(module):
    """Fixtures sit with the faces: no core, adapter or API module may import them."""
    assert _layer(module) == "face"
    assert module in import_graph()
