"""Tests across modules: resume, completeness, flavours, formats of others, docs, notebooks,
remote storage, untrusted input, the test tiers."""
