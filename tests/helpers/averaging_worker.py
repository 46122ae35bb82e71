"""A training process for the kill-and-resume tests of the SWA and EMA callbacks.

  python averaging_worker.py FLAVOUR AVERAGE ORDER DIR OUT [KILL_AT]

builds the functional model of tests/helpers/flavours.py (fixed seeds), fits it for 4 epochs of 4
batches with `Checkpointing(DIR)` (see SAVE_FREQ) and the AVERAGE callback ("swa_epoch": SWA
from epoch 1 after every epoch; "swa_steps": SWA from epoch 1 every 3 steps; "ema": EMA with
decay 0.8), listed before Checkpointing (ORDER "first") or after it ("last"), and writes the
averaged model's variables and its count to OUT (`.npz`, no pickle). With KILL_AT the process
SIGKILLs itself after that many batches of this run, before anything is written to OUT.
"""

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np

from objckpt.callbacks import EMA, SWA, Checkpointing

import flavours

AVERAGES = {
    "swa_epoch": lambda: SWA(start_epoch=1),
    "swa_steps": lambda: SWA(start_epoch=1, every=3),
    "ema": lambda: EMA(decay=0.8),
}

# SWA by epoch: a checkpoint at every epoch's end (the update of that very end is in it);
# by steps: every 3 batches, mid-epoch.
SAVE_FREQ = {"swa_epoch": "epoch", "swa_steps": 3, "ema": 3}


def main(flavour, average, order, directory, out, kill_at=None):
    keras = flavours.keras_for(flavour)
    keras.utils.set_random_seed(0)
    model = flavours.build_functional(keras, train=False)
    images, tokens, targets = flavours._data()
    callback = AVERAGES[average]()
    checkpointing = Checkpointing(directory, save_freq=SAVE_FREQ[average], max_to_keep=2,
                                  verbose=0)
    callbacks = [callback, checkpointing] if order == "first" else [checkpointing, callback]
    if kill_at is not None:
        class Kill(keras.callbacks.Callback):
            seen = 0

            def on_train_batch_end(self, batch, logs=None):
                Kill.seen += 1
                if Kill.seen == int(kill_at):
                    os.kill(os.getpid(), signal.SIGKILL)

        callbacks.append(Kill())
    model.fit([images, tokens], targets, epochs=4, batch_size=2, shuffle=False, verbose=0,
              callbacks=callbacks)
    arrays = {path.replace("/", "|"): past.numpy()
              for path, (_, past) in callback.twins.variables().items()}
    np.savez(out, count=np.array(callback.count), **arrays)


if __name__ == "__main__":
    main(*sys.argv[1:])
