"""Operations on live objects: snapshots (`snapshot`), saving (`save`), restore and plan, the
public doors of the one restore pipeline (`restore`), restore on create (`deferred`),
migration (`migrate`), export (`export`), structural clones (`clone`), past/current twins
(`twins`), ensembles (`ensemble`) and freezing (`freeze`). It may import `_inspect`,
`_planning`, `_formats`, `_bundle`, `_compat` and `_base`; never training, callbacks or the CLI.
"""
