"""The compile passes depend on the IR only: type_inference,
allocation_strategy and lowering import (at module level or inside a
function) nothing of autobatch but ``autobatch.ir`` and
``autobatch.errors`` (a leaf of exception classes), and of memopt only
``memopt.liveness``.  Read from the source (AST), so a function-level import
counts too."""
import ast
import pathlib

import pytest

import autobatch

PASSES = ["type_inference", "allocation_strategy", "lowering", "stack_optimization"]
ALLOWED = {"autobatch.ir", "autobatch.errors", "memopt.liveness"}


def project_imports(path):
    """Every ``autobatch.*``/``memopt.*`` module ``path`` imports, anywhere."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            names = [n for n in names if n.count(".") <= node.module.count(".") + 1]
            # "from autobatch import x" imports autobatch.x when x is a module
            names = [node.module] if node.module not in ("autobatch", "memopt") else names[1:]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in ("autobatch", "memopt"))
    return found


@pytest.mark.parametrize("name", PASSES)
def test_a_pass_imports_only_the_ir(name):
    path = pathlib.Path(autobatch.__file__).parent / f"{name}.py"
    extra = sorted(project_imports(path) - ALLOWED)
    assert not extra, f"autobatch/{name}.py imports {extra}; passes import only {sorted(ALLOWED)}"


def test_the_checker_sees_an_import_of_another_pass(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from autobatch.allocation_strategy import optimize\n"
                   "import autobatch.instructions\n")
    assert project_imports(bad) == {"autobatch.allocation_strategy", "autobatch.instructions"}
