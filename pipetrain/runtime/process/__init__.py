"""The runtime's processes: starting the ranks (spawned locally, or under torchrun), a rank's session
(process group, watchdog, stop signals) and the launcher's progress display. Above :mod:`..job`."""
