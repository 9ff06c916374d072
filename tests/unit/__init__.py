"""Unit tests, one folder per sub-package of stabletoolbench_mirror."""
