"""Unit tests of stabletoolbench_mirror.stores."""
