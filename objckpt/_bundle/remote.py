"""Checkpoints in object storage: `gs://`, `s3://` and any other fsspec URL (no TF import).

Every path objckpt takes may be a URL. Its client is a well-kept fsspec library installed
as an extra (`python3 -m pip install ".[gcs]"` from a checkout: gcsfs; `".[s3]"`: s3fs),
imported only when such a URL is used; endpoints and credentials come from each client's
standard settings (`STORAGE_EMULATOR_HOST` for GCS; `AWS_ENDPOINT_URL` and the AWS credential
variables for S3), so the same code runs against the emulators and the clouds.

How the bundle format meets object storage:

- **Reading** (`stage`): a remote checkpoint is resolved remotely (its directory listed, its
  state object read, its index validated with the data objects' sizes, all untrusted), then
  its objects are downloaded, several at a time and in ranged parts, into a private local
  folder, and every reader (the validated index, the crc32c checks before anything is
  assigned, the streaming loader) runs on that copy exactly as on disk. Memory stays bounded
  as on disk: the copy is on disk (in `OBJCKPT_STAGING_DIR`, else the system's temporary
  folder), removed when the prefix is no longer used and at exit.
- **Writing** (`upload_bundle`): the bundle is written locally by the same writer as on disk,
  then uploaded: the old index is deleted first (an old index never describes new data),
  the data objects next (in parallel; large ones in parts), the index last. A prefix is a
  checkpoint once its index exists, so a kill at any moment leaves the old checkpoint, none
  or the new one. The bytes are those of the local bundle: what `tf.train.Checkpoint.write`
  writes.
- **Committing** (`write_bytes(..., expect=)`): object stores have no atomic rename; the
  `checkpoint` state object is the commit point, written last with a precondition (GCS
  generation match, S3 `If-Match` / `If-None-Match`) so that two writers cannot both commit
  over each other; the lock is a create-only object (`_bundle.lock.RemoteLock`).

The clients retry transient errors (429, 5xx, dropped connections) with backoff themselves;
what still fails is raised here as OSError (`Unreachable`), which the writers turn into
`CheckpointWriteError` and the readers into `CheckpointNotFoundError` /
`CheckpointCorruptError`. Listings are untrusted: a name with a separator, `.`/`..` or a
control character is never returned, so nothing outside a directory is read or deleted.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import os
import re
import shutil
import tempfile
import threading
import weakref

from objckpt import errors
from objckpt._base import render as _render

__all__ = [
    "ABSENT",
    "PreconditionFailed",
    "StagedPrefix",
    "Unreachable",
    "exists",
    "is_remote",
    "listdir",
    "open_read",
    "read_bytes",
    "read_versioned",
    "remove",
    "size",
    "stage",
    "unstage",
    "unstaged",
    "upload_bundle",
    "write_bytes",
]

# Extras that provide each protocol's client (for the install hint).
_EXTRAS = {"gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"), "s3": ("s3fs", "s3"),
           "s3a": ("s3fs", "s3"), "az": ("adlfs", None), "abfs": ("adlfs", None)}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# A name from a listing that may be used as a file name inside a directory.
_SAFE_NAME = re.compile(r"^[^/\\\x00-\x1f\x7f]+$")

PART_BYTES = 32 << 20  # downloads: ranged parts of this size, several at a time
# Clients whose `get_file` downloads one object in concurrent parts itself: used as they are
# (on fake-gcs-server, 3x faster than ranged reads of our own; s3fs streams one request).
_CONCURRENT_GET = frozenset({"gs", "gcs"})
WORKERS = 8            # objects (or parts) transferred at once

ABSENT = "absent"  # write_bytes(expect=ABSENT): only if no object is there


class PreconditionFailed(OSError):
    """A conditional write found another object than expected (another writer wrote)."""


class Unreachable(OSError):
    """The storage could not be reached or refused the request after the client's retries."""


def is_remote(path) -> bool:
    """Whether `path` is a URL of remote storage (`scheme://...`, other than `file://`)."""
    if not isinstance(path, str):
        try:
            path = os.fspath(path)
        except TypeError:
            return False
        if not isinstance(path, str):
            return False
    match = _SCHEME.match(path)
    return match is not None and match.group(1).lower() != "file"


def scheme(url: str) -> str:
    match = _SCHEME.match(url)
    return match.group(1).lower() if match else ""


# --- the client ------------------------------------------------------------------------------

_CLIENTS: dict = {}
_CLIENTS_LOCK = threading.Lock()
_CONDITIONAL_LOCK = threading.Lock()
# The settings each client reads when it is created: a change makes a new client.
_SETTINGS = ("STORAGE_EMULATOR_HOST", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
             "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
             "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS")


def _missing_client(url: str, err: BaseException) -> errors.MissingDependencyError:
    name = scheme(url)
    package, extra = _EXTRAS.get(name, (None, None))
    how = (f"`python3 -m pip install \".[{extra}]\"` in objckpt's checkout (it installs "
           f"{package}), or `python3 -m pip install {package}`" if extra else
           f"`python3 -m pip install {package}`" if package else
           f"install the fsspec implementation for `{name}://`")
    return errors.MissingDependencyError(
        f"Reading or writing `{_render.safe(url)}` needs the storage client for `{name}://`, "
        f"which is not installed or cannot be imported ({_render.first_line(err)}). Fix: "
        f"{how}.", source=url)


def _emulated(name: str):
    """(client class, options) for a GCS emulator (STORAGE_EMULATOR_HOST set), else None.

    An emulator takes no credentials, so, as google-cloud-storage does there, the client is
    anonymous (gcsfs's token="anon"): no search for Google credentials, no probe of the GCE
    metadata server. It is gcsfs's plain client: the one gcsfs picks by default also asks
    the Storage Control API for each bucket's layout, which an emulator lacks (a warning
    per call, each retried)."""
    if name not in ("gs", "gcs") or not os.environ.get("STORAGE_EMULATOR_HOST"):
        return None
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem, {"token": "anon"}


def client(url: str):
    """(the fsspec file system for `url`, the path within it). Created once per protocol and
    settings (the standard environment variables of each client)."""
    try:
        import fsspec
        from fsspec.core import strip_protocol
    except ImportError as err:
        raise _missing_client(url, err) from err
    name = scheme(url)
    key = (name, tuple(os.environ.get(k) for k in _SETTINGS))
    with _CLIENTS_LOCK:
        fs = _CLIENTS.get(key)
        if fs is None:
            try:
                cls = fsspec.get_filesystem_class(name)
                cls, options = _emulated(name) or (cls, {})
                fs = cls(skip_instance_cache=True, **options)
            except (ImportError, ValueError) as err:
                if isinstance(err, ValueError) and "Protocol not known" not in str(err):
                    raise
                raise _missing_client(url, err) from err
            _CLIENTS[key] = fs
    return fs, strip_protocol(url)


def _call(what: str, url: str, function, *args, **kwargs):
    """Runs a client call; a failure that is not "no such object" becomes `Unreachable`
    naming the URL (the clients already retried transient errors with backoff). A write
    that finds no bucket says so."""
    try:
        return function(*args, **kwargs)
    except FileNotFoundError as err:
        if what in _WRITES and _no_bucket(url):
            raise _bucket_error(url) from err
        raise
    except (FileExistsError, PreconditionFailed, errors.ObjckptError):
        raise
    except Exception as err:
        raise Unreachable(f"{what} `{_render.safe(url)}` failed: "
                          f"{type(err).__name__}: {_render.first_line(err)}") from err


_WRITES = ("Writing", "Uploading to")
_CREATE = {"gs": "gcloud storage buckets create gs://{0}", "gcs": "gcloud storage buckets "
           "create gs://{0}", "s3": "aws s3 mb s3://{0}", "s3a": "aws s3 mb s3://{0}"}


def _no_bucket(url: str) -> bool:
    """Whether the bucket of `url` is known not to exist (False when that cannot be told:
    no permission to look, unreachable)."""
    fs, path = client(url)
    try:
        return not fs.exists(path.split("/", 1)[0])
    except Exception:  # the client's errors: nothing known
        return False


def _bucket_error(url: str) -> errors.CheckpointWriteError:
    name = scheme(url)
    bucket = client(url)[1].split("/", 1)[0]
    create = _CREATE.get(name)
    how = (f"`{create.format(_render.safe(bucket))}`" if create else "the store's own tools")
    return errors.CheckpointWriteError(
        f"Cannot write `{_render.safe(url)}`: the bucket `{_render.safe(bucket)}` does not "
        f"exist. Expected an existing bucket this process can write objects in (objckpt "
        f"makes folders in a bucket, never the bucket). Nothing was written. Fix: create the "
        f"bucket ({how}; with an emulator, through its API), or correct the URL.",
        prefix=url)


# --- reading ---------------------------------------------------------------------------------

def listdir(directory: str) -> list[str]:
    """The names directly in a remote directory (objects and sub-prefixes), without the
    directory; names that are not plain file names are left out. A missing one: []."""
    fs, path = client(directory)
    path = path.rstrip("/")
    try:
        entries = _call("Listing", directory, fs.ls, path, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    names = []
    for entry in entries:
        entry = entry.rstrip("/")
        if not entry.startswith(path + "/"):
            continue
        name = entry[len(path) + 1:]
        if _SAFE_NAME.fullmatch(name) and name not in (".", ".."):
            names.append(name)
    return sorted(set(names))


def _info(url: str) -> dict | None:
    fs, path = client(url)
    try:
        fs.invalidate_cache(path)
        info = _call("Reading", url, fs.info, path)
    except FileNotFoundError:
        return None
    return info if info.get("type", "file") == "file" else None


def exists(url: str) -> bool:
    """Whether an object is at `url`."""
    return _info(url) is not None


def size(url: str) -> int:
    """The size of the object at `url` (FileNotFoundError: none)."""
    info = _info(url)
    if info is None:
        raise FileNotFoundError(url)
    return int(info.get("size") or 0)


def modified(url: str) -> float | None:
    """When the object at `url` was last written (seconds since the epoch), or None."""
    info = _info(url) or {}
    for key in ("mtime", "LastModified", "updated"):
        value = info.get(key)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)):
            return float(value)
    return None


def open_read(url: str):
    """A read-only binary file object over the object at `url` (ranged reads)."""
    fs, path = client(url)
    return _call("Opening", url, fs.open, path, "rb", block_size=1 << 20, cache_type="none")


def read_bytes(url: str, limit: int) -> bytes:
    """The bytes of the object at `url`, refused past `limit` (ValueError)."""
    data, _ = read_versioned(url, limit)
    return data


def _token(info: dict, url: str | None = None):
    """The version of an object: its GCS generation or S3 ETag; on a store that has neither
    (memory://), a digest of its bytes (small objects: the state and lock objects)."""
    for key in ("generation", "ETag", "etag"):
        if info.get(key) is not None:
            return str(info[key])
    if url is not None and int(info.get("size") or 0) <= 1 << 20:
        import hashlib

        fs, path = client(url)
        return "sha256:" + hashlib.sha256(fs.cat_file(path)).hexdigest()
    return None


def read_versioned(url: str, limit: int) -> tuple[bytes, str | None]:
    """(the bytes of the object at `url`, its version token for `write_bytes(expect=)`)."""
    info = _info(url)
    if info is None:
        raise FileNotFoundError(url)
    if int(info.get("size") or 0) > limit:
        raise ValueError(f"`{_render.safe(url)}` holds {int(info['size']):,} bytes; at most "
                         f"{limit:,} expected")
    fs, path = client(url)
    data = _call("Reading", url, fs.cat_file, path)
    if len(data) > limit:
        raise ValueError(f"`{_render.safe(url)}` grew past {limit:,} bytes while it was read")
    return data, _token(info, url)


# --- writing ---------------------------------------------------------------------------------

def write_bytes(url: str, data: bytes, *, expect=None) -> str | None:
    """Writes a (small) object whole. `expect`: None (any), `ABSENT` (only if none is there),
    or the version token `read_versioned`/`write_bytes` gave (only if it is still that one);
    else `PreconditionFailed`. Returns the new version token where the store gives one.

    A conditional write whose answer is lost is retried by the client, whose retry then
    fails its own precondition: so after any failure the object is read back, and the write
    counts as done when it holds exactly `data` (callers put a unique id in it).
    """
    fs, path = client(url)
    name = scheme(url)
    try:
        if expect is None:
            _call("Writing", url, fs.pipe_file, path, data)
        elif name in ("gs", "gcs"):
            if expect == ABSENT:
                _call("Writing", url, fs.pipe_file, path, data, mode="create")
            else:
                _gcs_replace(fs, url, path, data, expect)
        elif name in ("s3", "s3a"):
            if expect == ABSENT:
                _call("Writing", url, fs.pipe_file, path, data, mode="create")
            else:
                _call("Writing", url, fs.pipe_file, path, data, IfMatch=expect)
        else:  # a store with no preconditions (memory://): checked, then written, in-process
            with _CONDITIONAL_LOCK:
                info = _info(url)
                current = None if info is None else _token(info, url)
                if (expect == ABSENT and current is not None) or (
                        expect != ABSENT and current != expect):
                    raise PreconditionFailed(f"`{_render.safe(url)}` changed")
                _call("Writing", url, fs.pipe_file, path, data)
    except (OSError, PreconditionFailed) as err:
        if expect is None:
            raise
        held = _holds(url, data)
        if held is None:  # neither its answer nor the object could be read: unknown
            raise Unreachable(f"Writing `{_render.safe(url)}` failed and it could not be "
                              f"read back: {type(err).__name__}: "
                              f"{_render.first_line(err)}") from err
        if not held:  # else: it landed, and its answer was lost
            if isinstance(err, (FileExistsError, PreconditionFailed)) or _conflict(url, expect):
                raise PreconditionFailed(
                    f"`{_render.safe(url)}` was written by someone else (expected "
                    f"{'no object' if expect == ABSENT else 'version ' + str(expect)})") from err
            raise
    fs.invalidate_cache(path)
    info = _info(url)
    return None if info is None else _token(info, url)


def _holds(url: str, data: bytes) -> bool | None:
    """Whether the object at `url` holds exactly `data` (False: another object or none;
    None: it cannot be read)."""
    try:
        fs, path = client(url)
        fs.invalidate_cache(path)
        return fs.cat_file(path) == data
    except FileNotFoundError:
        return False
    except Exception:
        return None


def _conflict(url: str, expect) -> bool:
    """Whether the object at `url` is no longer what `expect` says (False: cannot tell)."""
    try:
        info = _info(url)
    except OSError:
        return False
    current = None if info is None else _token(info, url)
    return current is not None if expect == ABSENT else current != str(expect)


def _gcs_replace(fs, url: str, path: str, data: bytes, generation) -> None:
    """A GCS upload that replaces only the generation given (the JSON API's multipart upload
    with `ifGenerationMatch`, through gcsfs's own authenticated request method; gcsfs has no
    call for it, and multipart is the upload every GCS server checks preconditions on)."""
    import json
    from urllib.parse import quote

    bucket, _, key = path.partition("/")
    meta = json.dumps({"name": key})
    body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
            "Content-Type: application/octet-stream\n\n").encode() + data + b"\n--==0==--"
    _call("Writing", url, fs.call, "POST",
          fs.base.replace("/storage/v1/", "/upload/storage/v1/", 1)
          + f"b/{quote(bucket, safe='')}/o",
          uploadType="multipart", ifGenerationMatch=str(generation),
          headers={"Content-Type": 'multipart/related; boundary="==0=="'}, data=body,
          json_out=True)


def remove(url: str) -> None:
    """Deletes the object at `url`; a missing one is fine."""
    fs, path = client(url)
    with contextlib.suppress(FileNotFoundError):
        _call("Deleting", url, fs.rm_file, path)
    fs.invalidate_cache(path)


# --- transfers -------------------------------------------------------------------------------

def _pool(jobs: int) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max(1, min(WORKERS, jobs)),
                                                 thread_name_prefix="objckpt-transfer")


def _download(url: str, local: str, nbytes: int) -> None:
    """One object to a local file, streamed (no second copy of the object in memory): by
    the client's own download where it fetches parts concurrently itself (gcsfs), else in
    ranged parts of PART_BYTES, several at a time, each written at its offset."""
    fs, path = client(url)
    if scheme(url) in _CONCURRENT_GET:
        _call("Reading", url, fs.get_file, path, local)
        if os.path.getsize(local) != nbytes:
            raise Unreachable(f"Reading `{_render.safe(url)}`: expected {nbytes:,} bytes, "
                              f"received {os.path.getsize(local):,}")
        return
    with open(local, "wb") as out:
        out.truncate(nbytes)
    if nbytes == 0:
        return
    parts = [(start, min(nbytes, start + PART_BYTES)) for start in range(0, nbytes, PART_BYTES)]

    def fetch(part):
        start, end = part
        data = _call("Reading", url, fs.cat_file, path, start=start, end=end)
        if len(data) != end - start:
            raise Unreachable(f"Reading `{_render.safe(url)}`: expected {end - start:,} bytes "
                              f"at offset {start:,}, received {len(data):,}")
        fd = os.open(local, os.O_WRONLY)
        try:
            view = memoryview(data)
            while view:
                view = view[os.pwrite(fd, view, start + len(data) - len(view)):]
        finally:
            os.close(fd)

    if len(parts) == 1:
        fetch(parts[0])
        return
    with _pool(len(parts)) as pool:
        for future in [pool.submit(fetch, p) for p in parts]:
            future.result()


def _upload(local: str, url: str) -> None:
    fs, path = client(url)
    _call("Uploading to", url, fs.put_file, local, path)
    fs.invalidate_cache(path)


def _run(jobs: list) -> None:
    """Runs thunks several at a time; the first failure is raised once all ended."""
    if len(jobs) <= 1:
        for job in jobs:
            job()
        return
    with _pool(len(jobs)) as pool:
        futures = [pool.submit(job) for job in jobs]
        first = None
        for future in futures:
            try:
                future.result()
            except BaseException as err:
                first = first or err
        if first is not None:
            raise first


# --- staged copies ---------------------------------------------------------------------------

class StagedPrefix(str):
    """A local copy of a remote checkpoint prefix: the str is the local prefix; `remote` is
    the URL it came from. The copy is removed once no StagedPrefix of it is referenced."""

    remote: str
    folder: str


_STAGED: dict = {}  # folder -> finalizer


def _staging_root() -> str:
    root = os.environ.get("OBJCKPT_STAGING_DIR") or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    return root


def _cleanup_all() -> None:
    for finalizer in list(_STAGED.values()):
        finalizer()


atexit.register(_cleanup_all)


def new_folder(what: str) -> str:
    """A private local folder for staging (`objckpt-<what>-*`), removed at exit."""
    folder = tempfile.mkdtemp(prefix=f"objckpt-{what}-", dir=_staging_root())
    return folder


def stage(prefix: str, shards: list[tuple[str, int]]) -> StagedPrefix:
    """Downloads a remote checkpoint (`prefix.index` and the data objects `shards`: (URL,
    size)) into a private local folder; returns the local prefix.

    Raises:
      FileNotFoundError: an object vanished meanwhile.
      Unreachable: the store failed.
    """
    folder = new_folder("staged")
    name = prefix.rstrip("/").rsplit("/", 1)[-1] or "ckpt"
    local = os.path.join(folder, name)
    try:
        jobs = [lambda: _download(prefix + ".index", local + ".index",
                                  size(prefix + ".index"))]
        for url, nbytes in shards:
            target = local + url[len(prefix):]
            jobs.append(lambda u=url, t=target, n=nbytes: _download(u, t, n))
        _run(jobs)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    staged = StagedPrefix(local)
    staged.remote, staged.folder = prefix, folder
    _STAGED[folder] = weakref.finalize(staged, _forget, folder)
    return staged


def shown(prefix) -> str:
    """How to name a prefix to people: the URL of a staged copy, else the prefix itself."""
    return getattr(prefix, "remote", prefix)


def unstaged(text: str) -> str:
    """`text` with the local prefix of every staged copy still in use replaced by its URL:
    what a reader of the copy says (`/tmp/objckpt-staged-x/ckpt.index`) names the URL."""
    for finalizer in list(_STAGED.values()):
        found = finalizer.peek()
        if found is not None and str(found[0]) in text:
            text = text.replace(str(found[0]), found[0].remote)
    return text


def unstage(err: BaseException) -> BaseException:
    """`err` (an objckpt error raised while a staged copy was read) naming URLs instead of
    the copies: its message, `source` and `problems` rewritten in place. Returns `err`."""
    if _STAGED and isinstance(err, errors.ObjckptError):
        err.args = tuple(unstaged(a) if isinstance(a, str) else a for a in err.args)
        if isinstance(err.source, str):
            err.source = unstaged(err.source)
        err.problems = tuple(unstaged(p) if isinstance(p, str) else p for p in err.problems)
    return err


def _forget(folder: str) -> None:
    _STAGED.pop(folder, None)
    shutil.rmtree(folder, ignore_errors=True)


def upload_bundle(local: str, prefix: str, data: list[str], old_index: bool,
                  stale: list[str], stage=None) -> None:
    """Uploads the bundle written at the local prefix `local` (its data files `data`, local
    paths) to the remote `prefix`, in the commit order: the old index first (`old_index`:
    one exists), then `stale` data objects the new bundle does not replace, the data objects
    (in parallel), the index last. `stage("data")` runs once the data is uploaded."""
    if old_index:
        remove(prefix + ".index")
    for url in stale:
        remove(url)
    _run([lambda p=path: _upload(p, prefix + p[len(local):]) for path in data])
    if stage is not None:
        stage("data")
    _upload(local + ".index", prefix + ".index")
