"""What the command line shows on a terminal: its own words, and none of TF's start-up noise.

- `cli_words(text)`: the library's advice names Python arguments (`format='dot'`,
  `optimizer_state=True`, `rules=[...]`); the command line says its flags instead.
- `quiet_tf()`: commands that import TensorFlow (verify, migrate, demo) keep its start-up
  lines (C++ logging before absl is initialised, CUDA probing on a machine without a GPU, CPU
  feature notes) off stderr; every other line, errors included, still shows. Only the command
  line does this: the library never configures TF.
- `quiet_clients()`: the storage clients' informational log lines (botocore's "Found
  credentials in environment variables", once per command on a `s3://` URL) off stderr; their
  warnings and errors still show.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import re
import sys
import threading

__all__ = ["cli_words", "quiet_clients", "quiet_tf"]


# The library's advice names Python arguments; the command line's flags stand for them.
_WORDS = ((re.compile(r"objckpt\.plan\(obj, source\)\.proposed holds a rule set proposed from "
                      r"names and shapes \(([^)]*)\): print the plan to review it as Python, "
                      r"then pass it as rules= \(it is never applied on its own\)"),
           r"`objckpt migrate SOURCE OUT --template MODULE:CALLABLE --dry-run` shows a rule "
           r"set proposed from names and shapes (\1), as Python for a script's "
           r"objckpt.restore (a --rules FILE holds renames only; a proposal is never "
           r"applied on its own)"),
          (re.compile(r"format='dot'"), "--format dot"),
          (re.compile(r"optimizer_state=True"), "--optimizer-state true"),
          (re.compile(r"optimizer_state=False"), "--optimizer-state false"),
          (re.compile(r"optimizer_state='auto'"), "--optimizer-state auto"),
          (re.compile(r"\bstrict=False"), "--no-strict"),
          (re.compile(r"\bat=\.\.\."), "--at NAME"),
          (re.compile(r"\bat=(['\"])([^'\"]*)\1"), r"--at \2"),
          (re.compile(r"\bdepth=N\b"), "--depth N"),
          (re.compile(r"\bempty=True"), "--empty"),
          (re.compile(r"objckpt\.plan\((?:source, obj|obj, source), rules=\.\.\.\)"),
           "objckpt migrate SOURCE OUT --template MODULE:CALLABLE --rules FILE --dry-run"),
          (re.compile(r"\brules=\.\.\."), "--rules FILE"))
_RULES = re.compile(r"\brules=\[")


def cli_words(text: str) -> str:
    """Text from the library with its Python arguments in the command line's words:
    `format='dot'` -> `--format dot`, `optimizer_state=True` -> `--optimizer-state`,
    `at="model"` -> `--at model`, `depth=N` -> `--depth N`, `empty=True` -> `--empty`, and
    `rules=[("^a/", "")]` -> `--rules FILE holding [["^a/", ""]]` (the JSON the file holds).
    """
    for pattern, words in _WORDS:
        text = pattern.sub(words, text)
    out, pos = [], 0
    for match in _RULES.finditer(text):
        if match.start() < pos:
            continue
        depth, end = 0, None
        for at in range(match.end() - 1, len(text)):
            depth += {"[": 1, "]": -1}.get(text[at], 0)
            if depth == 0:
                end = at + 1
                break
        if end is None:
            break
        try:
            rules = ast.literal_eval(text[match.end() - 1:end])
            shown = json.dumps([list(rule) for rule in rules])
        except (ValueError, SyntaxError, TypeError):
            shown = text[match.end() - 1:end]
        out.append(text[pos:match.start()] + f"--rules FILE holding {shown}")
        pos = end
    return "".join(out) + text[pos:]


# TF's start-up lines (C++ logging before absl is initialised, CUDA probing on a machine
# without a GPU, CPU feature notes, plugin registration): not for the terminal of a CLI.
_TF_NOISE = re.compile(
    r"All log messages before absl::InitializeLog|oneDNN custom operations are on|"
    r"cudart_stub\.cc|Could not find cuda drivers|failed call to cuInit|"
    r"cpu_feature_guard\.cc|rebuild TensorFlow with the appropriate compiler flags|"
    r"TF-TRT Warning|Unable to register cu(DNN|FFT|BLAS) factory|"
    r"computation_placer\.cc|oneDNN supports DT_HALF only|Unable to register factory")


@contextlib.contextmanager
def quiet_tf():
    """Filters TF's start-up noise out of this process's stderr (file descriptor 2, where
    TF's C++ code writes); every other line (errors, warnings) reaches the terminal."""
    try:
        terminal = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:  # no stderr to filter
        yield
        return

    def pump() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                if not _TF_NOISE.search(line.decode("utf-8", "replace")):
                    os.write(terminal, line)

    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    thread = threading.Thread(target=pump, name="objckpt-stderr", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(terminal, 2)  # closes the pipe's last write end here: the pump sees its end
        thread.join(timeout=10)
        if not thread.is_alive():  # a child that inherited the pipe keeps the pump going:
            os.close(terminal)  # then its descriptor stays open, never reused under it


# The loggers of the storage clients a `gs://` or `s3://` URL loads (absl's handler, which the
# command line runs under, shows their INFO lines otherwise).
_CLIENT_LOGGERS = ("botocore", "aiobotocore", "boto3", "s3fs", "gcsfs", "fsspec",
                   "google.auth", "urllib3")


def quiet_clients() -> None:
    """The storage clients' loggers at WARNING: their informational lines stay off the
    terminal, their warnings and errors show. A level a user set already is kept."""
    for name in _CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
