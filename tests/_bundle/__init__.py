"""Tests of objckpt/_bundle/, one file per module (test_<module>.py)."""
