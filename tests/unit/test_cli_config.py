"""``--config FILE`` and ``--print-config``: a command's options from YAML, flags overriding them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipetrain.cli import main
from pipetrain.cli.main import _parse


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one error line of a command that argparse refuses (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_file_sets_options_and_flags_override(tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text("model: mlp-digits\noptimizer: adamw\nlr: 3.0e-3\nlr_schedule: warmup-cosine\n"
                      "leaf: [torch.nn:Linear, torch.nn:ReLU]\nsteps: 40\n")
    args = _parse(["train", "--config", str(config), "--lr", "0.05"])
    assert (args.model, args.optimizer, args.lr, args.lr_schedule, args.steps) == (
        "mlp-digits", "adamw", 0.05, "warmup-cosine", 40)
    assert args.leaf == ["torch.nn:Linear", "torch.nn:ReLU"]


def test_a_typed_option_replaces_an_exclusive_one_of_the_file(tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text("epochs: 3\nlr: 0.1\n")
    args = _parse(["train", "--config", str(config), "--steps", "5"])
    assert (args.steps, args.epochs, args.lr) == (5, None, 0.1)


def test_on_off_options(tmp_path: Path) -> None:
    config = tmp_path / "plan.yaml"
    config.write_text("memory-cap: false\n")
    assert _parse(["plan", "--config", str(config)]).memory_cap is False
    assert _parse(["plan", "--config", str(config), "--memory-cap"]).memory_cap is True


def test_print_config_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--model", "mlp-digits", "--epochs", "2", "--optimizer", "adam", "--lr", "0.002",
            "--leaf", "torch.nn:Linear", "--out-dir", str(tmp_path / "run")]
    assert main([*argv, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert yaml.safe_load(printed)["lr"] == 0.002
    config = tmp_path / "printed.yaml"
    config.write_text(printed)
    direct, via_file = vars(_parse(argv)), vars(_parse(["train", "--config", str(config)]))
    ignored = {"config", "parser", "func"}
    assert {k: v for k, v in direct.items() if k not in ignored} == {
        k: v for k, v in via_file.items() if k not in ignored}


@pytest.mark.parametrize(("text", "message"), [
    ("lrr: 0.1\n", "has no option 'lrr'; did you mean lr?"),
    ("- lr\n", "a config file is a mapping of option names to values"),
    ("lr: [1, 2]\n", "lr takes one value, not [1, 2]"),
    ("memory-cap: maybe\n", "memory-cap is on or off; give true or false"),
    ("lr: {a: 1\n", "is not valid YAML"),
])
def test_mistakes_in_the_file_get_one_line(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    command = "plan" if "memory-cap" in text else "train"
    assert message in _error(capsys, [command, "--config", str(config)])


def test_missing_file_says_how_to_make_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _error(capsys, ["simulate", "--plan", "p.json", "--config", str(tmp_path / "none.yaml")])
    assert "no config file at" in line and "--print-config >" in line
