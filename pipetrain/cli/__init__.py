"""The ``pipetrain`` command: profile | probe | plan | simulate | train | export | compare | demo.

    pipetrain demo                                   # the whole loop on a built-in model
    pipetrain profile --model mlp --batch 128        # writes out/profile.json
    pipetrain plan --model mlp --batch 128 --ranks 2 --profile out/profile.json   # writes out/plan.json
    pipetrain plan --model mlp --batch 128 --method uedp --planner tidgap --generations 200
    pipetrain plan --model vgg16 --batch 64 --cluster examples/clusters/4x4-v100.yaml --planner pipedream
    pipetrain plan --model gpt1-14 --batch 64 --cluster examples/clusters/2h100-2v100.yaml --planner auto
    pipetrain simulate --plan out/plan.json --profile out/profile.json    # writes into out/sim/
    pipetrain train --plan out/plan.json --steps 20 --checkpoint-dir out/ckpt   # writes into out/run/
    pipetrain export --checkpoint out/ckpt           # the newest checkpoint's state_dict: out/model.pt
    pipetrain compare --plan out/plan.json --predicted out/sim/predicted.json --measured out/run/measured.json
    torchrun --nproc-per-node 2 -m pipetrain train --plan out/plan.json

``--out FILE`` names the one file of profile, probe, plan, export and compare; ``--out-dir DIR`` the
folder of simulate, train and demo, which write several. Every default lands under ``out/``.

A user's mistake prints one line naming the fix and exits with code 2 (docs/architecture.md §5.5).
"""

from pipetrain.cli.main import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]
