"""The training process that tests/integration/test_remote_faults.py kills during an upload.

  python remote_kill_worker.py URL OUT KILL_AT

Trains the Keras 3 model of test_remote_faults (`small_model`, on `fit_data`) with
`callbacks.Checkpointing(URL)` saving every epoch. After each committed save it writes the
values it saved to OUT/committed-N.npz (every variable by object path, `|` for `/`); at the
"data" stage of save number KILL_AT (the data objects uploaded, the index not yet) it
SIGKILLs itself, as a machine lost mid-upload. The storage emulator is reached through the
standard settings in the environment (STORAGE_EMULATOR_HOST, AWS_ENDPOINT_URL...).
"""

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np

import objckpt
from objckpt._training import checkpointing as _checkpointing
from objckpt.callbacks import Checkpointing

from tests.integration.test_remote_faults import fit_data, small_model


def main(url: str, out: str, kill_at: str) -> None:
    model = small_model(seed=1)
    saves = [0]

    def hook(stage: str) -> None:
        if stage == "data":
            saves[0] += 1
            if saves[0] == int(kill_at):
                os.kill(os.getpid(), signal.SIGKILL)
        elif stage == "state":
            np.savez(os.path.join(out, f"committed-{saves[0]}.npz"),
                     **{p.replace("/", "|"): v.numpy() for p, v in objckpt.tree(model).items()})

    _checkpointing.fault_hook = hook
    x, y = fit_data()
    model.fit(x, y, batch_size=8, epochs=5, shuffle=False, verbose=0,
              callbacks=[Checkpointing(url, max_to_keep=5, verbose=0)])


if __name__ == "__main__":
    main(*sys.argv[1:])
