"""Unit tests of stabletoolbench_mirror.responders."""
