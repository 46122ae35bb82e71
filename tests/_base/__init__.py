"""Tests of objckpt/_base/, one file per module (test_<module>.py)."""
