"""Tests of objckpt/_training/, one file per module (test_<module>.py)."""
