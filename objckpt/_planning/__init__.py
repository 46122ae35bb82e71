"""From a live obj and a source to checked values in its variables: live trees (`tree`),
opened sources (`sources`), rules and transforms (`rules`), entries stacked into one variable
(`stacking`), target variables (`targets`),
optimizer state by owner (`optstate`), plans and matches (`plans`), whole-model strategies
(`strategies`), the matcher (`match`), proposed rules (`propose`), and the one restore
pipeline (`pipeline`), whose stages are open (`sources`), plan (`match`), check (`checks`),
fetch (`fetch`; sharded variables a shard at a time, `sharded`), agree (`agree`), assign
and refresh (`assign`). It may import `_formats`,
`_bundle`, `_compat` and `_base`; never inspection, operations, training or the CLI.
"""
