"""Tests of objckpt/_compat/, one file per module (test_<module>.py)."""
