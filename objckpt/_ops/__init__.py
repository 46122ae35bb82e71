"""Operations on live objects: snapshot, restore and save (`snapshot`), restore on create
(`deferred`), migration (`migrate`), other formats written (`export`), structural clones
(`clone`), past/current twins (`twins`), ensembles (`ensemble`) and freezing (`freeze`). It may
import `_inspect`, `_planning`, `_formats`, `_bundle`, `_compat` and `_base`; never training,
callbacks or the CLI.
"""
