"""Operations on live objects: snapshots (`snapshot`), saving (`save`), restore and plan, the
public doors of the one restore pipeline (`restore`), restore on create (`deferred`),
migration (`migrate`), export (`export`), structural clones (`clone`), past/current twins
(`twins`), ensembles (`ensemble`), freezing (`freeze`), averages of N sources (`average`;
what it does with each variable in `averagework`; `averaging` writes one without a model,
`meanstream` streams one tensor's mean, `slicemean` the mean of a tensor stored in slices), BatchNorm recalibration (`batchnorm`) and greedy
soups (`soup`). It may import `_inspect`, `_planning`, `_formats`, `_bundle`, `_compat` and
`_base`; never training, callbacks or the CLI.
"""
