"""The format registry (`objckpt._formats.registry`): every format listed once with its
roles (the TF checkpoint too), every dispatcher (inspect, verify, plan/restore, read_tree,
graph, diff) asking it, a format added as docs/layout.md shows, and a file in no format
refused with the same UnsupportedFormatError by every entry point."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import cli, errors
from objckpt._formats import registry as _formats
from objckpt._inspect import diff as _diff
from objckpt._inspect import meta as _meta
from objckpt._planning import sources as _sources

_VALUES = np.array([1.5, -2.25], np.float32)


def _fake_recognise(path: str) -> bool:
    return path.endswith(".fake") and os.path.isfile(path)


def _fake_values(path: str) -> np.ndarray:
    with open(path, "rb") as handle:
        return np.frombuffer(handle.read(), np.float32)


def _fake_list(path: str) -> dict:
    values = _fake_values(path)
    return {"prefix": path, "notes": ("fake note",), "index": None, "graph": None,
            "description": f"fake file `{path}`",
            "variables": [("w", "w", values.shape, 1, "w", "")]}  # DataType 1: float32


def _fake_open(path: str) -> dict:
    values = _fake_values(path)
    specs = {"w": (values.shape, tf.float32)}
    return {"description": f"fake file `{path}`", "kind": "object", "specs": specs,
            "fetch": lambda keys: [tf.constant(values) for _ in keys],
            "subtree": lambda at: {}, "top_level_names": [], "prefix": path}


def _fake_verify(path: str) -> _formats.Checked:
    values = _fake_values(path)
    return _formats.Checked(values.size, values.nbytes, (), ("fake note",), "read by the fake")


FAKE = _formats.Format("fake", "fake file", "fake `.fake`", _fake_recognise, _fake_list,
                       _fake_open, _fake_verify)


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "weights.fake"
    path.write_bytes(_VALUES.tobytes())
    _formats.register(FAKE)
    try:
        yield str(path)
    finally:
        _formats.unregister("fake")
    assert "fake" not in [f.name for f in _formats.FORMATS]


def _module() -> tf.Module:
    module = tf.Module()
    module.w = tf.Variable([0.0, 0.0])
    return module


def test_the_registry_lists_every_format_with_its_roles():
    names = [f.name for f in _formats.FORMATS]
    assert names == ["savedmodel", "keras3", "keras2-h5", "safetensors", "pytorch-pickle",
                     "tf-checkpoint"]
    for fmt in _formats.FORMATS:  # the TF checkpoint too: every role in its format module
        assert all(callable(getattr(fmt, role)) for role in _formats.ROLES), fmt.name
    assert _formats.FORMATS[-1] is _formats.CHECKPOINT
    from objckpt._formats import checkpoint as _checkpoint

    assert (_formats.CHECKPOINT.list, _formats.CHECKPOINT.open, _formats.CHECKPOINT.write) == (
        _checkpoint.listing, _checkpoint.source_fields, _checkpoint.write)
    assert [f.name for f in _formats.FORMATS if f.write] == ["safetensors", "tf-checkpoint"]


def test_each_path_is_recognised_by_its_format(tmp_path):
    saved = tmp_path / "exported"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"")
    other = tmp_path / "w.bin"
    other.write_bytes(b"\x00" * 16)
    objckpt.save(_module(), str(tmp_path / "ckpt"))
    found = {str(p): _formats.find(str(p)).name for p in (
        saved, saved / "saved_model.pb", tmp_path / "ckpt", tmp_path / "ckpt.index",
        tmp_path, tmp_path / "nothing-here")}
    assert list(found.values()) == ["savedmodel", "savedmodel", "tf-checkpoint",
                                    "tf-checkpoint", "tf-checkpoint", "tf-checkpoint"]
    with pytest.raises(errors.UnsupportedFormatError, match="is a file, not a checkpoint"):
        _formats.find(str(other))


def test_a_registered_format_is_read_by_every_dispatcher(fake, capsys):
    meta = _meta.read(fake)  # inspect, graph
    assert list(meta) == ["w"] and meta["w"].shape == (2,) and meta.description.startswith(
        "fake file")
    status = cli.main(cli._parse(["objckpt", "inspect", fake]))
    out = capsys.readouterr().out
    assert status == 0 and "fake file" in out and "w" in out
    assert "w" in objckpt.graph(fake).dot
    report = objckpt.verify(fake)
    assert (report.ok, report.tensors, report.nbytes, report.notes, report.checked) == (
        True, 2, 8, ("fake note",), "read by the fake")
    source = _sources.open_source(fake)  # plan and restore
    assert source.description.startswith("fake file") and not source.keyed_by_path
    module = _module()
    assert [(m.target, m.source) for m in objckpt.plan(module, fake).matches] == [("w", "w")]
    objckpt.restore(module, fake)
    assert module.w.numpy().tobytes() == _VALUES.tobytes()
    with pytest.raises(errors.UnsupportedFormatError, match="diff compares TF checkpoints"):
        _diff.diff(fake, fake)


def test_a_file_in_no_format_is_refused_alike_by_every_entry_point(tmp_path, capsys):
    path = str(tmp_path / "mystery.bin")
    with open(path, "wb") as handle:
        handle.write(b"neither a checkpoint nor HDF5 nor a zip")
    expected = str(_formats.unsupported(path)).split(" Fix:")[0]
    module = _module()
    calls = {
        "inspect": lambda: _meta.read(path),
        "verify": lambda: objckpt.verify(path),
        "plan": lambda: objckpt.plan(module, path),
        "restore": lambda: objckpt.restore(module, path),
        "restore_on_create": lambda: objckpt.restore_on_create(module, path),
        "read_tree": lambda: objckpt.read_tree(path),
        "graph": lambda: objckpt.graph(path),
        "diff": lambda: _diff.diff(path, path),
        "migrate": lambda: objckpt.migrate(module, path, str(tmp_path / "out")),
        "load_ensemble": lambda: objckpt.load_ensemble(module, [path]),
    }
    before = module.w.numpy().tobytes()
    for name, call in calls.items():
        with pytest.raises(errors.UnsupportedFormatError) as info:
            call()
        assert expected in str(info.value), name
        # One message, its list of files generated from the registry: every format named.
        assert str(info.value).endswith(str(_formats.unsupported(path))), name
        assert "Files objckpt also reads: Keras 3 `.weights.h5`, `.keras` and sharded " \
               "`.weights.json`, Keras 2 HDF5 `.h5`, safetensors `.safetensors` and " \
               "`model.safetensors.index.json`; this one is none of them." in str(
                   info.value), name
        assert info.value.source == path, name
    assert module.w.numpy().tobytes() == before
    for command in ("inspect", "verify", "graph"):
        status = cli.main(cli._parse(["objckpt", command, path]))
        err = capsys.readouterr().err
        assert status == 1 and "is a file, not a checkpoint prefix" in err, command


def _rewritten(prefix: str, out: str, registered: bool) -> str:
    """The checkpoint at `prefix` written again with a stray tensor `stray/w`, its root
    marked as written by a registered saver when `registered`."""
    from objckpt import _compat

    reader = tf.train.load_checkpoint(prefix)
    graph = _compat.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(_compat.OBJECT_GRAPH_KEY))
    if registered:
        graph.nodes[0].registered_saver.name = "test_saver"
        graph.nodes[0].registered_saver.object_name = "root"
    keys = [k for k in reader.get_variable_to_shape_map() if k != _compat.OBJECT_GRAPH_KEY]
    tensors = [tf.constant(graph.SerializeToString())] + [
        tf.constant(reader.get_tensor(k)) for k in keys] + [tf.constant([1.0, 2.0])]
    names = [_compat.OBJECT_GRAPH_KEY, *keys, "stray/w"]
    tf.raw_ops.SaveV2(prefix=out, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=tensors)
    return out


def test_verify_decodes_the_object_graph_in_python_alone(tmp_path, monkeypatch):
    from objckpt import _compat

    prefix = objckpt.save(_module(), str(tmp_path / "ckpt"))
    plain = _rewritten(prefix, str(tmp_path / "plain"), registered=False)
    registered = _rewritten(prefix, str(tmp_path / "registered"), registered=True)

    def refused():
        raise AssertionError("verify decoded the object graph with TF's protobuf")

    monkeypatch.setattr(_compat, "TrackableObjectGraph", refused, raising=False)
    assert objckpt.verify(prefix).ok
    report = objckpt.verify(plain)
    assert [(p.where, p.message) for p in report.problems] == [
        ("stray/w", "tensor in the index that no object of the object graph refers to")]
    # A registered saver writes tensors under keys of its own: no stray tensor then.
    report = objckpt.verify(registered)
    assert report.ok and report.tensors == 2, report.describe()


def test_the_worked_example_in_docs_layout_adds_a_format_to_every_door(tmp_path):
    """docs/layout.md's "Adding a format": its module and its registry line, as written
    there, make a format every door reads (diff too: its listing gives `read`) and the
    unsupported-format message names."""
    import pathlib
    import re
    import types

    text = (pathlib.Path(__file__).parents[2] / "docs" / "layout.md").read_text()
    module_code, registry_line = re.findall(r"```python[^\n]*\n(.*?)```",
                                            text.split("## Adding a format")[1], re.S)
    rawf32 = types.ModuleType("rawf32")
    exec(compile(module_code, "docs/layout.md", "exec"), rawf32.__dict__)
    fmt = eval(registry_line.strip().rstrip(","),  # the line as the docs write it
               {"Format": _formats.Format, "Checked": _formats.Checked, "_rawf32": rawf32})
    path = str(tmp_path / "w.f32")
    _VALUES.tofile(path)
    other = str(tmp_path / "other.f32")
    (_VALUES * 2).tofile(other)
    _formats.register(fmt)
    try:
        assert "raw float32 `.f32`" in str(_formats.unsupported(str(tmp_path / "x.bin")))
        tree = objckpt.read_tree(path)
        assert [(k, e.shape, e.dtype) for k, e in tree.items()] == [("w", (2,), tf.float32)]
        assert list(_meta.read(path)) == ["w"] and "w" in objckpt.graph(path).dot
        report = objckpt.verify(path)
        assert (report.ok, report.tensors, report.nbytes) == (True, 2, 8)
        module = _module()
        objckpt.restore(module, path)
        assert module.w.numpy().tobytes() == _VALUES.tobytes()
        assert _diff.diff(path, path).same
        assert [(d.path, d.differing) for d in _diff.diff(path, other).values] == [("w", 2)]
    finally:
        _formats.unregister("raw-f32")
    with pytest.raises(errors.UnsupportedFormatError):
        objckpt.read_tree(path)


class _Marker:
    """Unpickling this writes a marker file: proof the pickle was never loaded if absent."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _torch_folder(tmp_path, *names):
    import pickle

    folder = tmp_path / "hub"
    folder.mkdir()
    marker = tmp_path / "UNPICKLED"
    for name in names:
        (folder / name).write_bytes(pickle.dumps(_Marker(str(marker)), protocol=2))
    (folder / "config.json").write_text('{"model_type": "bert"}')
    return folder, marker


@pytest.mark.parametrize("name", ["pytorch_model.bin", "weights.bin", "model.pt", "model.pth",
                                  "pytorch_model-00001-of-00002.bin"])
def test_pytorch_pickles_are_refused_by_every_door_and_never_unpickled(tmp_path, name):
    folder, marker = _torch_folder(tmp_path, name)
    module = _module()
    before = module.w.numpy().tobytes()
    for source in (str(folder / name), str(folder)):
        for door in (objckpt.read_tree, objckpt.verify, lambda s: objckpt.plan(module, s),
                     lambda s: objckpt.restore(module, s),
                     lambda s: objckpt.restore_on_create(module, s), _meta.read):
            with pytest.raises(errors.UnsupportedFormatError) as caught:
                door(source)
            message = str(caught.value)
            assert f"{name}" in message and "never unpickles" in message
            assert "can run any code" in message and "safetensors" in message
            assert "torch.load(" in message and "weights_only=True" in message
            assert "safe_serialization=True" in message
    assert not marker.exists()
    assert module.w.numpy().tobytes() == before


def test_a_sharded_pickle_index_is_refused_and_safetensors_beside_pickles_are_read(tmp_path):
    folder, marker = _torch_folder(tmp_path, "pytorch_model.bin")
    (folder / "pytorch_model.bin.index.json").write_text('{"weight_map": {}}')
    with pytest.raises(errors.UnsupportedFormatError, match="never unpickles"):
        objckpt.read_tree(str(folder / "pytorch_model.bin.index.json"))
    module = _module()
    module.w.assign([7.0, 8.0])
    objckpt.export(module, str(folder))  # model.safetensors beside pytorch_model.bin
    other = _module()
    objckpt.restore(other, str(folder))
    assert other.w.numpy().tolist() == [7.0, 8.0]
    assert list(objckpt.read_tree(str(folder))) == ["w"]
    assert not marker.exists()
