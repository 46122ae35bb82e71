"""Tests of objckpt/_inspect/, one file per module (test_<module>.py)."""
