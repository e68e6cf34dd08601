"""A heartbeat and failure-key watchdog on the rendezvous store: no rank ever hangs on a dead peer.

Every rank runs a daemon thread that, every ``interval_s``:

* increments its heartbeat key ``hb/{rank}``;
* reads the failure key ``failed``: a rank that fails writes one line there ("stage 1 (rank 1)
  failed at step 2: ValueError: ..."), and every other rank stops, naming it;
* checks the peers' heartbeats: a peer whose counter has not moved for ``timeout_s`` (measured on
  this rank's monotonic clock, so clocks need not agree) is declared dead;
* optionally checks that the launching process is still alive (local launch), so no rank outlives
  it as an orphan.

This covers what the process group's own timeout cannot: a rank blocked in a collective or a
receive from a healthy peer while some *other* rank has died, and torchrun-launched ranks, which
have no parent watching them. Stopping is ``on_trip(message)``, which must not return (it reports
and calls ``os._exit``): a thread cannot interrupt a main thread blocked inside a C++ call.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from torch.distributed.distributed_c10d import Store

__all__ = ["FAILURE_KEY", "Watchdog"]

FAILURE_KEY = "failed"


class Watchdog:
    """Heartbeats and failure propagation through a ``torch.distributed`` store.

    Args:
        store: shared by all ranks (a prefixed view of the rendezvous store).
        rank: this rank; ``world_size`` the number of ranks.
        timeout_s: a peer silent this long is dead.
        label: names a rank in messages, e.g. ``"stage 1 (rank 1)"``.
        on_trip: called with the reason to stop; must not return.
        parent_pid: stop when this process (the local launcher) is gone.
    """

    def __init__(
        self,
        store: Store,
        rank: int,
        world_size: int,
        timeout_s: float,
        label: Callable[[int], str],
        on_trip: Callable[[str], None],
        parent_pid: int | None = None,
    ) -> None:
        self.store = store
        self.rank = rank
        self.peers = [r for r in range(world_size) if r != rank]
        self.timeout_s = timeout_s
        self.interval_s = min(1.0, timeout_s / 10)
        self.label = label
        self.on_trip = on_trip
        self.parent_pid = parent_pid
        self._stop = threading.Event()
        self._quiet = threading.Event()
        self._beat = 0
        self._seen: dict[int, tuple[bytes, float]] = {}
        self._thread = threading.Thread(target=self._loop, name="pipetrain-watchdog", daemon=True)

    def start(self) -> None:
        self.store.set(f"hb/{self.rank}", "0")
        self._thread.start()

    def quiet(self) -> None:
        """Keep beating but stop judging peers: the run is finishing and peers may exit first."""
        self._quiet.set()

    def stop(self) -> None:
        """Stop the thread and wait for it: at most one store call, bounded by the store's timeout.

        Waiting matters: a daemon thread still inside a store call when the interpreter finalizes is
        ended by CPython from inside C++, which aborts the process ("terminate called without an
        active exception", SIGABRT) after a run that succeeded — seen on a loaded 2-core CI machine.
        """
        self._quiet.set()
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def report_failure(self, message: str) -> None:
        """Publish this rank's failure so the others stop; the first failure published wins."""
        try:
            self.store.compare_set(FAILURE_KEY, "", message)
        except RuntimeError:  # the store may be gone too; nothing to tell
            pass

    def failure(self, wait_s: float = 0.0) -> str | None:
        """The published failure, waiting up to ``wait_s`` for one to appear; None if none."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if self.store.check([FAILURE_KEY]):
                    return str(self.store.get(FAILURE_KEY).decode())
            except RuntimeError:
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                reason = self._tick()
            except RuntimeError as e:  # DistStoreError and DistNetworkError included
                reason = None if self._quiet.is_set() else f"lost the rendezvous store ({e})"
            if reason is not None and not self._quiet.is_set():
                self.on_trip(reason)
                return

    def _tick(self) -> str | None:
        """One round; returns why to stop, or None."""
        self._beat += 1
        self.store.set(f"hb/{self.rank}", str(self._beat))
        if self._quiet.is_set():
            return None
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            return "the launching process exited"
        if self.store.check([FAILURE_KEY]):
            return str(self.store.get(FAILURE_KEY).decode())
        now = time.monotonic()
        for peer in self.peers:
            reason = self._check_peer(peer, now)
            if reason is not None:
                return reason
        return None

    def _check_peer(self, peer: int, now: float) -> str | None:
        key = f"hb/{peer}"
        value = self.store.get(key) if self.store.check([key]) else b""
        last = self._seen.get(peer)
        if last is None or last[0] != value:
            self._seen[peer] = (value, now)
            return None
        if now - last[1] > self.timeout_s:
            return f"{self.label(peer)} stopped answering (no heartbeat for {now - last[1]:.0f} s)"
        return None
