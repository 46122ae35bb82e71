"""safetensors restored one tensor at a time: values bit-equal to `safetensors.numpy.load_file`
(single files and sharded folders, bfloat16, through traced transforms), every entry checked
from metadata before anything is assigned (a failure found in the last entry's check changes
nothing), and the memory a restore holds
beyond the model bounded by the largest tensor (sampled RssAnon)."""

import json
import os
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import _compat, errors
from objckpt._formats import safetensors as _st

safetensors = pytest.importorskip("safetensors")
st_numpy = pytest.importorskip("safetensors.numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

# Above `_fastio.STREAM_BYTES` (16 MiB), so restores take the streamed route.
_ROWS, _COLS = 1536, 2048


def _written(seed: int = 5) -> dict:
    """{object path: NumPy value}: ~29 MB of float32, bfloat16, int64 and bool tensors."""
    rng = np.random.default_rng(seed)
    return {
        "dense/kernel": rng.standard_normal((_ROWS, _COLS), dtype=np.float32),
        "dense/bias": rng.standard_normal(_COLS, dtype=np.float32),
        "proj/kernel": rng.standard_normal((_COLS, _ROWS), dtype=np.float32),
        "half/kernel": rng.standard_normal((_ROWS, _ROWS // 2)).astype(ml_dtypes.bfloat16),
        "counts": rng.integers(-(2 ** 40), 2 ** 40, 64, dtype=np.int64),
        "flags": rng.integers(0, 2, 16).astype(bool),
    }


def _module(values: dict) -> tf.Module:
    """A tf.Module with variables of `values`' paths, shapes and dtypes, all zero."""
    module = tf.Module()
    for path, value in values.items():
        owner = module
        *parents, leaf = path.split("/")
        for part in parents:
            if not hasattr(owner, part):
                setattr(owner, part, tf.Module())
            owner = getattr(owner, part)
        # ml_dtypes' bfloat16 as this TF names it (TF 2.12's NumPy type is another)
        setattr(owner, leaf, tf.Variable(tf.zeros(value.shape, _compat.tf_dtype(value.dtype))))
    return module


def _values(module) -> dict:
    return {path: v.numpy() for path, v in objckpt.tree(module).items()}


def _streams(monkeypatch) -> list:
    """Counts the streamed loader's assign passes."""
    calls = []
    assign = _st._Streamer.assign

    def counted(self):
        calls.append(len(self.entries))
        return assign(self)

    monkeypatch.setattr(_st._Streamer, "assign", counted)
    return calls


def _bits(value) -> bytes:
    return np.ascontiguousarray(value).tobytes()


def test_single_file_streamed_bit_equal_to_load_file(tmp_path, monkeypatch):
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(_written(), path)
    oracle = st_numpy.load_file(path)
    calls = _streams(monkeypatch)
    module = _module(oracle)
    objckpt.restore(module, path)
    assert calls == [len(oracle)]
    got = _values(module)
    assert {p: _bits(v) for p, v in got.items()} == {p: _bits(v) for p, v in oracle.items()}


def test_sharded_folder_streamed(tmp_path, monkeypatch):
    written = _written(6)
    shards = {"model-00001-of-00002.safetensors": ["dense/kernel", "dense/bias", "flags"],
              "model-00002-of-00002.safetensors": ["proj/kernel", "half/kernel", "counts"]}
    weight_map = {}
    for shard, names in shards.items():
        st_numpy.save_file({n: written[n] for n in names}, str(tmp_path / shard))
        weight_map.update({n: shard for n in names})
    (tmp_path / _st.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    calls = _streams(monkeypatch)
    module = _module(written)
    objckpt.restore(module, str(tmp_path))
    assert calls == [len(written)]
    oracle = {}
    for shard in shards:
        oracle.update(st_numpy.load_file(str(tmp_path / shard)))
    assert {p: _bits(v) for p, v in _values(module).items()} == {
        p: _bits(v) for p, v in oracle.items()}


@pytest.mark.parametrize("transform", ["rules.Transpose", "tf.transpose"])
def test_transform_streamed_with_its_traced_shape(transform, tmp_path, monkeypatch):
    written = _written(7)
    torch_style = dict(written)
    torch_style["linear.weight"] = np.ascontiguousarray(torch_style.pop("dense/kernel").T)
    path = str(tmp_path / "torch.safetensors")
    st_numpy.save_file(torch_style, path)
    function = objckpt.rules.Transpose() if transform == "rules.Transpose" else tf.transpose
    calls = _streams(monkeypatch)
    module = _module(written)
    objckpt.restore(module, path, rules=[(r"^linear\.weight$", "dense/kernel", function)])
    assert calls == [len(written)]
    assert _bits(module.dense.kernel.numpy()) == _bits(written["dense/kernel"])


def test_failure_in_the_last_entrys_check_changes_nothing(tmp_path, monkeypatch):
    written = _written(9)
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(written, path)
    module = _module(written)
    before = {p: _bits(v) for p, v in _values(module).items()}
    last = list(st_numpy.load_file(path))[-1]  # the header's last entry
    spec = _st._output_spec

    def wrong_for_last(tensor, transform):
        found = spec(tensor, transform)
        if tensor.name == last:
            return (tuple(d + 1 for d in found[0]) or (2,)), found[1], found[2]
        return found

    monkeypatch.setattr(_st, "_output_spec", wrong_for_last)
    read = []
    tensor = _st._Reader.tensor
    monkeypatch.setattr(_st._Reader, "tensor",
                        lambda self, t: read.append(t.name) or tensor(self, t))
    with pytest.raises(errors.CheckpointCorruptError, match=f"`{last}` is "):
        objckpt.restore(module, path)
    assert read == []  # nothing read, so nothing assigned
    assert {p: _bits(v) for p, v in _values(module).items()} == before


def test_transformed_misfit_found_from_metadata_changes_nothing(tmp_path):
    written = _written(10)
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(written, path)
    module = _module(written)
    before = {p: _bits(v) for p, v in _values(module).items()}
    # proj/kernel is (2048, 1536): transposed it no longer fits
    with pytest.raises(errors.StructureMismatchError, match="proj/kernel"):
        objckpt.restore(module, path, rules=[(r"^proj/kernel$", "proj/kernel", tf.transpose)])
    assert {p: _bits(v) for p, v in _values(module).items()} == before


def test_restore_on_create_ensemble_and_migrate_bit_equal(tmp_path):
    written = _written(11)
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(written, path)
    oracle = {p: _bits(v) for p, v in st_numpy.load_file(path).items()}
    module = _module(written)
    pending = objckpt.restore_on_create(module, path)
    assert {p: _bits(v) for p, v in _values(module).items()} == oracle
    pending.assert_done()
    (member,) = objckpt.load_ensemble(_module(written), [path]).members
    assert {p: _bits(v) for p, v in _values(member).items()} == oracle
    prefix = objckpt.migrate(_module(written), path, str(tmp_path / "ckpt" / "model"))
    back = _module(written)
    objckpt.restore(back, prefix)
    assert {p: _bits(v) for p, v in _values(back).items()} == oracle


class _PeakAnon:
    """Peak RssAnon growth of this process (bytes) while the block runs, sampled by a
    thread every ~1 ms from /proc/self/status."""

    def __enter__(self):
        self.baseline = self.peak = self._anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._anon())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._anon())

    @property
    def growth(self) -> int:
        return self.peak - self.baseline

    @staticmethod
    def _anon() -> int:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
        return 0


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
def test_peak_memory_bounded_by_the_largest_tensor(tmp_path):
    """A 302 MB file of six 50 MB tensors (and a few small ones): the restore holds at most
    the largest tensor + the streaming slack (64 MiB) + 48 MiB of margin beyond the model;
    reading the values whole (as the fetched route does) holds the file's size. Exporting
    the model again holds no more."""
    rng = np.random.default_rng(12)
    written = {f"block{i}/kernel": rng.standard_normal((3200, 4096), dtype=np.float32)
               for i in range(6)}
    written.update({f"block{i}/bias": rng.standard_normal(4096, dtype=np.float32)
                    for i in range(6)})
    path = str(tmp_path / "model.safetensors")
    st_numpy.save_file(written, path)
    largest = max(v.nbytes for v in written.values())
    del written
    module = _module(st_numpy.load_file(path))  # values dropped: only the zeros stay
    with _PeakAnon() as peak:
        objckpt.restore(module, path)
    bound = largest + _st.STREAM_SLACK + (48 << 20)
    assert peak.growth < bound, (peak.growth, bound)
    oracle = st_numpy.load_file(path)
    assert all(_bits(v) == _bits(oracle[p]) for p, v in _values(module).items())
    del oracle
    # export writes tensor by tensor: the same bound
    out = str(tmp_path / "out" / "model.safetensors")
    with _PeakAnon() as peak:
        objckpt.export(module, out)
    assert peak.growth < bound, (peak.growth, bound)
    back = st_numpy.load_file(out)
    assert all(_bits(v) == _bits(back[p]) for p, v in _values(module).items())
