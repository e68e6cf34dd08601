"""User code named on a command line: ``module.path:callable``.

Models (``--model my_model:build``), data factories (``--data my_data:make``) and losses
(``--loss my_losses:focal``) name a callable this way. :func:`load_callable` imports the module from the current working
directory first, then from ``sys.path``, so a file ``./my_data.py`` is found without installing it::

    >>> make = load_callable("my_data:make", "data factory")   # doctest: +SKIP
    >>> train, eval = make()                                    # doctest: +SKIP

Every failure is a :class:`~pipetrain.errors.UserError` of one line naming the reference and the fix.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pipetrain.errors import UserError

__all__ = ["cwd_first", "is_callable_ref", "load_callable"]

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_REF = re.compile(rf"({_IDENTIFIER}(?:\.{_IDENTIFIER})*):({_IDENTIFIER}(?:\.{_IDENTIFIER})*)")


def is_callable_ref(text: str) -> bool:
    """Whether ``text`` has the form ``module.path:callable`` (nothing is imported)."""
    return _REF.fullmatch(text) is not None


def load_callable(ref: str, what: str) -> Callable[..., Any]:
    """Import ``module.path:attr.path`` and return the callable it names.

    Args:
        ref: ``"package.module:function"``; the attribute part may be dotted (``mod:Class.make``).
        what: what the callable is for, used in error messages (``"data factory"``, ``"loss"``).

    Raises:
        UserError: a malformed reference, a module that cannot be imported, a missing attribute, or
            an attribute that is not callable.
    """
    match = _REF.fullmatch(ref)
    if match is None:
        raise UserError(f"{what} {ref!r} is not of the form module.path:callable; write e.g. my_data:make")
    module_name, attr_path = match.groups()
    module = _import(module_name, ref, what)
    target: Any = module
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise UserError(
                f"{what} {ref!r}: module {module_name!r} ({_origin(module)}) has no attribute {attr_path!r}; "
                "check the name after the colon"
            )
        target = getattr(target, part)
    if not callable(target):
        kind = type(target).__name__
        raise UserError(f"{what} {ref!r}: {attr_path!r} is of type {kind}, not callable; name a function")
    return target  # type: ignore[no-any-return]


def _import(module_name: str, ref: str, what: str) -> Any:
    """The module, imported with the working directory searched first."""
    try:
        with cwd_first():
            return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise UserError(
                f"{what} {ref!r}: no module {module_name!r} in the working directory {os.getcwd()} or on sys.path; "
                "run from the folder that holds it or add that folder to PYTHONPATH"
            ) from None
        raise UserError(f"{what} {ref!r}: importing {module_name!r} failed: {_one_line(error)}") from None
    except Exception as error:  # the user's module raised while importing
        raise UserError(f"{what} {ref!r}: importing {module_name!r} failed: {_one_line(error)}") from error


@contextmanager
def cwd_first() -> Iterator[None]:
    """Put the working directory at the front of ``sys.path`` meanwhile (while importing, or while
    starting processes, which copy ``sys.path``, so that they find the same user modules)."""
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(cwd)


def _origin(module: Any) -> str:
    return str(getattr(module, "__file__", None) or "built in")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
