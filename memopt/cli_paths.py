"""The files the ``memopt`` command writes, checked before any work is done.

An output path must name a file in a directory that exists and that this
process can write, and must never be one of the files the command read: a
bad ``-o`` used to show up only after the work (a traceback from Paddle's
writer for ``/proc/o.json``), Paddle's PIR writer silently made missing
directories, and ``memopt optimize model.json -o model.json`` overwrote the
user's model.

:func:`parameter_files` / :func:`copy_parameters`: the parameter files
Paddle wrote beside a program (``.pdiparams`` for ``save_inference_model``
and ``jit.save``, ``.pdparams`` / ``.pdopt`` for ``paddle.static.save``),
copied byte for byte beside the rewritten program so that
``load_inference_model(OUT)``, ``paddle.inference`` and
``paddle.static.load`` find them (memory_optimize keeps every persistable
variable and its name).  They are copied, never parsed.
"""
from __future__ import annotations

import os
import shutil
from typing import Iterable, List, Tuple

from .errors import ModelFileError

__all__ = ["check_output", "parameter_files", "copy_parameters", "PARAMETER_SUFFIXES"]

#: Files Paddle writes beside a program ``<stem>.pdmodel`` / ``<stem>.json``.
PARAMETER_SUFFIXES = (".pdiparams", ".pdiparams.info", ".pdparams", ".pdopt")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def check_output(path: str, inputs: Iterable[str], flag: str = "-o") -> None:
    """Refuse ``path`` as an output (:class:`ModelFileError` naming it and
    the fix) when its directory is missing or not writable, when it is a
    directory, or when it is one of ``inputs`` (the files the command read,
    and the parameter files beside them)."""
    path = os.fspath(path)
    for given in inputs:
        if os.path.exists(path) and _same_file(path, given):
            raise ModelFileError(f"{flag} {path} is the input {given}; memopt never overwrites "
                                 "its input: give another output path")
    if os.path.isdir(path):
        raise ModelFileError(f"{flag} {path} is a directory; give a file name in it")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        what = "is not a directory" if os.path.exists(folder) else "does not exist"
        raise ModelFileError(f"{flag} {path}: the directory {folder} {what}; create it or "
                             "give another output path")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path)
                                                     and not os.access(path, os.W_OK)):
        raise ModelFileError(f"{flag} {path}: not writable here; give an output path in a "
                             "directory you can write")


def _stem(model_path: str) -> str:
    return os.path.splitext(os.fspath(model_path))[0]


def parameter_files(model_path: str) -> List[Tuple[str, str]]:
    """``[(suffix, path)]`` of the parameter files beside ``model_path``."""
    stem = _stem(model_path)
    return [(s, stem + s) for s in PARAMETER_SUFFIXES if os.path.isfile(stem + s)]


def copy_parameters(model_path: str, written: str) -> List[str]:
    """Copy the parameter files beside ``model_path`` beside ``written`` (same
    suffixes, ``written``'s stem); returns the paths written.  Nothing is
    copied onto itself."""
    out = []
    stem = _stem(written)
    for suffix, source in parameter_files(model_path):
        target = stem + suffix
        if os.path.exists(target) and _same_file(source, target):
            continue
        try:
            shutil.copyfile(source, target)
        except OSError as exc:
            raise ModelFileError(f"cannot copy {source} to {target}: "
                                 f"{exc.strerror or exc}") from None
        out.append(target)
    return out
