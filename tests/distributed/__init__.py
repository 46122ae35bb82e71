"""Tests under tf.distribute: MirroredStrategy in this process, MultiWorkerMirroredStrategy
in worker processes."""
