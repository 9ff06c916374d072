"""MirrorAPI simulator: client and vLLM server helpers."""
