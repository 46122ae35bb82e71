"""The storage emulators and the FaultProxy (tests/helpers/storage_servers.py), and what gcsfs
and s3fs do against them: the findings the remote storage layer is built on. No objckpt code
here: each test speaks to the clients directly, so a client or emulator upgrade that changes
one of these behaviours fails here, naming it."""

from __future__ import annotations

import errno
import json
import os

import pytest
from storage_servers import (  # noqa: F401  (fixtures: gcs_server, s3_server, proxy, sleeps, _quiet_gcsfs)
    FakeSleeps,
    FaultProxy,
    GcsServer,
    S3Server,
    gcs_binary,
    gcs_server_fixture,
    proxy_fixture,
    quiet_gcsfs_fixture,
    s3_available,
    s3_server_fixture,
    sleeps_fixture,
    use_env,
)

BUCKET = "ckpts"
MiB = 2**20



@pytest.fixture(scope="module", params=["gcs", "s3"])
def server(request):
    """Each emulator in turn, with bucket BUCKET."""
    server = request.getfixturevalue(f"{request.param}_server")
    server.make_bucket(BUCKET)
    return server




def new_fs(kind):
    """A fresh filesystem for the environment in force (never a cached instance)."""
    if kind == "gcs":
        import gcsfs

        return gcsfs.GCSFileSystem(skip_instance_cache=True)
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def gcs_replace(fs, path, data, generation):
    """GCS conditional replace: a multipart upload with ifGenerationMatch (fake-gcs-server
    checks the precondition on multipart uploads only; GCS on every request). Returns the
    new object's resource (its "generation")."""
    bucket, key, _ = fs.split_path(path)
    meta = json.dumps({"name": key})
    body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
            "Content-Type: application/octet-stream\n\n").encode() + data + b"\n--==0==--"
    return fs.call("POST", f"{fs._location}/upload/storage/v1/b/{bucket}/o",
                   uploadType="multipart", ifGenerationMatch=str(generation),
                   headers={"Content-Type": 'multipart/related; boundary="==0=="'},
                   data=body, json_out=True)


def test_put_get_ls_ranged_rm(server, proxy, tmp_path):
    fs = new_fs(server.kind)
    base = f"{BUCKET}/basic"
    fs.pipe(f"{base}/a.bin", b"0123456789")
    fs.pipe(f"{base}/sub/b.bin", b"b")
    assert fs.cat(f"{base}/a.bin") == b"0123456789"
    assert fs.cat_file(f"{base}/a.bin", start=3, end=7) == b"3456"
    assert fs.size(f"{base}/a.bin") == 10
    assert sorted(fs.ls(base, detail=False)) == [f"{base}/a.bin", f"{base}/sub"]
    assert sorted(fs.find(base)) == [f"{base}/a.bin", f"{base}/sub/b.bin"]
    assert fs.exists(f"{base}/a.bin") and not fs.exists(f"{base}/none.bin")
    with pytest.raises(FileNotFoundError):
        fs.cat(f"{base}/none.bin")
    local = tmp_path / "a.bin"
    fs.get_file(f"{base}/a.bin", str(local))
    assert local.read_bytes() == b"0123456789"
    fs.put_file(str(local), f"{base}/c.bin")
    assert fs.cat(f"{base}/c.bin") == b"0123456789"
    fs.rm([f"{base}/a.bin", f"{base}/c.bin"])
    assert fs.find(base) == [f"{base}/sub/b.bin"]
    assert proxy.seen == proxy.forwarded > 0 and proxy.failed == 0


def test_multipart_upload_of_20_mib(server, proxy):
    fs = new_fs(server.kind)
    data = os.urandom(20 * MiB + 123)
    # gcsfs: a resumable upload in chunks (a multiple of 256 KiB) past `chunksize`; s3fs: a
    # multipart upload of `chunksize` parts past 2 * chunksize (5 MiB is S3's smallest part).
    fs.pipe(f"{BUCKET}/big.bin", data, chunksize=(8 if server.kind == "gcs" else 5) * MiB)
    parts = [m for m, path, _ in proxy.log
             if ("upload_id=" in path if server.kind == "gcs" else "partNumber=" in path)]
    assert len(parts) == (3 if server.kind == "gcs" else 5), proxy.log
    assert fs.cat(f"{BUCKET}/big.bin") == data
    assert fs.cat_file(f"{BUCKET}/big.bin", start=10 * MiB, end=10 * MiB + 9) == \
        data[10 * MiB:10 * MiB + 9]


@pytest.mark.parametrize("size", [1, 12 * MiB])
def test_conditional_create(server, proxy, size):
    fs = new_fs(server.kind)
    path = f"{BUCKET}/create-{size}"
    first = os.urandom(size)
    fs.pipe(path, first, mode="create", chunksize=5 * MiB)
    second = os.urandom(size)
    if server.kind == "gcs" and size > 1:
        # fake-gcs-server ignores ifGenerationMatch=0 on a resumable upload (GCS honours it)
        fs.pipe(path, second, mode="create", chunksize=5 * MiB)
        assert fs.cat(path) == second
        return
    with pytest.raises(FileExistsError):
        fs.pipe(path, second, mode="create", chunksize=5 * MiB)
    assert fs.cat(path) == first


def test_conditional_replace(server, proxy):
    fs = new_fs(server.kind)
    path = f"{BUCKET}/state"
    fs.pipe(path, b"v1")
    if server.kind == "gcs":
        generation = fs.info(path)["generation"]
        new = gcs_replace(fs, path, b"v2", generation)
        assert new["generation"] != generation
        with pytest.raises(FileExistsError):  # 412: gcsfs raises FileExistsError for any
            gcs_replace(fs, path, b"v3", generation)
    else:
        etag = fs.info(path)["ETag"]
        new = fs.call_s3("put_object", Bucket=BUCKET, Key="state", Body=b"v2", IfMatch=etag)
        assert new["ETag"] != etag
        with pytest.raises(OSError) as raised:  # If-Match failed: OSError(EINVAL), not
            fs.call_s3("put_object", Bucket=BUCKET, Key="state", Body=b"v3", IfMatch=etag)
        assert not isinstance(raised.value, FileExistsError)
        assert raised.value.errno == errno.EINVAL
        assert "pre-conditions" in str(raised.value)
    assert fs.cat(path) == b"v2"
    assert proxy.failed == 0


def test_fake_gcs_checks_generation_preconditions_on_multipart_uploads_only(gcs_server):
    """What the GCS tests cannot rely on: fake-gcs-server applies ifGenerationMatch to a
    multipart upload only; a media upload, a resumable upload and a delete ignore it."""
    gcs_server.make_bucket(BUCKET)
    with use_env(gcs_server.env):
        fs = new_fs("gcs")
        path = f"{BUCKET}/pre"
        fs.pipe(path, b"v1")
        stale = fs.info(path)["generation"]
        gcs_replace(fs, path, b"v2", stale)
        upload = f"{fs._location}/upload/storage/v1/b/{BUCKET}/o"
        fs.call("POST", upload, uploadType="media", name="pre", ifGenerationMatch=stale,
                data=b"v3")
        assert fs.cat(path) == b"v3"  # GCS would answer 412
        fs.call("DELETE", "b/{}/o/{}", BUCKET, "pre", ifGenerationMatch=stale)
        assert not fs.exists(path)  # GCS would answer 412


def test_a_new_environment_needs_a_new_filesystem(s3_server, gcs_server):
    """s3fs keeps the endpoint its client was made with (at the instance's first request),
    and fsspec returns the cached instance for the same arguments: a changed
    AWS_ENDPOINT_URL needs a new instance. gcsfs reads STORAGE_EMULATOR_HOST on every
    request."""
    import gcsfs
    import s3fs

    for server in (s3_server, gcs_server):
        server.make_bucket(BUCKET)
    with FaultProxy(s3_server) as s3_proxy, FaultProxy(gcs_server) as gcs_proxy:
        with use_env(s3_proxy.env):
            via_proxy = s3fs.S3FileSystem()
            via_proxy.ls(BUCKET)
        seen = s3_proxy.seen
        assert seen > 0
        with use_env(s3_server.env):  # clears the instance cache on entry
            direct = s3fs.S3FileSystem()
            assert direct is not via_proxy
            listing = direct.ls(BUCKET)  # its client (and endpoint): made at its first request
            assert s3_proxy.seen == seen
            os.environ["AWS_ENDPOINT_URL"] = s3_proxy.url  # changed without a cache clear:
            assert s3fs.S3FileSystem() is direct  # the cached instance
            direct.ls(BUCKET, refresh=True)
            assert s3_proxy.seen == seen  # still talks to the server, not the proxy
            assert s3fs.S3FileSystem(skip_instance_cache=True).ls(BUCKET) == listing
            assert s3_proxy.seen > seen  # a new instance reads the variable
            os.environ["AWS_ENDPOINT_URL"] = s3_server.url
        with use_env(gcs_proxy.env):
            fs = gcsfs.GCSFileSystem()
            fs.ls(BUCKET, refresh=True)
            seen = gcs_proxy.seen
            assert seen > 0
            os.environ["STORAGE_EMULATOR_HOST"] = gcs_server.url
            fs.ls(BUCKET, refresh=True)
            assert gcs_proxy.seen == seen  # the same instance followed the variable


# --- faults: what each client retries on its own, and what it raises when it gives up ---

# requests the proxy sees for one `cat` of a small object, its faults included
_ONE_CAT = {"gcs": 1, "s3": 2}  # s3fs: HeadObject, then GetObject


@pytest.mark.parametrize("fault", ["503", "429", "drop"])
def test_transient_faults_are_retried_by_the_client(server, proxy, sleeps, fault):
    fs = new_fs(server.kind)
    fs.pipe(f"{BUCKET}/t", b"payload")
    proxy.reset()
    if fault == "drop":
        proxy.drop_next(2, method="GET")
    else:
        proxy.fail_next(2, status=int(fault), method="GET")
    assert fs.cat(f"{BUCKET}/t") == b"payload"
    assert proxy.failed == 2
    assert proxy.seen == _ONE_CAT[server.kind] + 2
    assert sleeps.delays, "the client retried without backing off"


def test_transient_faults_on_upload_chunks_are_retried(server, proxy, sleeps):
    fs = new_fs(server.kind)
    data = os.urandom(12 * MiB)
    part = ("POST", "upload_id=") if server.kind == "gcs" else ("PUT", "partNumber=2")
    proxy.fail_next(1, status=503, method=part[0], path=part[1])
    proxy.drop_next(1, method=part[0], path=part[1])
    fs.pipe(f"{BUCKET}/chunked", data, chunksize=5 * MiB)
    assert proxy.failed == 2
    assert fs.cat(f"{BUCKET}/chunked") == data


# (kind, fault) -> (exception type, requests seen for one `cat` until the client gave up)
_GIVE_UP = {
    # gcsfs: retry_request, 6 tries, back-off 1-2, 2-3, 4-5, 8-9, 16-17 s (about 33 s)
    ("gcs", "503"): ("gcsfs.retry.HttpError", 6),
    ("gcs", "429"): ("gcsfs.retry.HttpError", 6),
    ("gcs", "drop"): ("aiohttp.client_exceptions.ServerDisconnectedError", 12),
    # s3fs: HeadObject's 503 has no body: botocore's 5 attempts, then OSError(EBUSY);
    # aiohttp retries a dropped keep-alive request once; botocore 5 x s3fs 5 attempts
    ("s3", "503"): ("builtins.OSError", 5),
    ("s3", "429"): ("builtins.OSError", 5),  # EIO, "... (429) ... reached max retries: 4"
    ("s3", "drop"): ("botocore.exceptions.ConnectionClosedError", 50),
}


@pytest.mark.parametrize("fault", ["503", "429", "drop"])
def test_lasting_faults_raise_when_retries_run_out(server, proxy, sleeps, fault):
    fs = new_fs(server.kind)
    fs.pipe(f"{BUCKET}/l", b"x")
    proxy.reset()
    if fault == "drop":
        proxy.drop_next(10_000)
    else:
        proxy.fail_next(10_000, status=int(fault))
    with pytest.raises(Exception) as raised:
        fs.cat(f"{BUCKET}/l")
    kind = type(raised.value)
    expected, seen = _GIVE_UP[server.kind, fault]
    assert f"{kind.__module__}.{kind.__qualname__}" == expected
    assert proxy.seen == proxy.failed == seen
    if server.kind == "gcs":
        # min(random() + 2 ** (retry - 1), 32) before each retry
        assert [2 ** i <= d < 2 ** i + 1 for i, (_, d) in enumerate(sleeps.delays)] == [True] * 5
    if server.kind == "gcs" and fault != "drop":
        assert raised.value.code == int(fault)
    if server.kind == "s3" and fault != "drop":
        assert raised.value.errno == (errno.EBUSY if fault == "503" else errno.EIO)


def test_lasting_503_on_an_s3_upload_is_retried_by_botocore_and_s3fs(s3_server, sleeps):
    """A 503 with a body (PutObject's SlowDown): botocore's 5 attempts, each retried by
    s3fs's _error_wrapper (5): 25 requests, then OSError(EBUSY) with the server's message."""
    s3_server.make_bucket(BUCKET)
    with FaultProxy(s3_server) as proxy, use_env(proxy.env):
        fs = new_fs("s3")
        proxy.fail_next(10_000, status=503)
        with pytest.raises(OSError) as raised:
            fs.pipe(f"{BUCKET}/u", b"x")
        assert raised.value.errno == errno.EBUSY
        assert proxy.seen == proxy.failed == 25


def test_refused_then_resumed(server, proxy, sleeps):
    fs = new_fs(server.kind)
    fs.pipe(f"{BUCKET}/r", b"r")
    proxy.refuse()
    expected = {"gcs": "aiohttp.client_exceptions.ClientConnectorError",
                "s3": "botocore.exceptions.EndpointConnectionError"}[server.kind]
    with pytest.raises(Exception) as raised:
        fs.cat(f"{BUCKET}/r")
    kind = type(raised.value)
    assert f"{kind.__module__}.{kind.__qualname__}" == expected
    assert isinstance(raised.value, OSError) == (server.kind == "gcs")
    proxy.resume()
    assert fs.cat(f"{BUCKET}/r") == b"r"


def test_servers_stop_and_start_again_on_the_same_port():
    binary = gcs_binary()
    s3_available()
    gcs, s3 = GcsServer(binary).start(), S3Server().start()
    try:
        gcs.make_bucket("restart")
        s3.make_bucket("restart")
        urls = gcs.url, s3.url
        gcs.stop()
        s3.stop()
        gcs.start()
        s3.start()
        assert (gcs.url, s3.url) == urls
        with use_env(gcs.env):
            assert not new_fs("gcs").exists("restart")  # the memory backend starts empty
        with use_env(s3.env):
            assert new_fs("s3").exists("restart")  # moto's state lives in this process
    finally:
        gcs.stop()
        s3.stop()


def test_a_conditional_create_whose_answer_is_lost_fails_on_the_clients_own_retry(
        server, proxy, sleeps):
    """The server creates the object, the answer is lost (503 or a dropped connection after
    the write): the client retries the same conditional request by itself and gets 412, so
    the writer that DID create the object sees FileExistsError (a lock or a commit must read
    the object back to learn whether it is its own)."""
    fs = new_fs(server.kind)
    method = "POST" if server.kind == "gcs" else "PUT"
    for name, fault in (("lost-503", proxy.fail_next), ("lost-drop", proxy.drop_next)):
        proxy.reset()
        fault(1, method=method, after=True)
        with pytest.raises(FileExistsError):
            fs.pipe(f"{BUCKET}/{name}", b"mine", mode="create")
        assert [outcome for _, _, outcome in proxy.log][-2:] == [
            "503 after 200" if name == "lost-503" else "dropped after 200", "412"]
        assert fs.cat(f"{BUCKET}/{name}") == b"mine"
    if server.kind == "gcs":  # a DELETE whose answer is lost: the retry finds nothing
        proxy.fail_next(1, method="DELETE", after=True)
        with pytest.raises(FileNotFoundError):
            fs.rm(f"{BUCKET}/lost-503")
        assert not fs.exists(f"{BUCKET}/lost-503")


def test_botocores_attempts_follow_aws_max_attempts(s3_server, sleeps):
    """AWS_MAX_ATTEMPTS (a standard setting) bounds botocore's attempts; s3fs's own retries
    are the instance attribute `retries` (5; not a constructor argument)."""
    s3_server.make_bucket(BUCKET)
    with FaultProxy(s3_server) as proxy, use_env({**proxy.env, "AWS_MAX_ATTEMPTS": "2"}):
        fs = new_fs("s3")
        fs.retries = 3
        proxy.fail_next(10_000, status=503)
        with pytest.raises(OSError) as raised:
            fs.pipe(f"{BUCKET}/m", b"x")
        assert raised.value.errno == errno.EBUSY
        assert proxy.seen == 2 * 3


HOSTILE = ["run/../evil", "run/./dot", "run/ctl\x01", "run//double", "run/%2e%2e/pct",
           "run/sp ace", "run/uni\u00e9", "run/back\\slash", "run/..", "run/a\nb"]


def test_hostile_object_names_are_stored_and_find_lists_them_verbatim(server, proxy):
    """Both emulators keep `..`, `.`, `//`, control characters (moto answers 404 to a key
    with a newline; fake-gcs-server stores it). `find` lists the names as stored; `ls` is
    not a listing of names: its pseudo-directories repeat ('run/..' for 'run/..' and
    'run/../evil') and lose the empty segment of 'run//double'."""
    fs = new_fs(server.kind)
    stored = []
    for name in HOSTILE:
        if server.kind == "s3" and "\n" in name:
            with pytest.raises(FileNotFoundError):
                fs.pipe(f"{BUCKET}/hostile/{name}", b"z")
            continue
        fs.pipe(f"{BUCKET}/hostile/{name}", b"z")
        stored.append(f"{BUCKET}/hostile/{name}")
    assert sorted(fs.find(f"{BUCKET}/hostile/run")) == sorted(stored)
    listing = fs.ls(f"{BUCKET}/hostile/run", detail=False)
    assert len(listing) > len(set(listing))  # repeated pseudo-directories
    assert f"{BUCKET}/hostile/run//double" not in listing
