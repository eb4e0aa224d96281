"""Saved models in and out: the files the ``memopt`` command reads and writes.

Formats
-------
``.pdmodel``  a legacy Paddle program (a ``ProgramDesc`` protobuf), as
              written by ``paddle.static.save`` (the whole training program)
              or ``paddle.static.save_inference_model`` in the legacy IR.
``.json``     a PIR program, as Paddle 3 writes it (``paddle.static.save``,
              ``save_inference_model``): JSON with ``"base_code": {"magic":
              "pir"}``.
``.csv``      an interval problem (:mod:`memopt.problems`).

A path may also be the prefix Paddle was given (``model`` for
``model.pdmodel`` / ``model.json``).  Only the program is read: parameter
files (``.pdparams``, ``.pdopt``, ``.pdiparams``) hold pickles or raw
tensors, and memopt never unpickles anything nor runs code from a file --
memory analysis needs the program's shapes, not its weights.  Files are
checked in Python first (the protobuf is parsed with Paddle's own
``framework_pb2`` message, the JSON with :mod:`json`), so a truncated or
corrupt file gives a :class:`~memopt.errors.ModelFileError` with a one-line
message instead of a crash inside Paddle.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ..cli_paths import PARAMETER_SUFFIXES
from ..errors import ModelFileError

__all__ = ["LoadedModel", "load_model", "save_program", "output_path", "file_kind",
           "resolve_path", "model_inputs", "dynamic_dims_note"]

LEGACY, PIR, PROBLEM = "legacy", "pir", "problem"
_EXTENSIONS = {".pdmodel": LEGACY, ".json": PIR, ".csv": PROBLEM}
#: The program file of a fluid-style model directory (``save_vars`` /
#: ``save_persistables`` / Paddle 1.x ``save_inference_model``): a legacy
#: ``ProgramDesc`` beside one file per parameter or one combined file.
FLUID_PROGRAM = "__model__"


@dataclass
class LoadedModel:
    """A program read from a file.

    Attributes
    ----------
    path : the file read.
    ir : ``"legacy"`` or ``"pir"``.
    program : the Paddle program (``paddle.base.framework.Program`` or
        ``paddle.pir.Program``).
    """

    path: str
    ir: str
    program: Any


def resolve_path(path: str) -> str:
    """The file ``path`` names: itself, or ``path`` + ``.pdmodel`` / ``.json``
    when it is a prefix.  Raises :class:`ModelFileError` when there is none or
    when it names a parameter file."""
    path = os.fspath(path)
    lower = path.lower()
    for ext in PARAMETER_SUFFIXES:
        if lower.endswith(ext):
            stem = path[: -len(ext)]
            raise ModelFileError(
                f"{path} is a parameter file, which memopt never loads (it may hold "
                f"pickled data); pass the program instead: {stem}.pdmodel or {stem}.json")
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        fluid = os.path.join(path, FLUID_PROGRAM)
        if os.path.isfile(fluid):
            return fluid
        inside = sorted(f for f in os.listdir(path) if f.endswith((".pdmodel", ".json")))
        hint = (": it holds " + ", ".join(os.path.join(path, f) for f in inside[:3])
                + (" ..." if len(inside) > 3 else "")) if inside else ""
        raise ModelFileError(f"{path} is a directory{hint}; pass a .pdmodel or .json file "
                             "(or its prefix, the path given to the save)")
    candidates = [path + ext for ext in (".pdmodel", ".json") if os.path.isfile(path + ext)]
    if len(candidates) == 1:
        return candidates[0]
    if len(candidates) > 1:
        raise ModelFileError(f"{path} is ambiguous: both {candidates[0]} and {candidates[1]} "
                             "exist; name one of them")
    raise ModelFileError(f"no such file: {path}")


def file_kind(path: str) -> str:
    """``"legacy"``, ``"pir"`` or ``"problem"`` from a file's extension.

    Raises :class:`ModelFileError` for anything else.
    """
    if os.path.basename(path) == FLUID_PROGRAM:
        return LEGACY
    ext = os.path.splitext(path)[1].lower()
    if ext not in _EXTENSIONS:
        raise ModelFileError(
            f"{path}: unknown file type {ext or '(no extension)'!r}; expected a .pdmodel "
            "(legacy Paddle program), .json (PIR program) or .csv (interval problem) file")
    return _EXTENSIONS[ext]


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None


def _load_legacy(path: str):
    data = _read_bytes(path)
    if not data:
        raise ModelFileError(f"{path} is empty; expected a legacy Paddle program")
    import paddle  # noqa: F401  (registers the proto and the ops)
    from paddle.base.proto import framework_pb2

    desc = framework_pb2.ProgramDesc()
    try:
        desc.ParseFromString(data)
    except Exception as exc:
        raise ModelFileError(
            f"{path} is not a valid legacy Paddle program ({_first_line(exc)}); is the file "
            "complete?") from None
    if not desc.blocks or not any(block.ops for block in desc.blocks):
        raise ModelFileError(f"{path} holds no program (no blocks or no ops); expected a "
                             ".pdmodel written by paddle.static.save")
    from paddle.base.framework import Program
    from paddle.pir_utils import OldIrGuard

    try:
        with OldIrGuard():
            return Program.parse_from_string(data)
    except Exception as exc:
        raise ModelFileError(f"{path}: Paddle cannot load this program ({_first_line(exc)})") \
            from None


def _load_pir(path: str):
    data = _read_bytes(path)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # a nesting bomb too
        raise ModelFileError(
            f"{path} is not valid JSON ({_first_line(exc)}); is the file complete?") from None
    base = doc.get("base_code") if isinstance(doc, dict) else None
    if not isinstance(base, dict) or base.get("magic") != "pir" or "program" not in doc:
        raise ModelFileError(f"{path} is JSON but not a PIR program (no "
                             "'base_code': {'magic': 'pir'} and 'program'); expected a .json "
                             "written by paddle.static.save in Paddle 3")
    _check_pir_ops(path, doc["program"])
    import paddle
    from paddle.base import core

    paddle.enable_static()
    from paddle.pir_utils import IrGuard

    with IrGuard():
        program = paddle.static.Program()
    try:
        core.deserialize_pir_program(path, program, -1)
    except Exception as exc:
        raise ModelFileError(f"{path}: Paddle cannot load this PIR program "
                             f"({_first_line(exc)})") from None
    ops = list(program.global_block().ops)
    if not ops:
        raise ModelFileError(f"{path} holds an empty PIR program")
    bad = [op.name() for op in ops if "." not in op.name()]
    if bad:
        raise ModelFileError(f"{path}: the PIR program has {len(bad)} op(s) Paddle does not "
                             "know; was it written by another Paddle version?")
    return program


def _check_pir_ops(path: str, program: Any) -> None:
    """Every op in the serialized program has a name and lists of inputs and
    outputs (a structural check before Paddle parses it)."""
    def walk(node: Any, depth: int) -> int:
        if depth > 64:
            raise ModelFileError(f"{path}: the PIR program nests too deeply")
        count = 0
        for region in node.get("regions", []) if isinstance(node, dict) else []:
            for block in region.get("blocks", []) if isinstance(region, dict) else []:
                for op in block.get("ops", []) if isinstance(block, dict) else []:
                    if not (isinstance(op, dict) and isinstance(op.get("#"), str)
                            and isinstance(op.get("I", []), (list, dict))
                            and isinstance(op.get("O", []), (list, dict))):
                        raise ModelFileError(f"{path}: a malformed op in the PIR program; "
                                             "is the file complete?")
                    count += 1 + walk(op, depth + 1)
        return count

    if not isinstance(program, dict) or walk(program, 0) == 0:
        raise ModelFileError(f"{path} holds no ops; expected a PIR program")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def load_model(path: str) -> LoadedModel:
    """Read the program saved at ``path`` (see the module docstring).

    Raises
    ------
    ModelFileError
        Missing, unreadable, truncated or corrupt file, or a file that is
        not a Paddle program (a ``.csv`` problem included: use
        :func:`memopt.problems.read_csv` for those).
    """
    path = resolve_path(path)
    kind = file_kind(path)
    if kind == PROBLEM:
        raise ModelFileError(f"{path} is an interval problem, not a Paddle program; "
                             "use 'memopt plan' or 'memopt plot' with it")
    loaded = LoadedModel(path, LEGACY, _load_legacy(path)) if kind == LEGACY \
        else LoadedModel(path, PIR, _load_pir(path))
    from . import guards

    guards.install()  # a fetch of a name a rewrite took away names it (MergedVariableError)
    return loaded


def model_inputs(loaded: LoadedModel):
    """``[(name, shape)]`` of what the program is fed: PIR ``pd_op.data``
    ops; legacy variables a ``feed`` op writes or marked to be fed (``-1``
    for a dynamic dimension)."""
    block = loaded.program.global_block()
    if loaded.ir == PIR:
        return [(op.attrs()["name"], list(op.result(0).shape)) for op in block.ops
                if op.name() == "pd_op.data"]
    fed = {name for op in block.ops if op.type == "feed" for name in op.output_arg_names}
    return [(v.name, list(v.shape)) for v in loaded.program.list_vars()
            if v.name in fed or v.desc.need_check_feed()]


def dynamic_dims_note(loaded: LoadedModel):
    """A note for inputs with more than one dynamic (``-1``) dimension, or
    None: memopt gives every ``-1`` the batch size, so ``ids`` of shape
    ``[-1, -1]`` is B x B (a sequence as long as the batch)."""
    from ..analysis import dynamic_inputs_text

    many = [(n, s) for n, s in model_inputs(loaded) if sum(1 for d in s if d == -1) > 1]
    return dynamic_inputs_text(many) or None


def output_path(ir: str, path: str) -> str:
    """The file :func:`save_program` writes for ``path`` and a program of
    ``ir``: ``path`` itself when it ends in ``.json`` (PIR) / ``.pdmodel``
    (legacy), else ``path`` + that extension (a prefix such as
    ``model.opt``, as Paddle's savers take).  Raises
    :class:`ModelFileError` for the other IR's extension or a parameter
    file's."""
    ext = ".json" if ir == PIR else ".pdmodel"
    path = os.fspath(path)
    lower = path.lower()
    if lower.endswith(ext):
        return path
    root, given = os.path.splitext(path)
    if given.lower() in (".json", ".pdmodel", ".csv") or lower.endswith(PARAMETER_SUFFIXES):
        kind = "PIR" if ext == ".json" else "legacy"
        raise ModelFileError(f"-o {path}: a {kind} program is written as {ext}; "
                             f"use -o {root}{ext}")
    return path + ext


def save_program(program: Any, path: str, overwrite: bool = True) -> str:
    """Write ``program``: a legacy program as ``.pdmodel`` bytes, a PIR
    program as ``.json``, at :func:`output_path`.  Returns the path written."""
    from .pir.program import is_pir_program

    ext = ".json" if is_pir_program(program) else ".pdmodel"
    out = output_path(PIR if ext == ".json" else LEGACY, path)
    if os.path.exists(out) and not overwrite:
        raise ModelFileError(f"{out} exists; not overwriting it")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        # Paddle's PIR writer would make the directories
        raise ModelFileError(f"cannot write {out}: no directory {os.path.dirname(out)}")
    try:
        if ext == ".json":
            from paddle.base import core

            core.serialize_pir_program(program, out, True, False, True)
        else:
            with open(out, "wb") as f:
                f.write(program.desc.serialize_to_string())
    except OSError as exc:
        raise ModelFileError(f"cannot write {out}: {exc.strerror or exc}") from None
    except RuntimeError as exc:  # Paddle's writer: "Cannot open ... to save variables"
        reason = _first_line(exc).split(") ", 1)[-1]  # without Paddle's "(Unavailable) "
        raise ModelFileError(f"cannot write {out}: {reason}") from None
    return out
