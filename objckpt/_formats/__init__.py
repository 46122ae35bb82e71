"""Every format a source can be, each behind the one format protocol (recognise, list, open,
verify, write) of the `registry`: the TF checkpoint (`checkpoint`, `checkpoint_verify`),
SavedModel directories (`savedmodel`, saved_model.pb decoded by `savedobjects`), Keras 3
`.weights.h5`/`.keras` files (`kerash5`), Keras 2 / tf_keras HDF5 (`legacyh5`; HDF5 read as
untrusted input by `h5`), safetensors (`safetensors`, written by `safetensors_write`). It may
import `_bundle`, `_compat` and `_base`; never planning, inspection, operations or training.
"""
