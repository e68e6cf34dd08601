"""Errors that pipetrain reports to users.

A :class:`UserError` is a mistake the user can fix (a bad plan, an unknown model, sizes that do not
sum to the batch). The CLI prints its one-line message and exits with code 2 (docs/architecture.md §5.5).
"""

from __future__ import annotations

import signal
from pathlib import Path

__all__ = ["Interrupted", "PipelineFailure", "UserError"]


class UserError(ValueError):
    """A user's mistake; the message names the fix. The CLI exits with code 2."""

    exit_code = 2


class PipelineFailure(RuntimeError):
    """A rank failed or stopped answering; the message names the failed stage."""

    exit_code = 1


class Interrupted(Exception):
    """Training stopped on SIGINT or SIGTERM at a step boundary, on every rank at once.

    The CLI prints the message (one line) and exits with ``128 + signum`` (130 for SIGINT, 143 for
    SIGTERM), as a shell does for a process killed by that signal.

    Attributes:
        signum: the signal received.
        step: optimizer steps completed before stopping.
        checkpoint: the checkpoint written on the way out, or None (checkpointing off).
    """

    def __init__(self, signum: int, step: int, checkpoint: Path | None = None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else f"signal {signum}"
        saved = (f"; checkpoint {checkpoint} written, continue with --resume {checkpoint.parent}"
                 if checkpoint is not None else "; no checkpoint (pass --checkpoint-dir to keep the weights)")
        super().__init__(f"interrupted by {name} after step {step}{saved}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __reduce__(self) -> tuple[type[Interrupted], tuple[int, int, Path | None]]:
        return (Interrupted, (self.signum, self.step, self.checkpoint))
