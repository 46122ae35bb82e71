"""Tests of objckpt/_cli/, one file per module (test_<module>.py)."""
