"""Start-up checks: what a configuration points at, checked before anything is served (:mod:`.checks`), and the
relay's and the simulator's endpoints probed (:mod:`.probes`)."""
