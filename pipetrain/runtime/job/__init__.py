"""A training job on one rank: its settings and results, data, optimizer, checkpoints, metrics,
evaluation and the step loop that drives the interpreter. Above :mod:`..interp`, below :mod:`..process`."""
