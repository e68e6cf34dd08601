"""``pipetrain --help`` and ``--version`` answer without importing torch (issue 32: under a second),
and a sub-command still gets every option of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipetrain.cli import COMMANDS, build_parser


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_top_level_answers_load_no_torch(argv: list[str]) -> None:
    code = (f"import sys\nfrom pipetrain.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_a_command_is_built_with_its_options_only() -> None:
    parser = build_parser(only=["plan"])
    args = parser.parse_args(["plan", "--model", "mlp-digits", "--ranks", "2"])
    assert args.ranks == 2 and args.handler == COMMANDS["plan"].handler
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--steps", "3"])  # train was built without its options
    full = build_parser()
    assert full.parse_args(["train", "--steps", "3"]).steps == 3
