"""TFP 0.25's ``auto_batching`` API against autobatch's: what is missing, what differs.

Usage::

    python scripts/check_tfp_api.py [--tfp-python .tfp-venv/bin/python]
        [--tfp-json FILE] [--details]
    python scripts/check_tfp_api.py --dump FILE     # in TFP's venv

Run in TFP's venv (``make tfp``) with ``--dump``, it writes the public surface
of ``tensorflow_probability.python.experimental.auto_batching`` and of each of
its modules to JSON: every public name a module defines (functions, classes,
constants; not what it imports from elsewhere), with its signature, and for a
class its public methods, properties and attributes (namedtuple fields,
``self.x = ...`` in its methods) with theirs.  Run in autobatch's venv, it
takes that JSON (from ``--tfp-json``, or by running ``--tfp-python`` itself),
reads the same surface of ``autobatch`` and ``autobatch.<module>`` (TFP's
module names), and prints a markdown table per module: TFP's names, those
missing here, and signature mismatches; ``--details`` lists each.

A signature matches when TFP-style calls bind the same way: each of TFP's
positional parameters is at the same position here under the same name
(or a ``*args`` takes it), each of its keyword names is accepted, what is
optional there is optional here with the same default (where both defaults
are plain literals), and every extra parameter here is optional.  A callable
that takes TFP's argument list beside its own (dispatching on the arguments)
declares TFP's as ``__tfp_signature__``, which is compared instead.  A bare
``(*args, **kwargs)`` with no such declaration is counted as *unchecked*.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TFP_PACKAGE = "tensorflow_probability.python.experimental.auto_batching"
#: TFP's modules, in its ``__init__``'s order; "" is the package itself.
MODULES = ["", "allocation_strategy", "dsl", "frontend", "instructions", "liveness",
           "lowering", "numpy_backend", "stack_optimization", "stackless", "tf_backend",
           "type_inference", "virtual_machine", "xla"]
LITERALS = (type(None), bool, int, float, str)


# -- reading a surface (both venvs) --------------------------------------------------

def _params(obj: Any) -> Optional[List[list]]:
    """``[name, kind, has_default, default repr or None]`` per parameter of
    ``obj`` (its ``__tfp_signature__`` when it declares one); None when it
    has no signature Python can read."""
    sig = getattr(obj, "__tfp_signature__", None)
    if sig is None:
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            return None
    out = []
    for p in sig.parameters.values():
        has = p.default is not inspect.Parameter.empty
        literal = has and isinstance(p.default, LITERALS)
        out.append([p.name, p.kind.name, has, repr(p.default) if literal else None])
    return out


def _self_attributes(cls: type) -> List[str]:
    """Public names a class's own methods assign as ``self.<name> = ...``."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return []
    found = set()
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                    and target.value.id == "self" and not target.attr.startswith("_"):
                found.add(target.attr)
    return sorted(found)


def _members(cls: type, package: str, inherited: bool) -> Dict[str, dict]:
    """The public members of ``cls`` defined by it or its bases in ``package``
    (with ``inherited``, by any base: ``Enum``'s ``name``...): methods with
    their parameters (no ``self``), properties, attributes."""
    members: Dict[str, dict] = {}
    for klass in reversed(cls.__mro__):
        if not inherited and not (getattr(klass, "__module__", "") or "").startswith(package):
            continue
        for field in getattr(klass, "_fields", ()) or ():   # namedtuple fields
            members[field] = {"kind": "attribute"}
        for field in getattr(klass, "__dataclass_fields__", {}) or {}:
            if not field.startswith("_"):
                members[field] = {"kind": "attribute"}
        for name in _self_attributes(klass):
            members.setdefault(name, {"kind": "attribute"})
        for name, value in vars(klass).items():
            if name.startswith("_") and name not in ("__init__", "__str__", "__call__"):
                continue
            if name == "__init__":
                continue
            if isinstance(value, property):
                members[name] = {"kind": "property"}
            elif isinstance(value, staticmethod):
                members[name] = {"kind": "staticmethod", "params": _params(value.__func__)}
            elif isinstance(value, classmethod):
                params = _params(value.__func__)
                members[name] = {"kind": "classmethod",
                                 "params": params[1:] if params else params}
            elif inspect.isfunction(value) or hasattr(value, "__tfp_signature__"):
                params = _params(value)
                if params and not hasattr(value, "__tfp_signature__"):
                    params = params[1:]          # self
                members[name] = {"kind": "method", "params": params}
            elif not callable(value) and not isinstance(value, (types.ModuleType, type)):
                members[name] = {"kind": "attribute"}
    return members


def surface(module: types.ModuleType, package: str, inherited: bool = False) -> Dict[str, dict]:
    """``{name: description}`` of the public names ``module`` defines (a
    class, function or constant whose ``__module__`` is in ``package``, or a
    plain constant; the package's submodules as ``{"kind": "module"}``).
    ``inherited``: a class's members include those of bases outside
    ``package`` (for the side that must *have* the names)."""
    out: Dict[str, dict] = {}
    names = getattr(module, "__all__", None) or []
    names = sorted(set(names) | {n for n in dir(module) if not n.startswith("_")})
    for name in names:
        try:
            value = getattr(module, name)
        except AttributeError:
            continue
        if isinstance(value, types.ModuleType):
            # A submodule is part of the package's surface; a module's own
            # imports of its siblings (``inst``, ``liveness``) are not.
            if module.__name__ == package and value.__name__.startswith(package + "."):
                out[name] = {"kind": "module"}
            continue
        owner = getattr(value, "__module__", None)
        if inspect.isclass(value) or inspect.isfunction(value):
            if not (owner or "").startswith(package):
                continue
            if inspect.isclass(value):
                out[name] = {"kind": "class", "params": _params(value),
                             "members": _members(value, package, inherited)}
            else:
                out[name] = {"kind": "function", "params": _params(value)}
        elif isinstance(value, LITERALS) or (owner or "").startswith(package) or \
                type(value).__module__.startswith(package):
            out[name] = {"kind": "constant"}
    return out


def dump_tfp() -> dict:
    """TFP's surface, ``{module: surface}`` (run in TFP's venv)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    out = {}
    for name in MODULES:
        module = importlib.import_module(TFP_PACKAGE + ("." + name if name else ""))
        out[name] = surface(module, TFP_PACKAGE)
    return out


def read_ours() -> dict:
    """autobatch's surface under TFP's module names (a module autobatch
    lacks maps to None)."""
    sys.path.insert(0, ROOT)
    out: Dict[str, Optional[dict]] = {}
    for name in MODULES:
        try:
            module = importlib.import_module("autobatch" + ("." + name if name else ""))
        except ModuleNotFoundError as error:
            if error.name and error.name.startswith("autobatch"):
                out[name] = None
                continue
            raise
        out[name] = surface(module, "autobatch", inherited=True)
    return out


# -- comparing ----------------------------------------------------------------------

POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")


def signature_problems(theirs: Optional[list], ours: Optional[list]) -> List[str]:
    """Why TFP-style calls of a callable with parameters ``theirs`` would not
    bind the same way to one with ``ours`` (empty: they would).  The
    string ``"unchecked"`` alone when ours is a bare ``(*args, **kwargs)``."""
    if theirs is None or ours is None:
        return []
    kinds = [p[1] for p in ours]
    if kinds == ["VAR_POSITIONAL", "VAR_KEYWORD"] and [p[1] for p in theirs] != kinds:
        return ["unchecked"]
    problems = []
    ours_by_name = {p[0]: p for p in ours}
    ours_positional = [p for p in ours if p[1] in POSITIONAL]
    var_positional = any(p[1] == "VAR_POSITIONAL" for p in ours)
    var_keyword = any(p[1] == "VAR_KEYWORD" for p in ours)
    for i, (name, kind, has_default, default) in enumerate(theirs):
        if kind == "VAR_POSITIONAL":
            if not var_positional:
                problems.append(f"*{name} not accepted")
            continue
        if kind == "VAR_KEYWORD":
            if not var_keyword:
                problems.append(f"**{name} not accepted")
            continue
        if kind in POSITIONAL:
            if i < len(ours_positional):
                if ours_positional[i][0] != name and kind != "POSITIONAL_ONLY":
                    problems.append(f"position {i}: {name!r} here is {ours_positional[i][0]!r}")
            elif not var_positional:
                problems.append(f"position {i} ({name!r}) not accepted by position")
        mine = ours_by_name.get(name)
        if mine is None:
            if not var_keyword and kind != "POSITIONAL_ONLY" and not (
                    kind in POSITIONAL and i < len(ours_positional)):
                problems.append(f"keyword {name!r} not accepted")
            continue
        if has_default and not mine[2]:
            problems.append(f"{name!r} optional in TFP, required here")
        if has_default and mine[2] and default is not None and mine[3] is not None \
                and default != mine[3]:
            problems.append(f"{name!r} defaults to {default} in TFP, {mine[3]} here")
    names = {p[0] for p in theirs}
    for name, kind, has_default, _ in ours:
        if kind in POSITIONAL + ("KEYWORD_ONLY",) and not has_default and name not in names:
            index = [p[0] for p in ours_positional].index(name) if kind in POSITIONAL else -1
            if not (0 <= index < len([p for p in theirs if p[1] in POSITIONAL])):
                problems.append(f"{name!r} required here, absent in TFP")
    return problems


def compare(tfp: dict, ours: dict) -> Dict[str, dict]:
    """Per module: TFP's names, the missing ones, the signature mismatches
    and the unchecked signatures, each a list of ``"name: why"``."""
    report = {}
    for module in MODULES:
        theirs = tfp.get(module, {})
        mine = ours.get(module)
        row = {"names": 0, "missing": [], "mismatch": [], "unchecked": []}
        for name, desc in sorted(theirs.items()):
            items = [(name, desc, (mine or {}).get(name))]
            if desc["kind"] == "class":
                other = (mine or {}).get(name) or {}
                for member, mdesc in sorted(desc.get("members", {}).items()):
                    items.append((f"{name}.{member}", mdesc,
                                  (other.get("members") or {}).get(member)
                                  if other.get("kind") == "class" else None))
            for label, want, have in items:
                row["names"] += 1
                if have is None:
                    row["missing"].append(label if mine is not None
                                          else f"{label} (no module autobatch.{module})")
                    continue
                problems = signature_problems(want.get("params"), have.get("params"))
                if problems == ["unchecked"]:
                    row["unchecked"].append(label)
                elif problems:
                    row["mismatch"].append(f"{label}: {'; '.join(problems)}")
        report[module] = row
    return report


def print_report(report: Dict[str, dict], details: bool) -> None:
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))  # the shared table writer
    from _bench import Table

    table = Table(["module", "TFP names (incl. members)", "missing", "signature mismatch",
                   "unchecked"], "lrrrr")
    totals = [0, 0, 0, 0]
    for module, row in report.items():
        counts = [row["names"], len(row["missing"]), len(row["mismatch"]),
                  len(row["unchecked"])]
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
        table.row(module or "(package)", *counts)
    table.row("total", *totals)
    if details:
        for module, row in report.items():
            for key in ("missing", "mismatch", "unchecked"):
                for item in row[key]:
                    print(f"{module or '(package)'}\t{key}\t{item}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", metavar="FILE", help="write TFP's surface (TFP's venv)")
    parser.add_argument("--tfp-json", metavar="FILE", help="TFP's surface, from --dump")
    parser.add_argument("--tfp-python", default=os.path.join(ROOT, ".tfp-venv", "bin", "python"))
    parser.add_argument("--details", action="store_true", help="list every gap")
    args = parser.parse_args()
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump(dump_tfp(), f, indent=1, sort_keys=True)
        return
    if args.tfp_json:
        with open(args.tfp_json) as f:
            tfp = json.load(f)
    else:
        if not os.path.exists(args.tfp_python):
            sys.exit(f"no TFP venv at {args.tfp_python}: run `make tfp`, or pass "
                     f"--tfp-python or --tfp-json")
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "tfp_api.json")
            subprocess.run([args.tfp_python, __file__, "--dump", path], check=True,
                           capture_output=True, text=True)
            with open(path) as f:
                tfp = json.load(f)
    print_report(compare(tfp, read_ours()), args.details)


if __name__ == "__main__":
    main()
