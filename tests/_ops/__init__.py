"""Tests of objckpt/_ops/, one file per module (test_<module>.py)."""
