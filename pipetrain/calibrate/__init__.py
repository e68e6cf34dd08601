"""Calibrating a cluster to this machine and model: the runtime's per-action overhead from short runs
of a tiny model (:mod:`.overhead`), and the model's own compute speed, overhead and all-reduce fitted
to short runs of it (:mod:`.fit`). A client of :mod:`pipetrain.runtime`, which it launches."""
