"""``python -m pipetrain`` (and ``torchrun -m pipetrain``) runs the CLI."""

import sys

from pipetrain.cli import main

sys.exit(main())
