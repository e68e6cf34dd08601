"""Errors that pipetrain reports to users.

A :class:`UserError` is a mistake the user can fix (a bad plan, an unknown model, sizes that do not
sum to the batch). The CLI prints its one-line message and exits with code 2 (DESIGN.md §5.4).
"""

from __future__ import annotations

__all__ = ["PipelineFailure", "UserError"]


class UserError(ValueError):
    """A user's mistake; the message names the fix. The CLI exits with code 2."""

    exit_code = 2


class PipelineFailure(RuntimeError):
    """A rank failed or stopped answering; the message names the failed stage."""

    exit_code = 1
