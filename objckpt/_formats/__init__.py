"""The other formats a source can be: saved_model.pb decoded (`savedobjects`), SavedModel
directories (`savedmodel`), HDF5 read as untrusted input (`h5`), safetensors files
(`safetensors`), Keras 3 `.weights.h5`/`.keras` files (`kerash5`), Keras 2 / tf_keras HDF5
(`legacyh5`), each behind the one format protocol (recognise, list, open, verify) of the
`registry`. It may import `_bundle`, `_compat` and `_base`; never planning, inspection,
operations or training.
"""
