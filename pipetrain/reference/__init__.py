"""Single-process emulators of every method's update order that differs from unpipelined training
(the asynchronous methods' weight versions, local learning's per-stage updates): the oracles the
multi-process runs are checked against (docs/architecture.md §5.6). Unpipelined training itself is
:func:`pipetrain.runtime.reference_train`.

Above :mod:`pipetrain.runtime`: the emulators train with the runtime's own settings, data, loss,
optimizers and job checks, so that what they compute differs from a pipelined run only where the
method says it should.
"""
