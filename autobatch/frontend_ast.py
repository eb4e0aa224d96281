"""Python source to autobatch IR: the translator behind ``@ctx.batch``.

:func:`parse_function` reads a function's source (:mod:`inspect`) into an
``ast.FunctionDef`` whose line numbers are those of the source file;
:class:`FunctionTranslator` writes it into a
:class:`~autobatch.dsl.ProgramBuilder` as one IR function.

The accepted subset
-------------------
Statements: ``x = e``, ``a, (b, c) = e`` (destructuring), ``a = b = e``,
``x += e`` (any augmented operator), ``x: T = e``, ``return e`` and ``return
a, b`` (tuples), ``if``/``elif``/``else``, ``while`` (a real loop, with
``break`` and ``continue``), ``for i in range(...)`` (1 to 3 arguments; a real
loop counting in a hidden variable, so assigning ``i`` in the body does not
change the iteration), ``pass``, a docstring, and a call of a batched function
whose value is dropped.

Expressions: anything Python computes on the batched values (a *primop*:
arithmetic, comparisons, calls of ordinary functions such as ``np.sqrt``,
indexing, attributes), plus calls of the functions batched in the same
Context, by name, with positional or keyword arguments (recursion and
mutual recursion need no declarations).  ``and``, ``or``, ``not``, ``a if c
else b`` and chained comparisons act per thread (see
:mod:`autobatch.frontend_ops`); where one side calls a batched function they
become branches, so the call is made only by the threads that need it (as
Python's short-circuit would).  Everything else is rejected with a
:class:`FrontendError` naming the function, the line and the construct.

Variables: a name assigned anywhere in the function is one of its variables
(Python's rule); other names are looked up, at run time, among the
function's globals, its closure (as it was at translation time) and the
builtins.  A variable read where it may not have been assigned (assigned in
one branch only, or inside a loop that may not run) is an error; one assigned
in one branch and not read afterwards is fine.

Primop code sees batched values: each has a leading batch dimension (one row
per thread), so per-thread indexing is ``x[..., i]`` and reductions take
``axis=-1``.  A primop must act on each thread independently.
"""
from __future__ import annotations

import ast
import copy
import inspect
import textwrap
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from autobatch import frontend_ops
from autobatch.dsl import ProgramBuilder
from autobatch.errors import ProgramError

__all__ = ["FrontendError", "ParsedFunction", "parse_function", "closure_values",
           "FunctionTranslator"]


class FrontendError(ProgramError):
    """A batched function uses Python the frontend does not accept (or
    misuses a batched function).

    Attributes
    ----------
    function : the batched function's name.
    line : the line of the source file where the construct is.
    construct : what was found (``"a try statement"``).
    """

    def __init__(self, function: str, line: Optional[int], construct: str, hint: str) -> None:
        self.function = function
        self.line = line
        self.construct = construct
        where = f"function {function!r}" + (f", line {line}" if line else "")
        super().__init__(f"{where}: {construct} {hint}")


# Names the primop code uses for the helpers of frontend_ops (parameters of
# the factory that makes each primop function, so they never clash with the
# user's globals).
_HELPERS = {
    "__ab_truth": frontend_ops.truth,
    "__ab_not": frontend_ops.logical_not,
    "__ab_and": frontend_ops.logical_and,
    "__ab_or": frontend_ops.logical_or,
    "__ab_select": frontend_ops.select,
    "__ab_range": frontend_ops.range_continues,
}

#: Statements the frontend rejects: (what it is, what to do).
_REJECTED_STATEMENTS = {
    "FunctionDef": ("a nested function definition (def)",
                    "is not supported; define it at module level, and decorate it with "
                    "the same Context if it must be batched too"),
    "AsyncFunctionDef": ("an async function definition", "is not supported"),
    "ClassDef": ("a class definition", "is not supported; define the class at module "
                 "level"),
    "Delete": ("a del statement", "is not supported; stop using the variable instead"),
    "With": ("a with statement", "is not supported in batched code; move it out of the "
             "batched function"),
    "AsyncWith": ("an async with statement", "is not supported"),
    "AsyncFor": ("an async for loop", "is not supported"),
    "Raise": ("a raise statement", "is not supported: threads cannot raise one by one; "
              "return a flag (or a NaN) instead"),
    "Try": ("a try statement", "is not supported in batched code; handle errors outside "
            "the batched function"),
    "TryStar": ("a try statement", "is not supported in batched code"),
    "Assert": ("an assert statement", "is not supported: threads cannot fail one by one; "
               "check the inputs before the batched call"),
    "Import": ("an import statement", "is not supported here; import at module level"),
    "ImportFrom": ("an import statement", "is not supported here; import at module level"),
    "Global": ("a global declaration", "is not supported: batched functions cannot assign "
               "globals; return the value instead"),
    "Nonlocal": ("a nonlocal declaration", "is not supported: batched functions cannot "
                 "assign outer variables; return the value instead"),
    "Match": ("a match statement", "is not supported; use if/elif/else"),
}

_REJECTED_EXPRESSIONS = {
    "ListComp": ("a list comprehension", "is not supported in batched code (it would "
                 "iterate over the batch); use array operations"),
    "SetComp": ("a set comprehension", "is not supported in batched code"),
    "DictComp": ("a dict comprehension", "is not supported in batched code"),
    "GeneratorExp": ("a generator expression", "is not supported in batched code (it would "
                     "iterate over the batch); use array operations"),
    "NamedExpr": ("an assignment expression (:=)", "is not supported; assign in a separate "
                  "statement"),
    "Yield": ("yield", "is not supported: batched functions cannot be generators"),
    "YieldFrom": ("yield from", "is not supported: batched functions cannot be generators"),
    "Await": ("await", "is not supported in batched code"),
}


# -- parsing ----------------------------------------------------------------------------

@dataclass
class ParsedFunction:
    """A function's source as an AST, line numbers as in its file.

    ``params`` are its parameter names; ``closure`` the values of its free
    variables at parse time (empty cells left out).
    """

    name: str
    python: Callable
    tree: ast.FunctionDef
    filename: str
    params: Tuple[str, ...]
    closure: Dict[str, Any]


def _reject_signature(name: str, line: int, what: str) -> FrontendError:
    return FrontendError(name, line, what, "is not supported; batched functions take plain "
                         "positional parameters (each a batched value)")


def parse_function(function: Callable) -> ParsedFunction:
    """Read and parse ``function``'s source.

    Raises
    ------
    FrontendError : not a plain ``def`` function, source unavailable, or a
        signature with defaults, ``*args``, ``**kwargs`` or keyword-only
        parameters.
    """
    if isinstance(function, types.MethodType) or not isinstance(function, types.FunctionType):
        raise FrontendError(getattr(function, "__name__", repr(function)), None,
                            f"{type(function).__name__} object",
                            "cannot be batched; pass a plain function defined with def")
    name = function.__name__
    code = function.__code__
    if name == "<lambda>":
        raise FrontendError(name, code.co_firstlineno, "a lambda",
                            "cannot be batched: batched functions call each other by "
                            "name; define it with def")
    try:
        lines, first = inspect.getsourcelines(function)
    except (OSError, TypeError) as exc:
        raise FrontendError(name, code.co_firstlineno, "a function without source code",
                            "cannot be batched: the frontend reads the source; define the "
                            "function in a file (not in a REPL or exec)") from exc
    source = textwrap.dedent("".join(lines))
    module = ast.parse(source)
    ast.increment_lineno(module, first - 1)
    tree = module.body[0]
    if isinstance(tree, ast.AsyncFunctionDef):
        raise FrontendError(name, tree.lineno, "an async function", "cannot be batched")
    if not isinstance(tree, ast.FunctionDef) or tree.name != name:
        raise FrontendError(name, first, "a function whose source could not be matched",
                            "cannot be batched; define it with a plain def statement")
    args = tree.args
    if args.vararg or args.kwarg:
        raise _reject_signature(name, tree.lineno, "*args or **kwargs")
    if args.kwonlyargs:
        raise _reject_signature(name, tree.lineno, "a keyword-only parameter")
    if args.defaults:
        raise _reject_signature(name, tree.lineno, "a default parameter value")
    params = tuple(a.arg for a in args.posonlyargs + args.args)
    return ParsedFunction(name, function, tree, code.co_filename, params,
                          closure_values(function))


def closure_values(function: Callable) -> Dict[str, Any]:
    """The values of ``function``'s free variables now (empty cells, not yet
    assigned, are left out)."""
    closure = {}
    for var, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        try:
            closure[var] = cell.cell_contents
        except ValueError:
            pass
    return closure


# -- scopes ----------------------------------------------------------------------------

def _names_read(node: ast.AST) -> List[str]:
    """Names loaded in ``node`` (in order, once each), not counting names a
    lambda inside binds."""
    out: Dict[str, None] = {}

    def walk(n: ast.AST, bound: frozenset) -> None:
        if isinstance(n, ast.Lambda):
            args = n.args
            inner = bound | {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
            inner |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
            for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
                walk(default, bound)
            walk(n.body, inner)
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in bound:
            out[n.id] = None
        for child in ast.iter_child_nodes(n):
            walk(child, bound)

    walk(node, frozenset())
    return list(out)


def _stored_names(body: Sequence[ast.stmt]) -> Set[str]:
    """Names the statements bind (Python's local variables), outside lambdas
    and comprehensions (their own scopes)."""
    found: Set[str] = set()

    def walk(n: ast.AST) -> None:
        if isinstance(n, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                          ast.GeneratorExp)):
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            found.add(n.id)
        for child in ast.iter_child_nodes(n):
            walk(child)

    for stmt in body:
        walk(stmt)
    return found


def _int_literal(node: ast.expr) -> Optional[int]:
    """The value of an integer literal (``3``, ``-1``), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _int_literal(node.operand)
        if inner is None:
            return None
        return -inner if isinstance(node.op, ast.USub) else inner
    if (isinstance(node, ast.Constant) and isinstance(node.value, int)
            and not isinstance(node.value, bool)):
        return node.value
    return None


def _load(name: str, like: ast.AST) -> ast.Name:
    return ast.copy_location(ast.Name(id=name, ctx=ast.Load()), like)


def _helper_call(helper: str, args: List[ast.expr], like: ast.AST) -> ast.Call:
    return ast.copy_location(ast.Call(func=_load(helper, like), args=args, keywords=[]), like)


# -- definite assignment ------------------------------------------------------------------

class _DefiniteAssignment:
    """Reject a read of a variable that may not be assigned on some path to it.

    Forward "must be assigned" analysis over the statements; ``None`` stands
    for an unreachable point (after return/break/continue).
    """

    def __init__(self, fn: ParsedFunction, variables: Set[str]) -> None:
        self.fn = fn
        self.variables = variables
        self.breaks: List[List[frozenset]] = []

    def check_reads(self, node: ast.AST, assigned: frozenset, line_of: ast.AST) -> None:
        for name in _names_read(node):
            if name in self.variables and name not in assigned:
                raise FrontendError(
                    self.fn.name, getattr(line_of, "lineno", None),
                    f"variable {name!r} may be used before it is assigned",
                    "(it is assigned on some paths only: in one branch of an if, or in a "
                    "loop that may not run); assign it on every path before this use")

    @staticmethod
    def meet(a: Optional[frozenset], b: Optional[frozenset]) -> Optional[frozenset]:
        if a is None:
            return b
        if b is None:
            return a
        return a & b

    def block(self, body: Sequence[ast.stmt], assigned: Optional[frozenset]
              ) -> Optional[frozenset]:
        for stmt in body:
            if assigned is None:
                return None  # unreachable code: not checked
            assigned = self.stmt(stmt, assigned)
        return assigned

    def stmt(self, node: ast.stmt, assigned: frozenset) -> Optional[frozenset]:
        if isinstance(node, ast.Assign):
            self.check_reads(node.value, assigned, node)
            for target in node.targets:
                self.check_reads(target, assigned, node)  # reads inside x[i] = ...
            return assigned | _stored_names([node])
        if isinstance(node, ast.AugAssign):
            self.check_reads(node.value, assigned, node)
            if isinstance(node.target, ast.Name):
                self.check_reads(_load(node.target.id, node), assigned, node)
            return assigned | _stored_names([node])
        if isinstance(node, ast.AnnAssign):
            if node.value is None:
                return assigned
            self.check_reads(node.value, assigned, node)
            return assigned | _stored_names([node])
        if isinstance(node, ast.Return):
            if node.value is not None:
                self.check_reads(node.value, assigned, node)
            return None
        if isinstance(node, ast.If):
            self.check_reads(node.test, assigned, node)
            return self.meet(self.block(node.body, assigned), self.block(node.orelse, assigned))
        if isinstance(node, (ast.While, ast.For)):
            if isinstance(node, ast.While):
                self.check_reads(node.test, assigned, node)
                inner = assigned
                runs_forever = isinstance(node.test, ast.Constant) and bool(node.test.value)
            else:
                self.check_reads(node.iter, assigned, node)
                inner = assigned | _stored_names([ast.Assign(targets=[node.target],
                                                             value=ast.Constant(0))])
                runs_forever = False
            self.breaks.append([])
            self.block(node.body, inner)
            breaks = self.breaks.pop()
            after: Optional[frozenset] = None if runs_forever else assigned
            for state in breaks:
                after = self.meet(after, state)
            return after
        if isinstance(node, ast.Break):
            if self.breaks:
                self.breaks[-1].append(assigned)
            return None
        if isinstance(node, ast.Continue):
            return None
        if isinstance(node, ast.Expr):
            self.check_reads(node.value, assigned, node)
            return assigned
        return assigned


# -- translation -----------------------------------------------------------------------------

class _Lifter(ast.NodeTransformer):
    """Rewrites an expression into a *pure* one (no batched calls, no branches):
    calls of batched functions, and ``and``/``or``/``if-else`` around them,
    are emitted as code first and replaced by the variables holding their
    values."""

    def __init__(self, translator: "FunctionTranslator") -> None:
        self.t = translator

    def visit_Call(self, node: ast.Call) -> ast.expr:
        if self.t.is_batched_call(node):
            return _load(self.t.emit_call(node), node)
        return self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        if not self.t.has_batched_call(node):
            return self.generic_visit(node)
        return _load(self.t.emit_short_circuit(node), node)

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        if not self.t.has_batched_call(node):
            return self.generic_visit(node)
        return _load(self.t.emit_conditional(node), node)

    def visit_Lambda(self, node: ast.Lambda) -> ast.expr:
        if self.t.has_batched_call(node):
            self.t.error(node, "a call of a batched function inside a lambda",
                         "is not supported; call it in the batched function's body")
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        for op in node.ops:
            if isinstance(op, (ast.Is, ast.IsNot)):
                self.t.error(node, "an identity test (is / is not)",
                             "is not supported on batched values; compare with == or !=")
            if isinstance(op, (ast.In, ast.NotIn)):
                self.t.error(node, "a membership test (in / not in)",
                             "is not supported on batched values; compare with == and "
                             "combine with |, or use np.isin")
        return self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        rejected = _REJECTED_EXPRESSIONS.get(type(node).__name__)
        if rejected is not None:
            self.t.error(node, *rejected)
        return super().generic_visit(node)


class _BooleanRewriter(ast.NodeTransformer):
    """``and``/``or``/``not``/``if-else``/chained comparisons of a pure
    expression as calls of the per-thread helpers (user lambdas untouched)."""

    def visit_Lambda(self, node: ast.Lambda) -> ast.expr:
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        self.generic_visit(node)
        helper = "__ab_and" if isinstance(node.op, ast.And) else "__ab_or"
        expr = node.values[0]
        for value in node.values[1:]:
            expr = _helper_call(helper, [expr, value], node)
        return expr

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return _helper_call("__ab_not", [node.operand], node)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        self.generic_visit(node)
        return _helper_call("__ab_select", [node.test, node.body, node.orelse], node)

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if len(node.ops) == 1:
            return node
        left = node.left
        expr: Optional[ast.expr] = None
        for op, right in zip(node.ops, node.comparators):
            pair = ast.copy_location(ast.Compare(left=left, ops=[op], comparators=[right]),
                                     node)
            expr = pair if expr is None else _helper_call("__ab_and", [expr, pair], node)
            left = right
        return expr


class FunctionTranslator:
    """Writes one parsed function into a ProgramBuilder (see the module doc).

    Parameters
    ----------
    fn : the parsed function.
    builder : receives the IR function.
    signatures : the parameter names of every function batched in the same
        Context, by name (calls of these become calls in the IR).
    type_inference : passed on to the IR function.
    """

    def __init__(self, fn: ParsedFunction, builder: ProgramBuilder,
                 signatures: Dict[str, Tuple[str, ...]],
                 type_inference: Optional[Callable] = None) -> None:
        self.fn = fn
        self.ab = builder
        self.signatures = signatures
        self.type_inference = type_inference
        body = fn.tree.body
        self.variables: Set[str] = set(fn.params) | _stored_names(body)
        identifiers = {n.id for n in ast.walk(fn.tree) if isinstance(n, ast.Name)}
        identifiers |= set(fn.params)
        prefix = "_ab"
        while any(name.startswith(prefix) for name in identifiers):
            prefix += "_"
        self.prefix = prefix
        self.count = 0

    # -- entry ----------------------------------------------------------------------------
    def translate(self) -> None:
        """Add the function to the builder (raises FrontendError)."""
        fn = self.fn
        body = list(fn.tree.body)
        if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            body = body[1:]  # the docstring
        finished = False
        try:
            with self.ab.function(fn.name, self.type_inference, params=fn.params):
                self.block(body)
                finished = True
        except ProgramError as exc:
            if isinstance(exc, FrontendError) or not finished:
                raise
            last = fn.tree.body[-1]
            raise FrontendError(
                fn.name, getattr(last, "end_lineno", last.lineno),
                "the end of the function can be reached without a return",
                "(Python would return None); return a value on every path") from exc
        _DefiniteAssignment(fn, self.variables).block(body, frozenset(fn.params))

    # -- helpers ----------------------------------------------------------------------------
    def error(self, node: ast.AST, construct: str, hint: str) -> None:
        raise FrontendError(self.fn.name, getattr(node, "lineno", None), construct, hint)

    def temp(self) -> str:
        self.count += 1
        return f"{self.prefix}{self.count}"

    def is_batched_call(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in self.signatures and node.func.id not in self.variables)

    def has_batched_call(self, node: ast.AST) -> bool:
        return any(self.is_batched_call(n) for n in ast.walk(node))

    def is_variable(self, name: str) -> bool:
        return name in self.variables or name.startswith(self.prefix)

    # -- expressions -------------------------------------------------------------------------
    def lift(self, node: ast.expr) -> ast.expr:
        """A pure copy of ``node``; batched calls in it are emitted first."""
        return _Lifter(self).visit(copy.deepcopy(node))

    def make_function(self, pure: ast.expr, text: Optional[str] = None
                      ) -> Tuple[Callable, Tuple[str, ...], str]:
        """Compile a pure expression into ``(function, variables read, text)``;
        the function takes the variables' values as arguments.  ``text``
        describes it (default: its source)."""
        reads = tuple(n for n in _names_read(pure) if self.is_variable(n))
        text = ast.unparse(pure) if text is None else text
        body = _BooleanRewriter().visit(copy.deepcopy(pure))
        free = [n for n in _names_read(body) if not self.is_variable(n)]
        outer = {n: self.fn.closure[n] for n in free if n in self.fn.closure}
        outer.update({n: _HELPERS[n] for n in free if n in _HELPERS})
        arguments = ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in reads],
                                  kwonlyargs=[], kw_defaults=[], defaults=[])
        lam = ast.copy_location(ast.Lambda(args=arguments, body=body), pure)
        factory = ast.FunctionDef(
            name="__ab_factory",
            args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in outer],
                               kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=[ast.copy_location(ast.Return(value=lam), pure)], decorator_list=[],
            returns=None)
        if "type_params" in ast.FunctionDef._fields:  # Python 3.12+
            factory.type_params = []
        ast.copy_location(factory, pure)
        module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
        namespace: Dict[str, Any] = {}
        exec(compile(module, self.fn.filename, "exec"), self.fn.python.__globals__, namespace)
        function = namespace["__ab_factory"](*outer.values())
        function.__name__ = text  # what autobatch prints for the primop
        function.__qualname__ = f"{self.fn.name}.<{text}>"
        return function, reads, text

    def emit_primop(self, pure: ast.expr, out: Any, text: Optional[str] = None) -> None:
        function, reads, text = self.make_function(pure, text)
        line = getattr(pure, "lineno", None)
        self.ab.primop(function, out, vars_in=reads,
                       name=f"{text}  (line {line})" if line else text)

    def emit_value(self, node: ast.expr, out: Any) -> None:
        """Emit code that binds ``node``'s value to the pattern ``out``."""
        if self.is_batched_call(node):
            self.emit_call(node, out)
        else:
            self.emit_primop(self.lift(node), out)

    def to_var(self, node: ast.expr) -> str:
        """A variable holding ``node``'s value (the variable itself for a name)."""
        if isinstance(node, ast.Name) and self.is_variable(node.id):
            return node.id
        if self.is_batched_call(node):
            return self.emit_call(node)
        pure = self.lift(node)
        if isinstance(pure, ast.Name) and self.is_variable(pure.id):
            return pure.id
        var = self.temp()
        self.emit_primop(pure, var)
        return var

    def to_pattern(self, node: ast.expr) -> Any:
        """A pattern of variables holding ``node``'s value; tuple displays
        become tuple patterns."""
        if isinstance(node, (ast.Tuple, ast.List)) and not any(
                isinstance(e, ast.Starred) for e in node.elts):
            return tuple(self.to_pattern(e) for e in node.elts)
        return self.to_var(node)

    def condition(self, test: ast.expr) -> Tuple[ast.expr, str]:
        """A pure expression of ``test``'s truth per thread (comparisons and
        ``not`` are boolean already; anything else goes through ``truth``),
        and its text."""
        pure = self.lift(test)
        text = ast.unparse(pure)
        if isinstance(pure, ast.Compare) or (isinstance(pure, ast.UnaryOp)
                                             and isinstance(pure.op, ast.Not)):
            return pure, text
        return _helper_call("__ab_truth", [pure], test), f"truth({text})"

    def to_condition(self, test: ast.expr) -> str:
        """A boolean variable: ``test``'s truth per thread."""
        var = self.temp()
        pure, text = self.condition(test)
        self.emit_primop(pure, var, text)
        return var

    def emit_call(self, node: ast.Call, out: Any = None) -> Any:
        """Emit a call of a batched function; returns the output pattern."""
        name = node.func.id
        params = self.signatures[name]
        what = f"call of {name}({', '.join(params)})"
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords):
            self.error(node, f"a {what} with *args or **kwargs",
                       "is not supported; pass each argument by position or by name")
        if len(node.args) > len(params):
            self.error(node, f"a {what} with {len(node.args)} positional arguments",
                       f"does not match: {name} takes {len(params)}")
        given: List[Tuple[str, ast.expr]] = list(zip(params, node.args))
        for keyword in node.keywords:
            if keyword.arg not in params:
                self.error(node, f"a {what} with keyword {keyword.arg!r}",
                           f"does not match: {name} has no parameter {keyword.arg!r}")
            if keyword.arg in dict(given):
                self.error(node, f"a {what} giving {keyword.arg!r} twice",
                           "is an error; give each argument once")
            given.append((keyword.arg, keyword.value))
        missing = [p for p in params if p not in dict(given)]
        if missing:
            self.error(node, f"a {what} without {', '.join(map(repr, missing))}",
                       "is an error; pass every argument")
        values = {param: self.to_var(expr) for param, expr in given}  # source order
        out = self.temp() if out is None else out
        self.ab.call(name, [values[p] for p in params], out)
        return out

    def emit_short_circuit(self, node: ast.BoolOp) -> str:
        """``a and b`` / ``a or b`` where a side calls a batched function: the
        later operands run only for the threads Python would run them for."""
        result = self.temp()
        self.emit_value(node.values[0], result)
        for value in node.values[1:]:
            cond = self.to_condition(_load(result, node))
            if isinstance(node.op, ast.And):
                with self.ab.if_(cond):
                    self.emit_value(value, result)
            else:
                with self.ab.if_(cond):
                    pass
                with self.ab.else_():
                    self.emit_value(value, result)
        return result

    def emit_conditional(self, node: ast.IfExp) -> str:
        """``a if c else b`` where a side calls a batched function: a branch."""
        result = self.temp()
        cond = self.to_condition(node.test)
        with self.ab.if_(cond):
            self.emit_value(node.body, result)
        with self.ab.else_():
            self.emit_value(node.orelse, result)
        return result

    # -- statements ------------------------------------------------------------------------------
    def block(self, body: Sequence[ast.stmt]) -> None:
        for stmt in body:
            handler = getattr(self, f"stmt_{type(stmt).__name__}", None)
            if handler is None:
                construct, hint = _REJECTED_STATEMENTS.get(
                    type(stmt).__name__, (f"a {type(stmt).__name__} statement",
                                          "is not supported in batched code"))
                self.error(stmt, construct, hint)
            handler(stmt)

    def target(self, node: ast.expr) -> Any:
        """The pattern of variables an assignment target binds."""
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    self.error(node, "a starred assignment target (*rest)",
                               "is not supported; unpack every part by name")
            return tuple(self.target(e) for e in node.elts)
        if isinstance(node, ast.Subscript):
            self.error(node, f"an assignment to an element ({ast.unparse(node)} = ...)",
                       "is not supported: batched values cannot be changed in place; "
                       "compute a new array (np.where, tf.tensor_scatter_nd_update) and "
                       "assign it to the variable")
        if isinstance(node, ast.Attribute):
            self.error(node, f"an assignment to an attribute ({ast.unparse(node)} = ...)",
                       "is not supported; assign to a variable")
        self.error(node, f"an assignment to {ast.unparse(node)}", "is not supported")

    def copy_pattern(self, source: Any, target: Any, like: ast.AST) -> None:
        """``target = source`` for two patterns of variables."""
        def display(p: Any) -> ast.expr:
            if isinstance(p, tuple):
                return ast.copy_location(ast.Tuple(elts=[display(e) for e in p],
                                                   ctx=ast.Load()), like)
            return _load(p, like)
        self.emit_primop(display(source), target)

    def stmt_Assign(self, node: ast.Assign) -> None:
        targets = [self.target(t) for t in node.targets]
        self.emit_value(node.value, targets[0])
        for target in targets[1:]:
            self.copy_pattern(targets[0], target, node)

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        if not isinstance(node.target, ast.Name):
            self.target(node.target)  # raises with the right message
        name = node.target.id
        value = ast.copy_location(ast.BinOp(left=_load(name, node), op=node.op,
                                            right=node.value), node)
        self.emit_value(value, name)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        target = self.target(node.target)
        if node.value is not None:
            self.emit_value(node.value, target)

    def stmt_Return(self, node: ast.Return) -> None:
        if node.value is None:
            self.error(node, "a return without a value",
                       "is not supported: every path of a batched function returns a value")
        if self.is_batched_call(node.value):
            self.ab.return_(self.emit_call(node.value))  # a tail call
        else:
            self.ab.return_(self.to_pattern(node.value))

    def stmt_If(self, node: ast.If) -> None:
        cond = self.to_condition(node.test)
        with self.ab.if_(cond):
            self.block(node.body)
        if node.orelse:
            with self.ab.else_():
                self.block(node.orelse)

    def stmt_While(self, node: ast.While) -> None:
        if node.orelse:
            self.error(node, "a while ... else loop", "is not supported; use a flag variable")
        if isinstance(node.test, ast.Constant) and bool(node.test.value):
            with self.ab.loop():
                self.block(node.body)
        elif not self.has_batched_call(node.test):
            function, reads, _ = self.make_function(*self.condition(node.test))
            with self.ab.while_(function, vars_in=reads):
                self.block(node.body)
        else:
            with self.ab.loop():
                cond = self.to_condition(node.test)
                with self.ab.if_(cond):
                    self.block(node.body)
                with self.ab.else_():
                    self.ab.break_()

    def stmt_For(self, node: ast.For) -> None:
        if node.orelse:
            self.error(node, "a for ... else loop", "is not supported; use a flag variable")
        it = node.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                and it.func.id == "range" and "range" not in self.variables):
            self.error(node, f"a for loop over {ast.unparse(it)}",
                       "is not supported: only `for i in range(...)` is (a loop over a "
                       "batched value would iterate over the batch)")
        if it.keywords or not 1 <= len(it.args) <= 3 or any(
                isinstance(a, ast.Starred) for a in it.args):
            self.error(node, f"a for loop over {ast.unparse(it)}",
                       "is not supported: give range 1 to 3 positional arguments")
        if not isinstance(node.target, ast.Name):
            self.error(node, f"a for loop with target {ast.unparse(node.target)}",
                       "is not supported: range gives one number; use a single name")
        args = list(it.args)
        start, stop, step = ((ast.Constant(0), args[0], ast.Constant(1)) if len(args) == 1 else
                             (args[0], args[1], ast.Constant(1)) if len(args) == 2 else args)
        step_value = _int_literal(step)
        if step_value == 0:
            self.error(node, "range() with a step of 0", "is an error (as in Python)")
        # range's arguments are evaluated once, before the loop, in order.
        start_var = None if _int_literal(start) is not None else self.to_var(start)
        stop_node = stop if _int_literal(stop) is not None else _load(self.to_var(stop), node)
        step_node = step if step_value is not None else _load(self.to_var(step), node)
        counter = self.temp()
        if start_var is not None:
            self.copy_pattern(start_var, counter, node)
        elif isinstance(stop_node, ast.Name):
            # A literal start takes the dtype of the bound: `stop * 0 + start`.
            zero = ast.BinOp(left=stop_node, op=ast.Mult(), right=ast.Constant(0))
            self.emit_primop(ast.copy_location(ast.BinOp(left=zero, op=ast.Add(), right=start),
                                               node), counter)
        else:
            self.emit_primop(ast.copy_location(start, node), counter)
        here = _load(counter, node)
        if step_value is None:
            test: ast.expr = _helper_call("__ab_range", [here, stop_node, step_node], node)
        else:
            op = ast.Lt() if step_value > 0 else ast.Gt()
            test = ast.copy_location(ast.Compare(left=here, ops=[op], comparators=[stop_node]),
                                     node)
        function, reads, _ = self.make_function(test)
        with self.ab.while_(function, vars_in=reads):
            self.copy_pattern(counter, node.target.id, node)
            self.emit_primop(ast.copy_location(
                ast.BinOp(left=here, op=ast.Add(), right=step_node), node), counter)
            self.block(node.body)

    def stmt_Break(self, node: ast.Break) -> None:
        self.ab.break_()

    def stmt_Continue(self, node: ast.Continue) -> None:
        self.ab.continue_()

    def stmt_Pass(self, node: ast.Pass) -> None:
        pass

    def stmt_Expr(self, node: ast.Expr) -> None:
        value = node.value
        if isinstance(value, ast.Constant):
            return  # a string or ... standing alone
        if self.is_batched_call(value):
            self.emit_call(value)
            return
        self.error(node, f"an expression statement ({ast.unparse(value)})",
                   "is not supported: its value is dropped and batched code has no "
                   "side effects; assign it to a variable or remove it")
