"""Pure-Python conventions shared by every layer: the calling convention (`api`), argument
checks of checkpoint directories (`options`), text for people (`render`), the object path
grammar (`paths`), layer and slot names read from saved variable names (`names`) and the
weight-role renames between Keras flavours (`roles`). It imports only `objckpt.errors` and the
standard library: no TensorFlow, Keras, NumPy, and nothing else of objckpt.
"""
