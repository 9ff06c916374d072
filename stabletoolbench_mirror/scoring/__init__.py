"""Reproduce a score: StableToolBench's own inference and evaluation run through the server, sealed in a
bundle (:mod:`.bundle`), replayed and re-scored."""
