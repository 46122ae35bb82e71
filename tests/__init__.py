"""objckpt's tests, laid out like the package: the test of `objckpt/<package>/<module>.py` is
`tests/<package>/test_<module>.py` (`objckpt/cli.py`: `tests/test_cli.py`), more files about
one module are `test_<module>_<aspect>.py`; `integration/` holds the tests across modules,
`distributed/` those under tf.distribute, `helpers/` the shared helpers and worker scripts
(imported by name: pyproject.toml's `pythonpath`). tests/test_layout.py keeps it so."""
