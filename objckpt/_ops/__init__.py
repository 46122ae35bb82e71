"""Operations on live objects: snapshot, restore and save (`snapshot`), restore on create
(`deferred`), migration (`migrate`), structural clones (`clone`), past/current twins (`twins`),
ensembles (`ensemble`), freezing (`freeze`), BatchNorm recalibration (`batchnorm`) and greedy
soups (`soup`). It may import `_inspect`, `_planning`, `_formats`,
`_bundle`, `_compat` and `_base`; never training, callbacks or the CLI.
"""
