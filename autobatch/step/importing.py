"""Importing the user's code: a ``.py`` file by path, a module by name, an attribute of either.

A file is imported under its own module name (``autobatch_user_<stem>``), never as ``__main__``, with
its folder first on ``sys.path`` so that its own imports work. Whatever the import raises becomes a
:class:`~autobatch.errors.ScriptError` (exit 3) that names the file; a missing file or module is a
:class:`~autobatch.errors.UsageError`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from autobatch.errors import AutobatchError, ScriptError, UsageError
from autobatch.records.failures import script_traceback
from autobatch.step.scriptpath import check_script_path
from autobatch.step.spec import is_file_reference, split_reference


def import_file(path: str | Path, *, reuse: bool = False) -> ModuleType:
    """Import the Python file at ``path`` (``reuse``: return the module a previous call imported from it)."""
    path = check_script_path(path)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    name = "autobatch_user_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    loaded = sys.modules.get(name)
    if reuse and loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    # Any file name: a script without the .py suffix is still Python source.
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}", hint="the training script must be a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with translated(path.name):
        spec.loader.exec_module(module)
    return module


def import_module(name: str) -> ModuleType:
    """Import a module by its dotted name (from the folders on ``sys.path``)."""
    try:
        with translated(name):
            return importlib.import_module(name)
    except ScriptError as exc:
        if exc.detail and f"No module named '{name.split('.')[0]}'" in exc.detail:
            raise UsageError(
                f"no module named {name!r}",
                hint="check the name, and that its folder is on sys.path (or is the working directory)",
            ) from None
        raise


def import_reference(target: str, what: str) -> Any:
    """The object ``"path/to/file.py:Attr"`` or ``"package.module:Attr"`` names (``what``: the flag, for messages)."""
    where, attribute = split_reference(target)
    module = import_file(where, reuse=True) if is_file_reference(where) else import_module(where)
    if not attribute:
        return module
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise UsageError(
                f"{what} {target}: {where} has no attribute {attribute!r}",
                hint="name a class or object the module defines, as PATH:Name",
            )
        found = getattr(found, part)
    return found


@contextmanager
def translated(name: str) -> Iterator[None]:
    """Turn what importing user code raises into autobatch's errors (``name``: the file or module)."""
    try:
        yield
    except AutobatchError:
        raise
    except SystemExit as exc:
        raise exit_error(name, exc) from None
    except Exception as exc:
        raise ScriptError(
            f"{name} raised {type(exc).__name__} while being imported: {exc}",
            hint="fix the script so that importing it works (autobatch imports it, it does not run it as __main__)",
            detail=script_traceback(exc),
        ) from None


def exit_error(name: str, exc: SystemExit) -> ScriptError:
    """What a ``sys.exit()`` while importing ``name`` says: argparse refusing the arguments asks for the
    script's arguments; any other exit is the script's own, named with its code or message (argparse is
    never guessed from the code alone: ``sys.exit(2)`` is also a script's way to stop)."""
    refused = _argparse_message(exc)
    if refused is not None:
        return ScriptError(
            f"{name} called sys.exit({exc.code}) while being imported: its argument parsing (argparse) "
            f"refused the arguments it was given: {refused}",
            hint="give the script's own arguments after `--` (autobatch tune SCRIPT ... -- --flag value); "
            "argument parsing at import time must accept them (use parse_known_args to ignore others)",
            detail=script_traceback(exc),
        )
    said = "sys.exit()" if exc.code is None else f"sys.exit({exc.code!r})"
    return ScriptError(
        f"{name} called {said} while being imported: the script ends itself at import",
        hint="autobatch imports the script (it does not run it as __main__), so its top-level code runs in every "
        "probe: give it what it checks for there (the probes run in autobatch's environment and working "
        'folder), or move the exit under `if __name__ == "__main__":`',
        detail=script_traceback(exc),
    )


def _argparse_message(exc: SystemExit) -> str | None:
    """argparse's complaint, when argparse raised ``exc`` (its ``error(message)`` on the traceback), else None."""
    import argparse

    tb, message = exc.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == argparse.__file__:
            found = tb.tb_frame.f_locals.get("message") if code.co_name == "error" else None
            message = str(found) if found is not None else message or "(argparse printed the usage)"
        tb = tb.tb_next
    return message
