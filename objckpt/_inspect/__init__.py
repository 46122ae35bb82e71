"""Inspection of checkpoints on disk, what the CLI needs without importing TensorFlow: a
checkpoint's variables from its metadata (`meta`), integrity checks (`verify`), differences
between two sources (`diff`, with the entries it compares paired by `pairing`) and the object
graph drawn (`graph`). It may import `_planning`,
`_formats`, `_bundle`, `_compat` and `_base`; never live operations, training or the CLI.
"""
