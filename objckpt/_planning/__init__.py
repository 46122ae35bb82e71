"""From a live obj and a source to a checked plan: live trees (`tree`), opened sources
(`sources`), rules and transforms (`rules`), target variables (`targets`), optimizer state by
owner (`optstate`), plans and matches (`plans`), whole-model strategies (`strategies`), the
matcher (`match`), rule sets proposed where no rule fits (`propose`), value checks (`checks`)
and the one restore pipeline's steps (`pipeline`: open, plan, check, agree, fetch). It may
import `_formats`, `_bundle`, `_compat` and `_base`; never inspection, operations, training or
the CLI.
"""
