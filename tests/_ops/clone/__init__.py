"""Tests of objckpt/_ops/clone/: clone and clone_with_values (test_api.py), the copier table (test_table.py)."""
