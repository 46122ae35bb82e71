"""Tests of objckpt/rules/, one file per module (test_<module>.py)."""
