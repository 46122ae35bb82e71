"""The command line's helpers: the demo, which uses the public API as users do (`demo`), and
the command line's words with TF's start-up noise kept off stderr (`terminal`). Only
`objckpt.cli` imports them; nothing in the library does.
"""
