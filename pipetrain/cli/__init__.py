"""The ``pipetrain`` command: profile | probe | plan | simulate | train | export | compare | demo.

    pipetrain demo                                   # the whole loop on a built-in model
    pipetrain profile --model mlp --batch 128 --out profile.json
    pipetrain plan --model mlp --batch 128 --ranks 2 --profile profile.json --out plan.json
    pipetrain plan --model mlp --batch 128 --method uedp --planner tidgap --generations 200
    pipetrain plan --model vgg16 --batch 64 --cluster examples/clusters/4x4-v100.yaml --planner pipedream
    pipetrain plan --model gpt1-14 --batch 64 --cluster examples/clusters/2h100-2v100.yaml --planner auto
    pipetrain simulate --plan plan.json --profile profile.json --out sim/
    pipetrain train --plan plan.json --steps 20 --out run/
    pipetrain export --checkpoint ckpt/ --out model.pt      # the newest checkpoint's state_dict
    pipetrain compare --plan plan.json --predicted sim/predicted.json --measured run/measured.json
    torchrun --nproc-per-node 2 -m pipetrain train --plan plan.json

A user's mistake prints one line naming the fix and exits with code 2 (docs/architecture.md §5.5).
"""

from pipetrain.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
