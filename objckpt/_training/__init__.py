"""Checkpoints while training: the asynchronous writer (`asyncwrite`), which checkpoints a
directory keeps (`retention`), the checkpoint directory and its commit protocol
(`checkpointing`), the state callbacks keep beside a model (`companions`), the Callback interface
of every Keras flavour (`callbackbase`), the SWA and EMA callbacks (`averaging`), resuming
`model.fit` (`fitckpt`) and the `CheckpointManager` of custom loops (`manager`). It may import everything below it (`_ops` down to `_base`); never
`objckpt.callbacks` or the CLI.
"""
