"""The parser and the entry point: sub-commands, one-line errors and exit codes."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from rich.markup import escape

from pipetrain import __version__
from pipetrain.cli.config_file import add_config_args, config_text, expand_config
from pipetrain.cli.consoles import console
from pipetrain.errors import Interrupted, PipelineFailure, UserError

__all__ = ["COMMANDS", "build_parser", "main"]


class Command(NamedTuple):
    """A sub-command: its help line, and where its handler and its options live (``module:name``,
    imported only for the command that runs, so ``pipetrain --help`` and ``--version`` load no torch)."""

    help: str
    handler: str
    options: str


COMMANDS: dict[str, Command] = {
    "profile": Command("measure (or estimate) per-layer costs and write profile JSON", "measure:cmd_profile",
                       "profile_args"),
    "probe": Command("measure this machine's link and rank contention; write cluster JSON", "measure:cmd_probe",
                     "probe_args"),
    "plan": Command("choose stages, schedule and micro-batches by simulation; write plan JSON", "planning:cmd_plan",
                    "plan_args"),
    "simulate": Command("predict a plan's timeline: table, Chrome trace, Gantt PNG", "predict:cmd_simulate",
                        "simulate_args"),
    "train": Command("train with a plan on local ranks (or under torchrun)", "run:cmd_train", "train_args"),
    "compare": Command("show predicted beside measured: table and one picture", "predict:cmd_compare",
                       "compare_args"),
    "export": Command("write the newest checkpoint's model state_dict (for load_state_dict)", "run:cmd_export",
                      "export_args"),
    "demo": Command("profile → plan → simulate → train → compare on a built-in model", "run:cmd_demo", "demo_args"),
}


def _load(name: str) -> Callable[..., None]:
    """``module:function`` of :mod:`pipetrain.cli`, imported on first use."""
    module, _, function = name.rpartition(":")
    handler: Callable[..., None] = getattr(importlib.import_module(f"pipetrain.cli.{module}"), function)
    return handler


def build_parser(only: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser: every sub-command, with the options of those in ``only`` (all when None). Options
    import the model zoo, planners and torch, so the entry point builds only the command it runs."""
    parser = argparse.ArgumentParser(
        prog="pipetrain", description="Pipeline-parallel training for PyTorch, planned automatically.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"pipetrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        subparser = sub.add_parser(name, help=command.help, description=command.help)
        subparser.set_defaults(handler=command.handler, parser=subparser)
        if only is None or name in only:
            _load(f"options:{command.options}")(subparser)
            add_config_args(subparser)
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line (after a ``--config`` file's options); an unknown flag gets one line
    naming the nearest known one."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=[w for w in words if w in COMMANDS][:1])
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
    from pipetrain.data.text_file import is_text_file, with_options  # imports torch: only when used

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
        _load(args.handler)(args)
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


