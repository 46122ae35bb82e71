"""Tests of objckpt/_planning/, one file per module (test_<module>.py)."""
