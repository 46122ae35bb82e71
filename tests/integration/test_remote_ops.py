"""Every Python operation that reads or writes checkpoints, on gs:// and s3:// URLs.

`restore` (a prefix; a directory with a state object; one without), `plan`, `read_tree`,
`verify`, `restore_on_create`, `load_ensemble` and `migrate` (a remote TF1 name-based
checkpoint to a remote prefix), each against fake-gcs-server and moto (storage_servers.py,
module scope) with a small model of the session's Keras (Keras 3, or tf_keras: Dense +
BatchNorm, Adam, one step, so optimizer slots exist) and a plain tf.Module. Messages and
reports name the URL, never the local staged copy; a missing client and an unreachable
endpoint are typed errors naming the URL.
"""

import logging
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf
from storage_servers import (  # noqa: F401
    FakeSleeps,
    FaultProxy,
    gcs_server_fixture,
    s3_server_fixture,
    store_fixture,
    use_env,
)

import objckpt
from objckpt import errors
from objckpt._bundle import remote as _remote
from objckpt._bundle import state as _ckptstate

from flavours import dense_bn, keras_for, session_flavour
from support import assert_bits, build_optimizer, values

BUCKET = "objckpt-ops"
STAGED = "objckpt-staged-"  # the local copies' folder names: never in a message


store = store_fixture(BUCKET)


class Net(tf.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w = tf.Variable(rng.normal(size=(3, 2)).astype(np.float32))
        self.b = tf.Variable(rng.normal(size=(2,)).astype(np.float64))
        self.step = tf.Variable(np.int64(seed))


@pytest.fixture(scope="module")
def saved(store):
    """Checkpoints in the store: Keras and module prefixes; a directory whose state object
    names ckpt-1 though ckpt-2 is newer; a directory without one (ckpt-1, ckpt-2)."""
    root = store.folder()
    keras_models = {n: dense_bn(n) for n in (1, 2)}
    modules = {n: Net(n) for n in (1, 2)}
    out = {"keras": {n: values(m) for n, m in keras_models.items()},
           "module": {n: values(m) for n, m in modules.items()}, "root": root,
           "weights": {n: weights(m) for n, m in keras_models.items()}}
    for kind, objs in (("keras", keras_models), ("module", modules)):
        for n, obj in objs.items():
            objckpt.save(obj, f"{root}/{kind}/ckpt-{n}")
        objckpt.save(objs[1], f"{root}/{kind}-state/ckpt-1")
        objckpt.save(objs[2], f"{root}/{kind}-state/ckpt-2")
        _ckptstate.write_state(f"{root}/{kind}-state", ["ckpt-1"], 1.0)
    return out


def weights(model) -> dict:
    """{index: host copy} of a Keras model's own weights (no optimizer's), in its order."""
    return {str(i): np.array(w.numpy()) for i, w in enumerate(model.weights)}


def fresh(kind: str):
    return dense_bn(99, train=False) if kind == "keras" else Net(99)


def no_staged_path(text) -> None:
    assert STAGED not in str(text), text


# --- restore, plan, read_tree ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["keras", "module"])
def test_restore_prefix_and_directories(store, saved, kind):
    root = saved["root"]
    obj = fresh(kind)
    if kind == "keras":  # the optimizer's slots exist before, so they are restored too
        build_optimizer(obj)
    report = objckpt.restore(obj, f"{root}/{kind}/ckpt-2")
    assert_bits(saved[kind][2], values(obj), f"{kind} prefix")
    assert f"`{root}/{kind}/ckpt-2`" in str(report)
    no_staged_path(report)
    # A directory with a state object: the checkpoint it names (ckpt-1), not the newest.
    objckpt.restore(obj, f"{root}/{kind}-state")
    assert_bits(saved[kind][1], values(obj), f"{kind} directory with a state object")
    # Without one: the highest number (ckpt-2).
    objckpt.restore(obj, f"{root}/{kind}")
    assert_bits(saved[kind][2], values(obj), f"{kind} directory without a state object")


def test_plan_and_read_tree_name_the_url(store, saved):
    root = saved["root"]
    model = fresh("keras")
    build_optimizer(model)
    plan = objckpt.plan(model, f"{root}/keras-state")
    assert plan.complete, plan.describe()
    assert len(plan.matches) == len(saved["keras"][1])
    assert f"checkpoint `{root}/keras-state/ckpt-1`" in plan.describe()
    no_staged_path(plan.describe())
    tree = objckpt.read_tree(f"{root}/keras/ckpt-1")
    assert tree.prefix == f"{root}/keras/ckpt-1"
    assert set(tree) == set(objckpt.tree(model))
    assert {tuple(e.shape) for e in tree.values()} == {
        tuple(v.shape) for v in saved["keras"][1].values()}
    module_tree = objckpt.read_tree(f"{root}/module")  # a directory: its newest, ckpt-2
    assert module_tree.prefix == f"{root}/module/ckpt-2"
    assert sorted(module_tree) == ["b", "step", "w"]


def test_a_mismatch_names_the_url_not_the_staged_copy(store, saved):
    root = saved["root"]
    keras = keras_for(session_flavour())
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5, name="d")])
    before = values(other)
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.restore(other, f"{root}/keras/ckpt-1")
    assert caught.value.source == f"{root}/keras/ckpt-1"
    assert f"checkpoint `{root}/keras/ckpt-1`" in str(caught.value)
    no_staged_path(caught.value)
    assert_bits(before, values(other), "a refused restore")


def test_a_damaged_object_graph_names_the_url(store, saved):
    """The index is sound (resolving checks it remotely) but the object graph's bytes are
    not: the error is raised while the staged copy is read, and names the URL."""
    prefix = f"{store.folder()}/ckpt"
    objckpt.save(Net(3), prefix)
    fs, path = _remote.client(prefix + ".data-00000-of-00001")
    data = bytearray(fs.cat_file(path))
    at = data.find(b"\x0a", 0)  # the graph proto's first field tag, corrupted
    data[at] ^= 0xFF
    fs.pipe_file(path, bytes(data))
    for operation in (lambda: objckpt.restore(Net(99), prefix),
                      lambda: objckpt.read_tree(prefix)):
        with pytest.raises(errors.CheckpointCorruptError) as caught:
            operation()
        assert prefix in str(caught.value)
        no_staged_path(caught.value)
        assert caught.value.source == prefix
    report = objckpt.verify(prefix)
    assert not report.ok and report.prefixes == (prefix,)
    assert all(p.prefix == prefix for p in report.problems), report.describe()
    no_staged_path(report.describe())


# --- verify ---------------------------------------------------------------------------------


def test_verify_prefixes_and_directories(store, saved):
    root = saved["root"]
    report = objckpt.verify(f"{root}/keras/ckpt-1")
    assert report.ok, report.describe()
    assert report.prefixes == (f"{root}/keras/ckpt-1",)
    assert report.tensors == len(saved["keras"][1]) and report.nbytes > 0
    assert f"OK: {root}/keras/ckpt-1: {report.tensors} tensors" in report.describe()
    # Without a state object: every checkpoint there, oldest first.
    assert objckpt.verify(f"{root}/module").prefixes == (f"{root}/module/ckpt-1",
                                                          f"{root}/module/ckpt-2")
    # With one: those it names.
    assert objckpt.verify(f"{root}/module-state").prefixes == (f"{root}/module-state/ckpt-1",)
    with pytest.raises(errors.CheckpointNotFoundError, match="objects under"):
        objckpt.verify(f"{root}/nothing-here")


def test_verify_finds_a_damaged_tensor_and_a_missing_data_object(store):
    prefix = f"{store.folder()}/ckpt"
    objckpt.save(Net(4), prefix)
    data = prefix + ".data-00000-of-00001"
    fs, path = _remote.client(data)
    original = fs.cat_file(path)
    w = np.asarray(Net(4).w.numpy()).tobytes()
    damaged = bytearray(original)
    damaged[original.find(w)] ^= 0x01  # one bit of `w`
    fs.pipe_file(path, bytes(damaged))
    report = objckpt.verify(prefix)
    assert [(p.prefix, p.where) for p in report.problems] == [(prefix, "w")], report.describe()
    assert "checksum" in report.problems[0].message
    assert report.tensors == 2  # b and step intact
    no_staged_path(report.describe())
    fs.rm_file(path)
    report = objckpt.verify(prefix)
    assert [p.prefix for p in report.problems] == [prefix]
    assert f"`{data}` is missing" in report.problems[0].message


# --- restore_on_create, load_ensemble, migrate ------------------------------------------------


def test_restore_on_create_from_a_url(store, saved):
    root = saved["root"]
    keras = keras_for(session_flavour())
    model = keras.Sequential([keras.layers.Dense(4, name="d"),
                              keras.layers.BatchNormalization(name="bn"),
                              keras.layers.Dense(2, name="o")], name="net")
    pending = objckpt.restore_on_create(model, f"{root}/keras/ckpt-1", optimizer_state=False)
    assert pending.pending and f"`{root}/keras/ckpt-1`" in repr(pending)
    model.build((None, 3))
    pending.assert_done()
    assert_bits(saved["weights"][1], weights(model), "deferred")


def test_load_ensemble_of_remote_checkpoints(store, saved):
    root = saved["root"]
    sources = [f"{root}/keras/ckpt-1", f"{root}/keras/ckpt-2", f"{root}/keras-state"]
    ensemble = objckpt.load_ensemble(fresh("keras"), sources, optimizer_state=False)
    assert len(ensemble.members) == 3
    for member, n in zip(ensemble.members, (1, 2, 1)):
        assert_bits(saved["weights"][n], weights(member), f"member from ckpt-{n}")
    x = np.ones((2, 3), np.float32)
    outputs = np.asarray(ensemble(x))
    # Members 0 and 2 hold the same weights; batched, they run at different positions of
    # one batched matmul, which CPU kernels (oneDNN) may block differently by position: the
    # same to float rounding, not always to the bit (docs/guarantees.md).
    np.testing.assert_allclose(outputs[0], outputs[2], rtol=1e-6, atol=1e-6)
    for k, member in enumerate(ensemble.members):
        np.testing.assert_allclose(outputs[k], member(x), rtol=1e-6, atol=1e-6)
    assert not np.allclose(outputs[0], outputs[1], rtol=1e-3, atol=1e-3)


def _tf1_checkpoint(directory: str) -> tuple[str, dict]:
    """A TF1 Saver (name-based) checkpoint, written locally: `model_001/w`, `model_001/b`,
    `model_001/step` and `global_step`; returns (prefix, {name: value})."""
    want = {"model_001/w": np.arange(6, dtype=np.float32).reshape(3, 2),
            "model_001/b": np.array([0.5, -1.5]), "model_001/step": np.int64(7)}
    with tf.Graph().as_default():
        for name, value in want.items():
            tf.compat.v1.get_variable(name, initializer=tf.constant(value))
        tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            prefix = tf.compat.v1.train.Saver().save(
                session, os.path.join(directory, "model.ckpt"), global_step=1000,
                write_meta_graph=False)
    return prefix, want


def upload(local_prefix: str, url_prefix: str) -> None:
    """The files of a local checkpoint copied to a URL prefix with the client, as is."""
    directory, name = os.path.split(local_prefix)
    for file in os.listdir(directory):
        if file.startswith(name + "."):
            fs, path = _remote.client(url_prefix + file[len(name):])
            fs.put_file(os.path.join(directory, file), path)


def test_migrate_a_remote_tf1_checkpoint_to_a_remote_prefix(store, tmp_path):
    local, want = _tf1_checkpoint(str(tmp_path))
    source = f"{store.folder()}/tf1/model.ckpt-1000"
    upload(local, source)
    destination = f"{store.folder()}/migrated/ckpt"
    written = objckpt.migrate(Net(99), source, destination,
                              rules=[("^model_001/", ""), ("^global_step$", None)])
    assert written == destination
    assert _remote.listdir(destination.rsplit("/", 1)[0]) == [
        "ckpt.data-00000-of-00001", "ckpt.index"]  # nothing else: no temporary object
    restored = Net(98)
    objckpt.restore(restored, destination)
    for name, value in want.items():
        np.testing.assert_array_equal(getattr(restored, name.split("/")[1]).numpy(), value)
    assert objckpt.verify(destination).ok
    # What objckpt wrote TF reads: the uploaded objects, copied back as they are.
    copy = str(tmp_path / "copy" / "ckpt")
    os.makedirs(os.path.dirname(copy))
    for suffix in (".index", ".data-00000-of-00001"):
        fs, path = _remote.client(destination + suffix)
        fs.get_file(path, copy + suffix)
    plain = Net(97)
    tf.train.Checkpoint(root=plain).read(copy).assert_consumed()
    np.testing.assert_array_equal(plain.w.numpy(), want["model_001/w"])


def test_migrate_refuses_before_writing_anything_remote(store, tmp_path):
    local, _ = _tf1_checkpoint(str(tmp_path))
    source = f"{store.folder()}/tf1/model.ckpt-1000"
    upload(local, source)
    destination = f"{store.folder()}/migrated"
    with pytest.raises(errors.StructureMismatchError) as caught:
        objckpt.migrate(Net(99), source, destination + "/ckpt")  # no rules: nothing matches
    assert f"`{source}`" in str(caught.value)
    no_staged_path(caught.value)
    assert _remote.listdir(destination) == []


def test_migrate_whose_upload_fails_commits_nothing(store, saved, monkeypatch):
    """The storage refuses every upload: a typed CheckpointWriteError naming the URL; no
    index at the destination (so no checkpoint: an upload's index goes last), and the
    directory's other checkpoint intact and still its newest."""
    FakeSleeps().install(monkeypatch)  # the clients' back-off on a fake clock
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    directory = store.folder()
    objckpt.save(Net(5), f"{directory}/ckpt-1")
    source = f"{saved['root']}/module/ckpt-1"
    uploads = "PUT" if store.scheme == "s3" else "POST"
    with FaultProxy(store.server) as proxy, use_env(proxy.env):
        proxy.fail_next(1000, status=503, method=uploads)
        with pytest.raises(errors.CheckpointWriteError) as caught:
            objckpt.migrate(Net(99), source, f"{directory}/ckpt-2")
        assert caught.value.source == f"{directory}/ckpt-2"
        assert f"`{directory}/ckpt-2`" in str(caught.value) and proxy.failed > 0
    assert "ckpt-2.index" not in _remote.listdir(directory)
    restored = Net(98)
    objckpt.restore(restored, directory)  # ckpt-1: the directory's one intact checkpoint
    assert_bits(values(Net(5)), values(restored), "the checkpoint a failed migrate kept")


# --- what is missing or unreachable -----------------------------------------------------------


def test_a_missing_client_names_the_extra(store, monkeypatch):
    import fsspec  # installed with the clients (the store's emulator runs: they are here)

    scheme = store.scheme
    real = fsspec.get_filesystem_class

    def without_client(protocol):
        if protocol == scheme:
            raise ImportError(f"Install {'gcsfs' if scheme == 'gs' else 's3fs'} to access it")
        return real(protocol)

    monkeypatch.setattr(fsspec, "get_filesystem_class", without_client)
    # A setting no client was made for yet: the next URL of the scheme makes a new client.
    monkeypatch.setenv("AWS_PROFILE" if scheme == "s3" else "GOOGLE_APPLICATION_CREDENTIALS",
                       f"objckpt-test-{uuid.uuid4().hex[:6]}")
    url = f"{store.folder()}/ckpt"
    extra = "gcs" if scheme == "gs" else "s3"
    for operation in (lambda: objckpt.restore(Net(99), url), lambda: objckpt.verify(url),
                      lambda: objckpt.read_tree(url)):
        with pytest.raises(errors.MissingDependencyError) as caught:
            operation()
        assert f'`python3 -m pip install ".[{extra}]"` in objckpt\'s checkout' in \
            str(caught.value)  # the package is installed from a checkout, not from PyPI
        assert "objckpt[" not in str(caught.value)
        assert url in str(caught.value)


def test_a_url_of_one_object_is_no_checkpoint(store):
    """A file of another format at a URL (read from local paths only) is refused, saying so;
    a URL where nothing is stays "not found"."""
    url = f"{store.folder()}/model.weights.h5"
    fs, path = _remote.client(url)
    fs.pipe_file(path, b"\x89HDF\r\n\x1a\n" + bytes(100))
    for operation in (lambda: objckpt.restore(Net(99), url), lambda: objckpt.verify(url),
                      lambda: objckpt.plan(Net(99), url)):
        with pytest.raises(errors.UnsupportedFormatError, match="is one object, not a TF "
                                                                "checkpoint") as caught:
            operation()
        assert caught.value.source == url and "Fix: copy it to a local path" in str(caught.value)
    with pytest.raises(errors.CheckpointNotFoundError):
        objckpt.restore(Net(99), url + "-missing")


def test_a_scheme_without_any_client_names_the_package():
    with pytest.raises(errors.MissingDependencyError, match=r"pip install adlfs") as caught:
        objckpt.restore(Net(99), "az://container/run/ckpt")
    assert "az://container/run/ckpt" in str(caught.value)


def test_a_save_to_a_bucket_that_does_not_exist_says_so(store):
    """objckpt.save, CheckpointManager and Checkpointing's directory on a bucket nobody
    made: the error names the bucket, says it does not exist and how to make it (it said
    "Expected the storage to accept the upload"); nothing is written anywhere."""
    bucket = f"objckpt-absent-{uuid.uuid4().hex[:8]}"
    create = {"gs": f"gcloud storage buckets create gs://{bucket}",
              "s3": f"aws s3 mb s3://{bucket}"}[store.scheme]
    url = f"{store.scheme}://{bucket}/run"

    def save_once():
        with objckpt.CheckpointManager(Net(1), f"{url}/managed", verbose=0) as manager:
            manager.save(1)

    for operation in (lambda: objckpt.save(Net(1), f"{url}/ckpt"), save_once):
        with pytest.raises(errors.CheckpointWriteError) as caught:
            operation()
        message = str(caught.value)
        assert f"the bucket `{bucket}` does not exist" in message, message
        assert f"Fix: create the bucket (`{create}`" in message
        assert "Expected the storage to accept" not in message
        assert STAGED not in message
    fs, _ = _remote.client(url)
    assert not fs.exists(bucket)


def test_objckpt_asks_an_emulator_for_no_google_credentials(store, monkeypatch, caplog):
    """With STORAGE_EMULATOR_HOST set, objckpt's own calls neither look for Google
    credentials (google-auth's default chain, which ends at the GCE metadata server) nor
    ask for each bucket's layout (gcsfs's "Could not determine bucket type" warnings)."""
    if store.scheme != "gs":
        pytest.skip("GCS's client only: S3's is pointed at moto by the AWS settings")
    import google.auth

    asked = []

    def default(*args, **kwargs):
        asked.append(args)
        raise google.auth.exceptions.DefaultCredentialsError("not here")

    monkeypatch.setattr(google.auth, "default", default)
    # A setting no client was made for yet: the next gs:// URL makes a new client.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", f"/nonexistent-{uuid.uuid4().hex}")
    caplog.set_level(logging.WARNING, logger="gcsfs")
    url = f"{store.folder()}/ckpt"
    objckpt.save(Net(3), url)
    fresh = Net(4)
    objckpt.restore(fresh, url)
    assert_bits(values(Net(3)), values(fresh))
    assert asked == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("gcsfs")] == []
    fs, _ = _remote.client(url)
    assert fs.credentials.token == "anon"


def test_an_unreachable_endpoint_is_a_typed_error_naming_the_url(store, saved, monkeypatch):
    FakeSleeps().install(monkeypatch)  # the clients' back-off on a fake clock
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    url = f"{saved['root']}/module/ckpt-1"
    with FaultProxy(store.server) as proxy, use_env(proxy.env):
        proxy.refuse()
        for operation in (lambda: objckpt.restore(Net(99), url), lambda: objckpt.verify(url),
                          lambda: objckpt.read_tree(url),
                          lambda: objckpt.load_ensemble(Net(99), [url])):
            with pytest.raises(errors.CheckpointNotFoundError) as caught:
                operation()
            assert f"`{url}`" in str(caught.value) and "Fix:" in str(caught.value)
