"""The parser and the entry point: sub-commands, one-line errors and exit codes."""

from __future__ import annotations

import argparse
import difflib
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.markup import escape

from pipetrain import __version__
from pipetrain.cli.common import console
from pipetrain.cli.config_file import add_config_args, config_text, expand_config
from pipetrain.cli.measure import cmd_probe, cmd_profile
from pipetrain.cli.options import (
    compare_args,
    demo_args,
    export_args,
    plan_args,
    probe_args,
    profile_args,
    simulate_args,
    train_args,
)
from pipetrain.cli.planning import cmd_plan
from pipetrain.cli.predict import cmd_compare, cmd_simulate
from pipetrain.cli.run import cmd_demo, cmd_export, cmd_train
from pipetrain.data.text_file import is_text_file, with_options
from pipetrain.errors import Interrupted, PipelineFailure, UserError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipetrain", description="Pipeline-parallel training for PyTorch, planned automatically.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"pipetrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    Command = tuple[Callable[[argparse.Namespace], None], str, Callable[[argparse.ArgumentParser], None]]
    commands: dict[str, Command] = {
        "profile": (cmd_profile, "measure (or estimate) per-layer costs and write profile JSON", profile_args),
        "probe": (cmd_probe, "measure this machine's link and rank contention; write cluster JSON", probe_args),
        "plan": (cmd_plan, "choose stages, schedule and micro-batches by simulation; write plan JSON", plan_args),
        "simulate": (cmd_simulate, "predict a plan's timeline: table, Chrome trace, Gantt PNG", simulate_args),
        "train": (cmd_train, "train with a plan on local ranks (or under torchrun)", train_args),
        "compare": (cmd_compare, "show predicted beside measured: table and one picture", compare_args),
        "export": (cmd_export, "write the newest checkpoint's model state_dict (for load_state_dict)", export_args),
        "demo": (cmd_demo, "profile → plan → simulate → train → compare on a built-in model", demo_args),
    }
    for name, (func, text, add_args) in commands.items():
        command = sub.add_parser(name, help=text, description=text)
        command.set_defaults(func=func, parser=command)
        add_args(command)
        add_config_args(command)
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line (after a ``--config`` file's options); an unknown flag gets one line
    naming the nearest known one."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(words)
    command: argparse.ArgumentParser = args.parser
    if args.config is not None:
        at = words.index(args.command) + 1
        words[at:at] = _config_words(args.config, command, words[at:])
        args, extra = parser.parse_known_args(words)
    if extra:
        known = [o for action in command._actions for o in action.option_strings]
        close = difflib.get_close_matches(extra[0].partition("=")[0], known, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; see `pipetrain {args.command} --help`"
        command.error(f"unrecognized argument {extra[0]}{hint}")
    _text_file_options(args, command)
    return args


def _text_file_options(args: argparse.Namespace, command: argparse.ArgumentParser) -> None:
    """Fold ``--tokenizer`` and ``--context`` into ``--data text:PATH`` (``text:PATH?context=T&tokenizer=...``)."""
    tokenizer, context = getattr(args, "tokenizer", None), getattr(args, "context", None)
    if tokenizer is None and context is None:
        return
    if not is_text_file(args.data or ""):
        command.error("--tokenizer and --context go with --data text:PATH (a local text file)")
    args.data = with_options(args.data, context=context, tokenizer=tokenizer)
    args.tokenizer = args.context = None


def _config_words(path: Path, command: argparse.ArgumentParser, given: Sequence[str]) -> list[str]:
    """A config file's options as words; its mistakes end as one argparse error line."""
    try:
        return expand_config(path, command, given)
    except UserError as e:
        command.error(str(e))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING)
    if args.print_config:
        print(config_text(args, args.parser), end="")
        return 0
    try:
        args.func(args)
    except UserError as e:
        console.print(f"[bold red]error:[/bold red] {escape(str(e))}")
        return UserError.exit_code
    except PipelineFailure as e:
        console.print(f"[bold red]pipeline failed:[/bold red] {escape(str(e))}")
        return PipelineFailure.exit_code
    except OSError as e:  # a file or folder that cannot be read or written: --out, --plan, --profile ...
        where = f": {e.filename}" if e.filename else ""
        console.print(f"[bold red]error:[/bold red] {escape(e.strerror or str(e))}{escape(str(where))}; check the path "
                      "(an --out folder must not be an existing file, and its parent must be writable)")
        return UserError.exit_code
    except Interrupted as e:
        console.print(f"[bold yellow]stopped:[/bold yellow] {escape(str(e))}")
        return e.exit_code
    except KeyboardInterrupt:
        console.print("[bold yellow]stopped:[/bold yellow] interrupted (Ctrl-C)")
        return 130
    return 0


