"""Unit tests of stabletoolbench_mirror.upstream."""
