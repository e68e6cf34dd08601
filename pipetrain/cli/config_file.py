"""``--config FILE`` and ``--print-config``: a command's options kept in a YAML file.

Users of LightningCLI (``--config``, ``--print_config``) and DeepSpeed (``--deepspeed_config``)
keep a run's settings in a file beside the code. A pipetrain config file is a YAML mapping from
option names (``lr``, ``lr-schedule`` or ``lr_schedule``) to values, for example::

    # train.yaml, for `pipetrain train --config train.yaml --steps 50`
    model: mlp-digits
    optimizer: adamw
    lr: 3.0e-3
    lr-schedule: warmup-cosine
    warmup-steps: 10
    leaf: [mypkg.blocks:Attention]    # repeatable options take a list
    memory-cap: false                 # on/off options take true/false

The file's options are read as if typed on the command line before the others, so every check of
a typed option applies, and a flag given on the command line overrides the file (also across
exclusive options: a typed ``--epochs`` replaces the file's ``steps``).
``--print-config`` prints the options a command would run with, in this format, and runs nothing.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pipetrain.errors import UserError

__all__ = ["add_config_args", "config_text", "expand_config"]

_NOT_SETTINGS = frozenset({"help", "config", "print-config"})
"""Options a config file cannot hold."""


def add_config_args(p: argparse.ArgumentParser) -> None:
    """Add ``--config`` and ``--print-config`` to a command's parser."""
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="YAML file of this command's options (e.g. `lr: 0.01`); flags given here override it "
                        "(default: none)")
    p.add_argument("--print-config", action="store_true",
                   help="print the options this command would run with, as a --config file, and stop")


def _options(command: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The command's long options that a file may set, by name without dashes."""
    return {name[2:]: action for action in command._actions for name in action.option_strings
            if name.startswith("--") and action.help != argparse.SUPPRESS and name[2:] not in _NOT_SETTINGS
            and not name.startswith("--no-")}


def _tokens(name: str, action: argparse.Action, value: Any) -> list[str]:
    """``value`` of option ``name`` as command-line words."""
    if isinstance(action, argparse.BooleanOptionalAction | argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise UserError(f"config: {name} is on or off; give true or false, not {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            return [f"--{name}" if value else f"--no-{name}"]
        return [f"--{name}"] if value else []
    values = value if isinstance(value, list) else [value]
    if isinstance(action, argparse._AppendAction):
        return [f"--{name}={v}" for v in values]
    if isinstance(value, list | dict) or value is None:
        raise UserError(f"config: {name} takes one value, not {value!r}")
    return [f"--{name}={value}"]


def _overridden(action: argparse.Action, command: argparse.ArgumentParser, given: Sequence[str]) -> bool:
    """Whether ``given`` (the typed words) names an option exclusive with ``action`` (``--epochs``
    typed over a file's ``steps``): the typed one wins, as a typed flag does over the same option."""
    for group in command._mutually_exclusive_groups:
        if action in group._group_actions:
            others = [o for a in group._group_actions if a is not action for o in a.option_strings]
            return any(w == o or w.startswith(f"{o}=") for w in given for o in others)
    return False


def expand_config(path: Path, command: argparse.ArgumentParser, given: Sequence[str] = ()) -> list[str]:
    """The file's options as command-line words for ``command``, leaving out those exclusive with an
    option in ``given`` (the words typed after the command).

    Raises:
        UserError: the file is missing, not a YAML mapping, or names an option the command lacks.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no config file at {path}; write one with `--print-config > {path}`") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path} is not valid YAML ({str(e).splitlines()[0]}); fix the file") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config file is a mapping of option names to values, e.g. `lr: 0.01`")
    options = _options(command)
    words: list[str] = []
    for key, value in data.items():
        name = str(key).replace("_", "-")
        if name not in options:
            close = difflib.get_close_matches(name, list(options), n=1)
            hint = f"did you mean {close[0]}?" if close else f"see `{command.prog} --help`"
            raise UserError(f"{path}: `{command.prog}` has no option {key!r}; {hint}")
        if not _overridden(options[name], command, given):
            words += _tokens(name, options[name], value)
    return words


def config_text(args: argparse.Namespace, command: argparse.ArgumentParser) -> str:
    """The parsed options of ``command`` as a config file (YAML), unset options left out."""
    settings: dict[str, Any] = {}
    for name, action in _options(command).items():
        value = getattr(args, action.dest, None)
        if value is None:
            continue
        settings[name] = str(value) if isinstance(value, Path) else (
            [str(v) for v in value] if isinstance(value, list) else value)
    return yaml.safe_dump(settings, sort_keys=False)
