"""The store watchdog, against an in-process store (level b): failures and silence stop a rank."""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

from pipetrain.runtime.process.watchdog import Watchdog


class _Trips:
    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.event = threading.Event()

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.event.set()


def _watchdog(store: dist.Store, rank: int, timeout_s: float, trips: _Trips) -> Watchdog:
    return Watchdog(store, rank, 2, timeout_s, lambda r: f"stage {r} (rank {r})", trips)


def test_published_failure_stops_the_others() -> None:
    store, trips = dist.HashStore(), _Trips()
    peer = _watchdog(store, 1, 5.0, _Trips())
    watchdog = _watchdog(store, 0, 1.0, trips)
    peer.start()
    watchdog.start()
    try:
        peer.report_failure("stage 1 (rank 1) failed at step 2: ValueError: boom")
        peer.report_failure("a later failure does not replace the first")
        assert trips.event.wait(3.0)
        assert trips.reasons == ["stage 1 (rank 1) failed at step 2: ValueError: boom"]
        assert watchdog.failure() == trips.reasons[0]
    finally:
        watchdog.stop()
        peer.stop()


def test_silent_peer_is_declared_dead_after_timeout() -> None:
    store, trips = dist.HashStore(), _Trips()
    watchdog = _watchdog(store, 0, 0.5, trips)
    start = time.monotonic()
    watchdog.start()
    try:
        assert trips.event.wait(5.0)
        assert time.monotonic() - start >= 0.5
        assert trips.reasons[0].startswith("stage 1 (rank 1) stopped answering (no heartbeat for")
    finally:
        watchdog.stop()


def test_beating_peer_and_quiet_watchdog_do_not_trip() -> None:
    store, trips = dist.HashStore(), _Trips()
    peer = _watchdog(store, 1, 1.0, _Trips())
    watchdog = _watchdog(store, 0, 1.0, trips)
    peer.start()
    watchdog.start()
    try:
        assert not trips.event.wait(1.5)
        peer.stop()  # silent from now on, but the run is finishing
        watchdog.quiet()
        assert not trips.event.wait(1.0)
    finally:
        watchdog.stop()
    assert watchdog.failure() is None
