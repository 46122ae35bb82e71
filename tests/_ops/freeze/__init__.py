"""Tests of objckpt/_ops/freeze/: the Freezer (test_freezer.py) and under model.fit (test_fit.py)."""
