"""The test suite: unit tests by sub-package, end-to-end tests over real HTTP, the vLLM tier, helpers."""
