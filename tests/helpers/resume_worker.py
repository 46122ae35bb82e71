"""One side of the fresh-process resume test (tests/integration/test_resume.py), run as its
own process.

  python resume_worker.py train FLAVOUR KIND DIR   trains one epoch, saves DIR/ckpt with
      objckpt, trains one more epoch, writes DIR/uninterrupted.npz (every variable by path)
  python resume_worker.py resume FLAVOUR KIND DIR  builds and compiles the model anew,
      restores DIR/ckpt with the default options, trains one epoch, writes DIR/resumed.npz
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

import objckpt

from flavours import _data, build

FIT = {"batch_size": 4, "epochs": 1, "shuffle": False, "verbose": 0}


def main(mode, flavour, kind, directory):
    images, tokens, targets = _data()
    x = [images, tokens] if kind == "functional" else images
    if mode == "train":
        model = build(flavour, kind)
        objckpt.save(model, os.path.join(directory, "ckpt"))
        name = "uninterrupted"
    else:
        model = build(flavour, kind, train=False)
        objckpt.restore(model, os.path.join(directory, "ckpt"))
        name = "resumed"
    model.fit(x, targets, **FIT)
    np.savez(os.path.join(directory, f"{name}.npz"),
             **{path.replace("/", "|"): v.numpy() for path, v in objckpt.tree(model).items()})


if __name__ == "__main__":
    main(*sys.argv[1:])
