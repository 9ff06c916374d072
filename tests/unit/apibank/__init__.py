"""Unit tests of stabletoolbench_mirror.apibank."""
