"""What answers a miss: the real API, the simulator, shadow pairs."""
