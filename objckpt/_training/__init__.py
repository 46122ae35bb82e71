"""Checkpoints while training: the asynchronous writer (`asyncwrite`), which checkpoints a
directory keeps (`retention`: the `RetentionPolicy` option object; `kept`: the kept set under
it), the commit protocol (`commit`), the workers of a multi-worker strategy (`cluster`,
`multiworker`), the checkpoint directory composing them (`checkpointing`), the state callbacks keep beside a
model (`companions`), the Callback interface of every Keras flavour (`callbackbase`), the SWA
and EMA callbacks (`averaging`), resuming
`model.fit` (`fitckpt`) and the `CheckpointManager` of custom loops (`manager`). It may import
everything below it (`_ops` down to `_base`); never `objckpt.callbacks` or the CLI.
"""
