"""Tests of objckpt/_formats/, one file per module (test_<module>.py)."""
