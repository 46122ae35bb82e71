"""safetensors as a source: files written by the `safetensors` library (the
oracle) read back bit for bit, single and sharded; restores into every flavour by object
path, by rules and through a transform; crafted headers refused before any byte is read;
the command line's `inspect` and `verify` without TensorFlow."""

import json
import random
import struct

import numpy as np
import pytest
import tensorflow as tf

import objckpt
from objckpt import errors
from objckpt._formats import safetensors as _st
from objckpt._inspect import meta as _meta
from objckpt._inspect import verify as _verify

from flavours import FLAVOURS, build
from support import run_cli

safetensors = pytest.importorskip("safetensors")
pytest.importorskip("safetensors.numpy")  # the oracle's NumPy writer: `safetensors.numpy`
ml_dtypes = pytest.importorskip("ml_dtypes")

# safetensors dtype -> the NumPy / ml_dtypes name the library takes (its TensorSpec), where
# this ml_dtypes has it; F4 is written as packed pairs (`float4_e2m1fn_x2`).
_WRITTEN = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
            "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
            "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
            "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
            "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
            "F8_E5M2FNUZ": "float8_e5m2fnuz", "F4": "float4_e2m1fn_x2"}


def _save(path, tensors: dict, metadata=None) -> str:
    """Writes {name: (spec dtype, shape, raw bytes)} with the `safetensors` library."""
    keep = {name: np.frombuffer(raw, np.uint8).copy() for name, (_, _, raw) in tensors.items()}
    specs = {name: safetensors.TensorSpec(dtype=dtype, shape=shape,
                                          data_ptr=keep[name].ctypes.data if raw else 0,
                                          data_len=len(raw))
             for name, (dtype, shape, raw) in tensors.items()}
    safetensors.serialize_file(specs, str(path), metadata=metadata)
    return str(path)


def _random_bytes(rng: np.random.Generator, dtype: str, count: int) -> bytes:
    if dtype == "BOOL":
        return rng.integers(0, 2, count, np.uint8).tobytes()
    return rng.integers(0, 256, count * _st.DTYPES[dtype][0] // 8, np.uint8).tobytes()


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory):
    """(file, {name: (safetensors dtype, shape, bytes)}): one tensor of each dtype the
    library writes (random bits: NaN payloads, subnormals), plus an empty one and a scalar."""
    rng = np.random.default_rng(31)
    tensors, expected = {}, {}
    for dtype, spec in _WRITTEN.items():
        shape = (2, 3) if dtype != "F4" else (2, 4)
        raw = _random_bytes(rng, dtype, 6 if dtype != "F4" else 8)
        # the library takes F4 as packed pairs: the last dimension halved
        tensors[f"t/{dtype.lower()}"] = (spec, (2, 2) if dtype == "F4" else shape, raw)
        expected[f"t/{dtype.lower()}"] = (dtype, shape, raw)
    tensors["t/empty"] = ("float32", (0, 4), b"")
    expected["t/empty"] = ("F32", (0, 4), b"")
    tensors["t/scalar"] = ("int64", (), struct.pack("<q", -(2 ** 62)))
    expected["t/scalar"] = ("I64", (), struct.pack("<q", -(2 ** 62)))
    path = _save(tmp_path_factory.mktemp("st") / "every.safetensors", tensors,
                 {"format": "pt", "note\x1b[2J": "line\nbreak"})
    return path, expected


def test_every_dtype_listed_and_read_bit_equal(every_dtype):
    path, expected = every_dtype
    header = _st.read_header(path)
    assert {n: (t.dtype, t.shape) for n, t in header.tensors.items()} == {
        n: (d, s) for n, (d, s, _) in expected.items()}
    assert header.metadata == {"format": "pt", "note\x1b[2J": "line\nbreak"}
    listed = _meta.read(path)
    assert sorted(listed) == sorted(expected)
    assert listed["t/bf16"].dtype.name == "bfloat16" and listed["t/bf16"].nbytes == 12
    assert listed["t/f4"].nbytes == 4 and listed["t/f8_e8m0"].dtype.name == "float8_e8m0fnu"
    assert listed.nbytes == sum(len(raw) for _, _, raw in expected.values())
    # Every tensor TF has a dtype for, as TF tensors, bit for bit.
    fields = _st.source_fields(path)
    offered = [n for n, (d, _, _) in expected.items() if _st.DTYPES[d][2]]
    assert sorted(fields["specs"]) == sorted(offered)
    # the float8s too: TF (2.12 on) names them through tf.as_dtype, not as tf.float8_*
    assert {"BOOL", "BF16", "C64", "U64", "F16", "F8_E4M3", "F8_E5M2"} <= {
        expected[n][0] for n in offered}
    for name, value in zip(offered, fields["fetch"](offered)):
        dtype, shape, raw = expected[name]
        assert value.dtype == tf.as_dtype(_st.DTYPES[dtype][2]), name
        assert tuple(value.shape) == shape, name
        assert value.numpy().tobytes() == raw, name
    left = [n for n in expected if n not in offered]
    assert left and any("TF has no such dtype" in note for note in fields["notes"])
    report = _verify.verify(path)
    assert report.ok and report.tensors == len(expected), report.describe()
    assert report.nbytes == listed.nbytes and "no checksums" in report.checked


def _shards(folder, tensors: dict, split: int) -> str:
    """Two shard files and `model.safetensors.index.json` naming them, as Hugging Face
    writes them; returns the index's path."""
    names = list(tensors)
    weight_map = {}
    for i, part in enumerate((names[:split], names[split:])):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        safetensors.numpy.save_file({n: tensors[n] for n in part}, str(folder / shard))
        weight_map.update(dict.fromkeys(part, shard))
    index = folder / _st.INDEX_NAME
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))
    return str(index)


def _module():
    module = tf.Module()
    module.encoder = tf.Module()
    module.encoder.kernel = tf.Variable(tf.zeros((3, 4)))
    module.encoder.bias = tf.Variable(tf.zeros((4,)))
    module.scale = tf.Variable(tf.zeros((), tf.float64))
    return module


def _values(obj) -> dict:
    return {path: v.numpy().copy() for path, v in objckpt.tree(obj).items()}


def test_sharded_index_and_folder(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {"encoder/kernel": rng.standard_normal((3, 4)).astype(np.float32),
               "encoder/bias": rng.standard_normal(4).astype(np.float32),
               "scale": np.array(2.5, np.float64)}
    index = _shards(tmp_path, tensors, 2)
    for source in (index, str(tmp_path)):
        module = _module()
        report = objckpt.restore(module, source)
        assert sorted(report.restored) == sorted(tensors)
        for path, value in _values(module).items():
            assert value.tobytes() == tensors[path].tobytes(), (source, path)
    assert "2 shard files" in _meta.read(str(tmp_path)).description
    assert _verify.verify(index).tensors == 3
    plan = objckpt.plan(_module(), index)
    assert "safetensors index" in plan.describe()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_restore_every_flavour_by_rules_paths_and_transform(flavour, tmp_path):
    model = build(flavour, train=False)
    rng = np.random.default_rng(7)
    written = {path: rng.standard_normal(tuple(v.shape)).astype(v.dtype.as_numpy_dtype)
               for path, v in objckpt.tree(model).items()
               if not path.startswith("optimizer/")}  # weights only, as people share them
    # 1. keys written as the obj's own object paths: matched exactly, no rules.
    exact = str(tmp_path / "exact.safetensors")
    safetensors.numpy.save_file(written, exact)
    fresh = build(flavour, train=False)
    objckpt.restore(fresh, exact, optimizer_state=False)
    assert all(_values(fresh)[p].tobytes() == written[p].tobytes() for p in written)
    # 2. names under a prefix of their own (`backbone.`): matched through rules.
    prefixed = str(tmp_path / "prefixed.safetensors")
    safetensors.numpy.save_file({f"backbone.{p}": v for p, v in written.items()}, prefixed)
    fresh = build(flavour, train=False)
    if flavour == "module":  # no names or layout to go by: without the rule, nothing moves
        before = _values(fresh)
        with pytest.raises(errors.StructureMismatchError):
            objckpt.restore(fresh, prefixed, optimizer_state=False)
        assert all(_values(fresh)[p].tobytes() == before[p].tobytes() for p in before)
    plan = objckpt.plan(fresh, prefixed, rules=[(r"^backbone\.", "")], optimizer_state=False)
    assert {m.strategy for m in plan.matches} == {"rule"}, plan.describe()
    objckpt.restore(fresh, prefixed, rules=[(r"^backbone\.", "")], optimizer_state=False)
    assert all(_values(fresh)[p].tobytes() == written[p].tobytes() for p in written)
    # 3. a torch Linear weight (out, in) into a Keras kernel (in, out): a transform rule.
    kernel = next(p for p, v in written.items() if v.ndim == 2 and v.shape[0] != v.shape[1])
    torch_style = {p: v for p, v in written.items() if p != kernel}
    torch_style["linear.weight"] = np.ascontiguousarray(written[kernel].T)
    transposed = str(tmp_path / "torch.safetensors")
    safetensors.numpy.save_file(torch_style, transposed)
    fresh = build(flavour, train=False)
    plan = objckpt.plan(fresh, transposed, rules=[(r"^linear\.weight$", kernel, tf.transpose)],
                        optimizer_state=False)
    assert "linear.weight" in plan.describe()
    objckpt.restore(fresh, transposed, rules=[(r"^linear\.weight$", kernel, tf.transpose)],
                    optimizer_state=False)
    assert _values(fresh)[kernel].tobytes() == written[kernel].tobytes()


def test_restore_on_create_ensemble_and_migrate(tmp_path):
    rng = np.random.default_rng(3)
    files = []
    for i in range(2):
        values = {"encoder/kernel": rng.standard_normal((3, 4)).astype(np.float32),
                  "encoder/bias": rng.standard_normal(4).astype(np.float32),
                  "scale": np.array(i, np.float64)}
        files.append((str(tmp_path / f"m{i}.safetensors"), values))
        safetensors.numpy.save_file(values, files[-1][0])
    module = _module()
    pending = objckpt.restore_on_create(module, files[0][0])
    pending.assert_done()
    assert module.encoder.kernel.numpy().tobytes() == files[0][1]["encoder/kernel"].tobytes()
    ensemble = objckpt.load_ensemble(_module(), [f for f, _ in files])
    for member, (_, values) in zip(ensemble.members, files):
        assert member.scale.numpy() == values["scale"]
    prefix = objckpt.migrate(_module(), files[1][0], str(tmp_path / "ckpt" / "model"))
    back = _module()
    objckpt.restore(back, prefix)
    assert back.encoder.bias.numpy().tobytes() == files[1][1]["encoder/bias"].tobytes()


def _diff_pair(tmp_path):
    """(a TF checkpoint of a tf.Module, a safetensors file of the same values under its
    object paths, {path: (spec dtype, shape, bytes)})."""
    module = tf.Module()
    module.f32 = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    module.bf16 = tf.Variable(tf.constant([1.5, -2.0, float("nan")], tf.bfloat16))
    module.counts = tf.Variable(np.array([-3, 2 ** 40], np.int64))
    module.flags = tf.Variable([True, False])
    prefix = objckpt.save(module, str(tmp_path / "ckpt" / "model"))
    tensors = {path: (v.dtype.name, tuple(v.shape), v.numpy().tobytes())
               for path, v in objckpt.tree(module).items()}
    return prefix, _save(tmp_path / "same.safetensors", tensors), tensors


def test_diff_against_a_tf_checkpoint(tmp_path):
    prefix, same, tensors = _diff_pair(tmp_path)
    from objckpt._inspect import diff as _diff

    result = _diff.diff(same, prefix)
    assert result.same and result.equal == 4, result
    changed = dict(tensors)
    dtype, shape, raw = changed["bf16"]
    changed["bf16"] = (dtype, shape, raw[:2] + struct.pack("<H", 0x4000) + raw[4:])  # 2.0
    other = _save(tmp_path / "other.safetensors", changed)
    result = _diff.diff(other, prefix)
    assert [(d.path, d.max_abs_diff, d.differing) for d in result.values] == [("bf16", 4.0, 1)]
    assert result.equal == 3


@pytest.mark.subprocess
def test_cli_diff_without_tensorflow(tmp_path):
    prefix, same, tensors = _diff_pair(tmp_path)
    shown = run_cli("diff", same, prefix)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    changed = dict(tensors)
    changed["counts"] = ("int64", (2,), struct.pack("<2q", -3, 7))
    other = _save(tmp_path / "other.safetensors", changed)
    shown = run_cli("diff", other, prefix)
    assert shown.returncode == 1 and "counts" in shown.stdout, shown.stdout + shown.stderr


def test_sub_byte_dtypes_listed_verified_and_sized_whole(tmp_path):
    """6- and 4-bit floats: listed with fractional sizes, verified, not offered to TF; a
    tensor whose bits do not fill whole bytes is refused."""
    path = tmp_path / "small.safetensors"
    path.write_bytes(_raw({"six": _entry("F6_E2M3", (4,), (0, 3)),
                           "four": _entry("F4", (2, 3), (3, 6))}, bytes(range(6))))
    listed = _meta.read(str(path))
    assert (listed["six"].nbytes, listed["four"].nbytes) == (3, 3)
    assert _verify.verify(str(path)).tensors == 2
    fields = _st.source_fields(str(path))
    assert fields["specs"] == {} and "F4, F6_E2M3" in fields["notes"][-1]
    assert _st.read_array(_st.read_model(str(path)), "six").tolist() == [0, 1, 2]
    path.write_bytes(_raw({"four": _entry("F4", (3,), (0, 2))}, bytes(2)))
    with pytest.raises(errors.CheckpointCorruptError, match=r"1\.5 bytes, but its data_offsets"):
        _st.read_header(str(path))


def test_bool_bytes_other_than_0_and_1_read_as_true(tmp_path):
    """A BOOL byte of 2 or 255 (the format does not forbid them) is True, a proper one."""
    path = tmp_path / "flags.safetensors"
    path.write_bytes(_raw({"flags": _entry("BOOL", (4,), (0, 4))}, b"\x00\x01\x02\xff"))
    module = tf.Module()
    module.flags = tf.Variable([True, False, False, False])
    objckpt.restore(module, str(path))
    assert module.flags.numpy().view(np.uint8).tolist() == [0, 1, 1, 1]
    read = _st.read_array(_st.read_model(str(path)), "flags")
    assert read.view(np.uint8).tolist() == [0, 1, 1, 1]


# --- crafted headers -------------------------------------------------------------------

def _raw(header, data: bytes = b"", *, length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


# name -> (file bytes, words the error must hold)
CRAFTED = {
    "overlap": (_raw({"a": _entry(offsets=(0, 8)), "b": _entry(offsets=(4, 12))}, bytes(12)),
                ["`b`", "overlaps `a`"]),
    "past_end": (_raw({"a": _entry(shape=(4,), offsets=(0, 16))}, bytes(8)),
                 ["`a`", "outside the data buffer"]),
    "terabyte": (_raw({"a": _entry(shape=(1 << 18, 1 << 20), offsets=(0, 1 << 40))}, bytes(8)),
                 ["`a`", "outside the data buffer"]),
    "terabyte_shape": (_raw({"a": _entry(shape=(1 << 20, 1 << 20), offsets=(0, 8))}, bytes(8)),
                       ["`a`", "more elements than the data buffer"]),
    "header_past_file": (_raw({"a": _entry()}, bytes(8), length=10_000),
                         ["10,000 bytes, past the file's end"]),
    "header_too_long": (_raw({"a": _entry()}, bytes(8), length=1 << 40),
                        ["at most 100,000,000"]),
    "short": (b"\x01\x02", ["holds 2 bytes"]),
    "not_utf8": (_raw(b'{"\xff\xfe": {}}'), ["not valid UTF-8"]),
    "not_object": (_raw(b"[1, 2]"), ["does not start with `{`"]),
    "not_json": (_raw(b"{not json"), ["not valid JSON"]),
    "duplicate": (_raw(b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
                       b'"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
                       bytes(8)), ["`a`", "named twice"]),
    "bad_dtype": (_raw({"a": _entry(dtype="F128")}, bytes(8)), ["`a`", "dtype `F128`"]),
    "negative_dim": (_raw({"a": _entry(shape=(-2,))}, bytes(8)), ["`a`", "non-negative"]),
    "float_dim": (_raw({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}},
                       bytes(8)), ["`a`", "non-negative integers"]),
    "bool_dim": (_raw({"a": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}},
                      bytes(8)), ["`a`", "non-negative integers"]),
    "size_mismatch": (_raw({"a": _entry(shape=(3,), offsets=(0, 8))}, bytes(12)),
                      ["`a`", "12 bytes", "span 8 bytes"]),
    "gap": (_raw({"a": _entry(offsets=(4, 12))}, bytes(12)), ["`a`", "no gaps"]),
    "trailing": (_raw({"a": _entry()}, bytes(12)), ["4 bytes after its last tensor"]),
    "metadata_not_strings": (_raw({"__metadata__": {"k": 1}, "a": _entry()}, bytes(8)),
                             ["`__metadata__`", "not an object of strings"]),
    "entry_not_object": (_raw({"a": [1, 2]}, bytes(8)), ["`a`", "not an object"]),
    "missing_offsets": (_raw({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)),
                        ["`a`", "lacks `data_offsets`"]),
    "nan_constant": (_raw(b'{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 8]}}',
                          bytes(8)), ["not valid JSON"]),
    "deep": (_raw(b"{" + b'"a":' * 1 + b"[" * 100_000 + b"]" * 100_000 + b"}"),
             ["not valid JSON"]),
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_header_refused_before_any_assignment(name, tmp_path):
    raw, words = CRAFTED[name]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    module = tf.Module()
    module.a = tf.Variable([7.0, 8.0])
    with pytest.raises(errors.CheckpointCorruptError) as caught:
        objckpt.restore(module, str(path))
    message = str(caught.value)
    assert "bad.safetensors" in message and "Fix:" in message
    for word in words:
        assert word in message, (word, message)
    assert module.a.numpy().tolist() == [7.0, 8.0]
    with pytest.raises(errors.CheckpointCorruptError):
        _meta.read(str(path))
    report = _verify.verify(str(path))
    assert not report.ok and words[-1] in report.describe()


def test_index_refuses_hostile_shards(tmp_path):
    safetensors.numpy.save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "s1.safetensors"))
    safetensors.numpy.save_file({"a": np.ones(2, np.float32), "b": np.ones(1, np.float32)},
                                str(tmp_path / "s2.safetensors"))
    cases = {"../s1.safetensors": "expected a file name beside the index",
             "/etc/s1.safetensors": "expected a file name beside the index",
             "s1.bin": "expected a file name beside the index"}
    for shard, words in cases.items():
        (tmp_path / _st.INDEX_NAME).write_text(json.dumps({"weight_map": {"a": shard}}))
        with pytest.raises(errors.CheckpointCorruptError, match=words):
            _st.read_model(str(tmp_path))
    (tmp_path / _st.INDEX_NAME).write_text(json.dumps(
        {"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    with pytest.raises(errors.CheckpointCorruptError, match="is in two shards"):
        _st.read_model(str(tmp_path))
    (tmp_path / _st.INDEX_NAME).write_text(json.dumps(
        {"weight_map": {"a": "s1.safetensors", "c": "s1.safetensors"}}))
    with pytest.raises(errors.CheckpointCorruptError, match=r"`c`.*does not hold it"):
        _st.read_model(str(tmp_path))


@pytest.mark.fuzz
def test_mutated_headers_give_typed_errors_or_exact_values(tmp_path):
    """Seeded byte flips, truncations and JSON edits of a valid file: every outcome is a
    typed error (nothing assigned) or a restore of exactly what the header then says."""
    good = str(tmp_path / "good.safetensors")
    safetensors.numpy.save_file({"a": np.arange(4, dtype=np.float32),
                                 "b": np.arange(6, dtype=np.int64).reshape(2, 3)}, good)
    base = (tmp_path / "good.safetensors").read_bytes()
    rng = random.Random(31)
    path = tmp_path / "case.safetensors"
    outcomes = {"typed": 0, "ok": 0}
    for i in range(300):
        raw = bytearray(base)
        kind = i % 4
        if kind == 0:  # flip bytes anywhere in the length and header
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(min(len(raw), 8 + 120))] = rng.randrange(256)
        elif kind == 1:  # truncate
            raw = raw[:rng.randrange(len(raw))]
        elif kind == 2:  # rewrite a digit of the header (offsets, shapes)
            digits = [j for j in range(8, len(raw)) if chr(raw[j]).isdigit() and j < 8 + 120]
            raw[rng.choice(digits)] = ord(str(rng.randrange(10)))
        else:  # a wrong length
            raw[:8] = struct.pack("<Q", rng.choice([0, 1, 7, len(raw), 2 ** 63, 2 ** 64 - 1,
                                                    struct.unpack("<Q", base[:8])[0] - 1]))
        path.write_bytes(bytes(raw))
        module = tf.Module()
        module.a = tf.Variable(tf.fill((4,), -1.0))
        module.b = tf.Variable(tf.fill((2, 3), tf.constant(-1, tf.int64)))
        try:
            header = _st.read_header(str(path))
        except errors.CheckpointCorruptError as err:
            assert "Fix:" in str(err)
            with pytest.raises(errors.ObjckptError):
                objckpt.restore(module, str(path))
            assert module.a.numpy().tolist() == [-1.0] * 4
            outcomes["typed"] += 1
            continue
        # The header still validates: what restore gives equals the bytes it names.
        try:
            objckpt.restore(module, str(path))
        except errors.ObjckptError:
            assert module.a.numpy().tolist() == [-1.0] * 4
            continue
        data = bytes(raw)
        for name in ("a", "b"):
            t = header.tensors[name]
            assert getattr(module, name).numpy().tobytes() == data[t.begin:t.end]
        outcomes["ok"] += 1
    assert outcomes["typed"] > 200


# --- the command line, without TensorFlow ------------------------------------------------

@pytest.mark.subprocess
def test_cli_inspect_graph_and_verify_without_tensorflow(every_dtype, tmp_path):
    path, expected = every_dtype
    shown = run_cli("inspect", path)
    assert shown.returncode == 0, shown.stderr
    assert "bf16" in shown.stdout and "bfloat16" in shown.stdout
    assert "safetensors file" in shown.stdout
    assert "metadata `format`" not in shown.stderr  # what every writer puts there: no note
    assert "\x1b" not in shown.stdout + shown.stderr and "line\\nbreak" in shown.stderr
    listed = run_cli("inspect", path, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert sorted(v["path"] for v in document["variables"]) == sorted(expected)
    drawn = run_cli("graph", path)
    assert drawn.returncode == 0 and "bf16" in drawn.stdout, drawn.stderr
    checked = run_cli("verify", path)
    assert checked.returncode == 0, checked.stderr
    assert f"OK: {path}: {len(expected)} tensors" in checked.stdout
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(CRAFTED["overlap"][0])
    failed = run_cli("verify", str(bad))
    assert failed.returncode == 1 and "overlaps `a`" in failed.stdout + failed.stderr
    refused = run_cli("inspect", str(bad))
    assert refused.returncode != 0 and "Fix:" in refused.stderr
    assert "Traceback" not in refused.stderr


def _layers_module(count: int, shape: tuple, dtype=tf.float32) -> tf.Module:
    """A tf.Module with `layer{i}/kernel` variables of `shape` and `dtype`, all zero."""
    module = tf.Module()
    for i in range(count):
        layer = tf.Module()
        layer.kernel = tf.Variable(tf.zeros(shape, dtype))
        setattr(module, f"layer{i}", layer)
    return module


def test_plan_traces_each_own_transform_once_per_shape(tmp_path, monkeypatch):
    """A model's layers share a transform and a shape: objckpt's own transforms are traced
    once for all of them (the plan and the restore are what they were); a callable of the
    user's is traced for each entry. A transform that fails names each rule that uses it."""
    from objckpt._planning import plans as _plans

    rng = np.random.default_rng(17)
    written = {f"model.layers.{i}.weight": rng.standard_normal((6, 4)).astype(np.float32)
               for i in range(5)}
    path = str(tmp_path / "model.safetensors")
    safetensors.numpy.save_file(written, path)
    traced = []
    trace = _plans._traced

    def counted(transform, shape, dtype):
        traced.append(transform)
        return trace(transform, shape, dtype)

    monkeypatch.setattr(_plans, "_traced", counted)
    monkeypatch.setattr(_plans, "_TRACED", {})
    rules = [(r"^model\.layers\.(\d+)\.weight$", r"layer\1/kernel", objckpt.rules.Transpose())]
    module = _layers_module(5, (4, 6))
    plan = objckpt.plan(module, path, rules=rules)
    assert plan.complete and len(plan.matches) == 5 and len(traced) == 1, plan.describe()
    objckpt.restore(module, path, rules=rules)
    assert len(traced) == 1
    for i in range(5):
        assert getattr(module, f"layer{i}").kernel.numpy().tobytes() == \
            np.ascontiguousarray(written[f"model.layers.{i}.weight"].T).tobytes()
    traced.clear()
    objckpt.plan(_layers_module(5, (4, 6)), path,
                 rules=[(r"^model\.layers\.(\d+)\.weight$", r"layer\1/kernel", tf.transpose)])
    assert len(traced) == 5
    # one Reshape expecting another shape, under two rules: each problem names its rule
    wrong = objckpt.rules.Reshape((4, 6), (24,))
    two = [(r"^model\.layers\.0\.weight$", "layer0/kernel", wrong),
           (r"^model\.layers\.1\.weight$", "layer1/kernel", wrong)]
    traced.clear()
    plan = objckpt.plan(_layers_module(2, (24,)), path, rules=two, strict=False)
    problems = [str(p) for p in plan.mismatched]
    assert len(traced) == 1 and len(problems) == 2, problems
    for i in (0, 1):
        assert any(p.startswith(f"`layer{i}/kernel`: rule {i} (") and "expects a value of "
                   "shape (4, 6)" in p for p in problems), problems


@pytest.mark.skipif(tuple(int(p) for p in tf.__version__.split(".")[:2]) < (2, 13),
                    reason="TF 2.12: its bfloat16 is not ml_dtypes' (tf.constant refuses it)")
def test_streamed_budget_counts_the_transform_and_the_cast(tmp_path, monkeypatch):
    """bfloat16 (out, in) weights into float32 (in, out) kernels, streamed: values widened
    bit-exactly, and each entry counted in the streaming budget with its bytes as read, as
    transposed and as cast (2 + 2 + 4 bytes per element), the budget's limit the largest."""
    rng = np.random.default_rng(19)
    shapes = [(2048, 1024), (1024, 2048), (512, 64)]  # above the streaming threshold
    written = {f"model.layers.{i}.weight": rng.standard_normal(s).astype(ml_dtypes.bfloat16)
               for i, s in enumerate(shapes)}
    path = str(tmp_path / "model.safetensors")
    safetensors.numpy.save_file(written, path)
    module = tf.Module()
    for i, (rows, cols) in enumerate(shapes):
        layer = tf.Module()
        layer.kernel = tf.Variable(tf.zeros((cols, rows), tf.float32))
        setattr(module, f"layer{i}", layer)
    held = []
    assign = _st._Streamer.assign

    def recorded(self):
        held.append(list(self._held))
        return assign(self)

    monkeypatch.setattr(_st._Streamer, "assign", recorded)
    report = objckpt.restore(
        module, path,
        rules=[(r"^model\.layers\.(\d+)\.weight$", r"layer\1/kernel", objckpt.rules.Transpose())])
    assert len(report.restored) == 3
    assert held == [[rows * cols * 8 for rows, cols in shapes]]
    for i in range(3):
        expected = np.ascontiguousarray(written[f"model.layers.{i}.weight"].T).astype(np.float32)
        assert getattr(module, f"layer{i}").kernel.numpy().tobytes() == expected.tobytes()
