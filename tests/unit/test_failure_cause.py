"""A rank's error raised inside ``torch.distributed`` (gloo reports a dead peer in a collective as a
plain ``RuntimeError``) is a consequence of a peer's failure; one raised elsewhere is a cause."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from pipetrain.runtime.process.worker import in_communication


def _raised(call: Callable[[], object]) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def test_an_error_from_a_collective_is_a_consequence() -> None:
    assert not dist.is_initialized()
    error = _raised(lambda: dist.all_reduce(torch.zeros(1)))  # no process group: raised in torch.distributed
    assert in_communication(error)


def test_an_error_from_the_model_is_a_cause() -> None:
    error = _raised(lambda: torch.zeros(2) @ torch.zeros(3))
    assert not in_communication(error)
    assert not in_communication(RuntimeError("never raised"))
