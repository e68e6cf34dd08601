"""The command line's two consoles, light to import: ``pipetrain --help`` and ``--version`` load no torch."""

from __future__ import annotations

from rich.console import Console

__all__ = ["console", "out"]

console = Console(stderr=True, highlight=False, soft_wrap=True)
"""Progress and notes (stderr)."""
out = Console(highlight=False, soft_wrap=True)
"""Results: tables and summaries (stdout)."""
