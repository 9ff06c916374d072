"""Unit tests of stabletoolbench_mirror.core."""
