"""TF's tensor bundle format, the checkpoint on disk: the index table read and validated in pure
Python (`index`), the object graph decoded without TF (`objgraph`), the writer (`write`),
parallel reads and writes with crc32c checks (`fastio`), files and object stores (`files`,
`remote`), the `checkpoint` state file (`state`), the directory lock (`lock`) and the undo log
that puts variables back when a streamed restore or an average fails half way (`undolog`). It may import
`_base` and `_compat`; never the other formats, planning, operations or training.
"""
