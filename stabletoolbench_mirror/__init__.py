"""stabletoolbench-mirror: a stable, replayable virtual API layer for StableToolBench."""

__version__ = "0.3.0"
