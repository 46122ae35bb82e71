"""load_ensemble from safetensors read one tensor at a time into each member: values
bit-equal to `safetensors.numpy.load_file` (two members from two files), every member's
entries checked from metadata before any member is assigned (a failure in the last
member's check leaves no loader open and raises before any assign), and the memory it holds
beyond the members bounded by the largest tensor (sampled RssAnon)."""

import os

import numpy as np
import pytest

import objckpt
from objckpt import errors
from objckpt._formats import safetensors as _st
from tests._formats.test_safetensors_stream import (_bits, _module, _PeakAnon, _values,
                                                    _written)

st_numpy = pytest.importorskip("safetensors.numpy")


def _counted(monkeypatch) -> dict:
    """Counts the streamed loaders' verify, assign and close calls."""
    calls = {"verify": 0, "assign": 0, "close": 0}
    for name in calls:
        original = getattr(_st._Streamer, name)

        def counted(self, _original=original, _name=name):
            calls[_name] += 1
            return _original(self)

        monkeypatch.setattr(_st._Streamer, name, counted)
    return calls


@pytest.mark.parametrize("optimizer_state", ["auto", True])
def test_members_streamed_bit_equal_to_load_file(optimizer_state, tmp_path, monkeypatch):
    paths = [str(tmp_path / f"m{k}.safetensors") for k in range(2)]
    for k, path in enumerate(paths):
        st_numpy.save_file(_written(20 + k), path)
    calls = _counted(monkeypatch)
    template = _module(_written(20))
    ensemble = objckpt.load_ensemble(template, paths, optimizer_state=optimizer_state)
    # Without optimizer state each member's variables are created from values read one at
    # a time; with it the members exist first and the loader streams into each.
    streamed = 2 if optimizer_state is True else 0
    assert calls["verify"] == streamed and calls["assign"] == streamed
    assert calls["close"] >= streamed
    for member, path in zip(ensemble.members, paths):
        oracle = st_numpy.load_file(path)
        got = _values(member)
        assert {p: _bits(v) for p, v in got.items()} == {
            p: _bits(v) for p, v in oracle.items()}
    # the template is left as it was: zeros
    assert all(not np.any(v) for v in _values(template).values())


@pytest.mark.parametrize("optimizer_state", ["auto", True])
def test_a_bad_last_member_assigns_no_member(optimizer_state, tmp_path, monkeypatch):
    written = _written(22)
    good = str(tmp_path / "good.safetensors")
    st_numpy.save_file(written, good)
    bad_values = dict(written)
    bad_values["dense/bias"] = bad_values["dense/bias"][:-1]  # one element short
    bad = str(tmp_path / "bad.safetensors")
    st_numpy.save_file(bad_values, bad)
    calls = _counted(monkeypatch)
    template = _module(written)
    with pytest.raises(errors.ObjckptError) as caught:
        objckpt.load_ensemble(template, [good, bad], optimizer_state=optimizer_state)
    assert "member 1" in str(caught.value)
    assert "dense/bias" in str(caught.value)
    assert calls["assign"] == 0
    assert all(not np.any(v) for v in _values(template).values())


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("optimizer_state", ["auto", True])
def test_peak_memory_bounded_by_the_largest_tensor(optimizer_state, tmp_path):
    """Two members from 201 MB files of four 50 MB tensors each: beyond the two members'
    own variables the load holds at most the largest tensor + the streaming slack + 48 MiB
    of margin. With optimizer state (members created first, then every member planned and
    checked before any is assigned) holding every member's values, as the fetched route
    does, adds about 400 MB and fails the bound; without, members are created from their
    values, and streaming creates them as zeros and reads into them."""
    rng = np.random.default_rng(13)
    paths = []
    for k in range(2):
        written = {f"block{i}/kernel": rng.standard_normal((3200, 4096), dtype=np.float32)
                   for i in range(4)}
        written.update({f"block{i}/bias": rng.standard_normal(4096, dtype=np.float32)
                        for i in range(4)})
        paths.append(str(tmp_path / f"m{k}.safetensors"))
        st_numpy.save_file(written, paths[-1])
    largest = max(v.nbytes for v in written.values())
    model = sum(v.nbytes for v in written.values())
    del written
    template = _module(st_numpy.load_file(paths[0]))  # values dropped: only zeros stay
    with _PeakAnon() as peak:
        ensemble = objckpt.load_ensemble(template, paths, optimizer_state=optimizer_state)
    bound = 2 * model + largest + _st.STREAM_SLACK + (48 << 20)
    assert peak.growth < bound, (peak.growth, bound)
    for member, path in zip(ensemble.members, paths):
        oracle = st_numpy.load_file(path)
        assert all(_bits(v) == _bits(oracle[p]) for p, v in _values(member).items())
        del oracle
