"""Checkpoint I/O at the speed of the disk: parallel writes and reads in TF's own format.

Writing: `_bundlewrite` writes TF's bundle format itself, one data file that several threads
checksum and `pwrite` straight from the tensors' buffers, and one index; `_files.commit` moves
the result into place. Where it cannot (a variant or resource tensor, or no native crc32c), a
checkpoint of at least `MIN_PART_BYTES` per part is written by several threads (`part_count`:
no more parts than the memory budget holds write buffers), each running TF's own `SaveV2` into
a part prefix beside the final one; `MergeV2Checkpoints` then renames the parts' data files
to `<temp>.data-0000k-of-0000K` and writes one index, exactly what `tf.train.Checkpoint`
writes for a sharded save.

Reading: `read_tensors` runs `RestoreV2` over groups of keys in parallel. `Loader` restores a
plan's variables all or nothing with bounded memory: it first checks every entry's crc32c
(TF's C++ crc32c called through ctypes with the GIL released, over read-only memory maps;
`RestoreV2` where it is not found), with the data files held open, and only then writes each
variable, one tensor at a time: large entries are read straight from the file into a new
tensor TF allocated (one copy) that the variable adopts (`AssignVariableOp` shares its input;
the old buffer is freed, or kept unchanged by whatever shares it, such as a `Snapshot`),
others through a copy and `assign`. New tensors in flight are bounded by the largest tensor
+ 20% of the model. No kernel that puts a variable in TF's copy-on-read mode runs (strided
slice or scatter assigns do: every later read of the variable would copy it).
Nothing here executes checkpoint data: bytes are checksummed and copied into tensors of the
dtype and shape the validated index and the plan agreed on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import mmap
import os
import re
import struct
import threading

import numpy as np
import tensorflow as tf

from objckpt import _compat, errors
from objckpt._base import render as _render
from objckpt._bundle import index as _bundle
from objckpt._bundle import write as _bundlewrite

__all__ = ["DURABLE_DEFAULT", "MIN_PART_BYTES", "PART_BUFFER_BYTES", "STREAM_BYTES", "Budget",
           "Loader", "empty_tensor", "fsync_paths", "lower_priority", "memory_budget", "native_crc32c",
           "part_count", "read_direct", "read_tensors", "run_all", "thread_groups", "threads",
           "write_bundle"]

# Whether writes fsync before they commit when the caller does not say (see docs/benchmarks.md,
# section io: the cost of durable=True decided it).
DURABLE_DEFAULT = False
# Each writing thread gets at least this many bytes; smaller checkpoints use one SaveV2.
MIN_PART_BYTES = 32 << 20
# Restores of fewer bytes read all values first (one fused assign is faster for many small
# variables, and a second copy of a small model costs little); larger ones stream.
STREAM_BYTES = 16 << 20
# Each reading or writing thread gets at least this many bytes.
MIN_THREAD_BYTES = 8 << 20
# Entries at least this large are memory-mapped to check them and read straight into a new
# tensor to assign them; smaller ones are read with pread.
MAP_BYTES = 1 << 20
# What one SaveV2 holds in memory while it writes (TF's BundleWriter buffers 8 MiB), with
# a margin.
PART_BUFFER_BYTES = 10 << 20


def threads() -> int:
    """How many threads read and write: OBJCKPT_IO_THREADS, else min(2 x CPUs, 8)."""
    given = os.environ.get("OBJCKPT_IO_THREADS", "").strip()
    if given:
        try:
            count = int(given)
        except ValueError:
            raise errors.InvalidArgumentError(
                f"OBJCKPT_IO_THREADS must be a whole number of threads (>= 1). Received: "
                f"{_render.safe(given)}. Fix: set it to e.g. 4, or unset it.") from None
        if count < 1:
            raise errors.InvalidArgumentError(
                f"OBJCKPT_IO_THREADS must be >= 1. Received: {count}. Fix: set it to e.g. 4, "
                "or unset it.")
        return count
    return max(1, min(2 * (os.cpu_count() or 1), 8))


def lower_priority() -> None:
    """Makes the calling thread yield the CPU to training (Linux: nice 10, this thread only).

    A background write (checksums, copies into the page cache) then fills the CPU time
    training leaves idle instead of slowing the training step.
    """
    # Not Linux, or not allowed: normal priority.
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


_POOL = None
_POOL_LOCK = threading.Lock()


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="objckpt-io")
        return _POOL


def _run_all(function, jobs: list, workers: int) -> list:
    """function(job) for every job, on up to `workers` threads; results in order. Raises
    the first job's error (by job order) after every job ended."""
    if workers <= 1 or len(jobs) <= 1 or threading.current_thread().name.startswith(
            "objckpt-io"):
        return [function(job) for job in jobs]
    futures = [_pool().submit(function, job) for job in jobs]
    concurrent.futures.wait(futures)
    return [future.result() for future in futures]


def _balance(sizes: list[int], groups: int) -> list[list[int]]:
    """Indices into sizes, in `groups` lists of about equal byte totals (largest first into
    the least loaded), each list in index order."""
    loads = [[0, k, []] for k in range(groups)]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        least = min(loads)
        least[0] += sizes[i]
        least[2].append(i)
    return [sorted(members) for _, _, members in sorted(loads, key=lambda load: load[1])
            if members]


# --- crc32c ---------------------------------------------------------------------------

_CRC = None
_CRC_LOCK = threading.Lock()
_CRC_SYMBOLS = (
    # absl (TF >= 2.16): crc_internal::ExtendCrc32cInternal(crc32c_t, std::string_view)
    (re.compile(rb"_ZN4absl12lts_\d+12crc_internal20ExtendCrc32cInternalENS0_8crc32c_tESt17"
                rb"basic_string_viewIcSt11char_traitsIcEE\x00"), "view"),
    # tsl / tensorflow (TF <= 2.15): crc32c::Extend(uint32, const char*, size_t)
    (re.compile(rb"_ZN3tsl6crc32c6ExtendEjPKcm\x00"), "pointer"),
    (re.compile(rb"_ZN10tensorflow6crc32c6ExtendEjPKcm\x00"), "pointer"),
)


def _dynamic_strings(path: str) -> bytes:
    """The dynamic symbol string table of a 64-bit little-endian ELF file (b"" if none)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return b""
        (shoff,) = struct.unpack_from("<Q", head, 0x28)
        entsize, count = struct.unpack_from("<HH", head, 0x3A)
        if entsize < 64 or not 0 < count < 1 << 16:
            return b""
        f.seek(shoff)
        table = f.read(entsize * count)
        sections = [struct.unpack_from("<IIQQQQII", table, i * entsize) for i in range(count)
                    if (i + 1) * entsize <= len(table)]
        for section in sections:
            if section[1] == 11 and section[6] < len(sections):  # SHT_DYNSYM -> its strings
                strings = sections[section[6]]
                if strings[5] > 1 << 28:
                    return b""
                f.seek(strings[4])
                return f.read(strings[5])
    return b""


def _find_crc32c():
    """TF's C++ crc32c (hardware accelerated) as `(address, length, crc) -> crc`, or None."""
    directory = os.path.dirname(tf.__file__)
    for name in ("libtensorflow_framework.so.2", "libtensorflow_framework.so"):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        try:
            strings = _dynamic_strings(path)
            library = ctypes.CDLL(path)
        except (OSError, struct.error):
            continue
        for pattern, kind in _CRC_SYMBOLS:
            found = pattern.search(strings)
            if found is None:
                continue
            function = getattr(library, found.group(0)[:-1].decode(), None)
            if function is None:
                continue
            function.restype = ctypes.c_uint32
            if kind == "view":  # (crc, string_view{length, pointer}) in registers
                function.argtypes = [ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p]

                def extend(address, length, crc, _f=function):
                    return _f(crc, length, address)
            else:
                function.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]

                def extend(address, length, crc, _f=function):
                    return _f(crc, address, length)
            check = ctypes.create_string_buffer(b"123456789", 9)
            if extend(ctypes.addressof(check), 9, 0) == 0xE3069283:  # the standard check value
                return extend
    return None


def native_crc32c():
    """TF's own crc32c as `crc32c(buffer, crc=0) -> int` (unmasked), or None when this TF
    does not export it. Runs without the GIL."""
    global _CRC
    with _CRC_LOCK:
        if _CRC is None:
            _CRC = (_find_crc32c(),)
    extend = _CRC[0]
    if extend is None:
        return None

    def crc32c(buffer, crc: int = 0) -> int:
        array = np.frombuffer(buffer, np.uint8)
        return extend(array.ctypes.data, array.nbytes, crc) if array.nbytes else crc

    crc32c.extend = extend
    return crc32c


def _unmask(masked: int) -> int:
    rotated = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rotated >> 17) | (rotated << 15)) & 0xFFFFFFFF


# --- writing --------------------------------------------------------------------------

def _nbytes(tensor) -> int:
    if tensor.dtype == tf.string:
        return 0
    return int(tensor.shape.num_elements() or 0) * tensor.dtype.size


def memory_budget(sizes: list[int]) -> int:
    """Bytes a save or restore of tensors of `sizes` bytes may hold beyond the model: the
    largest tensor + 20% of the model."""
    return max(sizes, default=0) + sum(sizes) // 5


def part_count(sizes: list[int], workers: int) -> int:
    """How many parts (SaveV2 calls, data shards) a checkpoint of tensors of `sizes` bytes is
    written as: one per worker, each of at least MIN_PART_BYTES, and no more than the memory
    budget of a save (the largest tensor + 20% of the checkpoint) holds write buffers of
    PART_BUFFER_BYTES (each SaveV2 has its own)."""
    return max(1, min(workers, sum(sizes) // MIN_PART_BYTES, len(sizes),
                      memory_budget(sizes) // PART_BUFFER_BYTES))


def write_bundle(temp: str, keys: list, tensors: list, workers: int | None = None,
                 slices: list | None = None, here: bool = False) -> None:
    """Writes `tensors` under `keys` at the (temporary) prefix `temp`, in parallel.

    `slices`, when given, holds a slice spec for each tensor ("" for a whole one): the
    tensors given a spec are slices of the tensor under their key, as `tf.train.Checkpoint`
    writes a sharded variable's shards (`_write_sliced`; `here`: every slice written by this
    host, e.g. into the local folder of an upload, which other tasks cannot reach).

    `_bundlewrite` writes them (one data file, written by up to `workers` threads) unless
    one is of a dtype it does not write, TF exports no crc32c or a graph is being built.
    Then: one `SaveV2` when the tensors are small or one thread is asked for; otherwise
    part prefixes `<temp>.part-NNNNN` written on `workers` threads and merged by
    `MergeV2Checkpoints` into `temp` (data shards `<temp>.data-0000k-of-0000K`, one index).
    Files left behind by a failure all start with `temp`'s name.
    """
    workers = threads() if workers is None else workers
    if slices is not None and any(slices):
        _write_sliced(temp, keys, tensors, slices, workers, here)
        return
    crc = native_crc32c()
    if crc is not None and tf.executing_eagerly() and _bundlewrite.supported(tensors):
        _write_own(temp, keys, tensors, workers, crc)
        return
    sizes = [_nbytes(t) for t in tensors]
    count = part_count(sizes, workers)
    if count <= 1:
        _save(temp, keys, tensors)
        return
    groups = _balance(sizes, count)
    parts = [f"{temp}.part-{k:05d}" for k in range(len(groups))]

    def save(k: int) -> None:
        _save(parts[k], [keys[i] for i in groups[k]], [tensors[i] for i in groups[k]])

    _run_all(save, list(range(len(groups))), workers)
    with tf.device("/cpu:0"):
        tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=temp,
                                      delete_old_dirs=False)


def _write_sliced(temp: str, keys: list, tensors: list, slices: list, workers: int,
                  here: bool = False) -> None:
    """Whole tensors written by `write_bundle` as one part, each slice by its own `SaveV2`
    part, merged by `MergeV2Checkpoints` into `temp`: the index lists each sliced tensor
    with its slices, as TF's own save.

    A slice held by another task (a parameter server's shard) is written by that task, as
    `tf.train.Checkpoint` writes it (its bytes never cross this host), the tasks in
    parallel; where that task cannot write the part (its file system does not reach the
    path: the part is not seen here), this host writes it, one shard at a time per thread."""
    whole = [i for i, spec in enumerate(slices) if not spec]
    # In the order TF's saver writes its per-device parts: the index lists slices alike.
    sliced = [i for i in _compat.save_order([getattr(t, "device", "") or "" for t in tensors])
              if slices[i]]
    parts = [f"{temp}.part-{k:05d}" for k in range(len(sliced) + bool(whole))]
    if whole:
        write_bundle(parts[-1], [keys[i] for i in whole], [tensors[i] for i in whole], workers)
    devices = (["/cpu:0"] * len(sliced) if here else
               _compat.io_devices([getattr(tensors[i], "device", "") or "" for i in sliced]))

    def save(k: int) -> None:
        i = sliced[k]
        if devices[k] != "/cpu:0":
            with contextlib.suppress(tf.errors.OpError), tf.device(devices[k]):
                tf.raw_ops.SaveV2(prefix=parts[k], tensor_names=[keys[i]],
                                  shape_and_slices=[slices[i]], tensors=[tensors[i]])
            if os.path.exists(parts[k] + ".index"):
                return
        with tf.device("/cpu:0"):
            tf.raw_ops.SaveV2(prefix=parts[k], tensor_names=[keys[i]],
                              shape_and_slices=[slices[i]], tensors=[tensors[i]])

    _run_all(save, list(range(len(sliced))), max(workers, len(set(devices) - {"/cpu:0"})))
    with tf.device("/cpu:0"):
        tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=temp,
                                      delete_old_dirs=False)


def _write_own(temp: str, keys: list, tensors: list, workers: int, crc) -> None:
    """objckpt's bundle writer: one data file, its tensors checksummed and written straight
    from their buffers by up to `workers` threads, then the index."""
    items = _bundlewrite.plan(keys, tensors, crc)
    fd = os.open(f"{temp}.data-00000-of-00001", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, _bundlewrite.data_bytes(items))

        def write(group):
            for i in group:
                _bundlewrite.write_item(fd, items[i], crc)

        _run_all(write, thread_groups([item.size for item in items], workers), workers)
    finally:
        os.close(fd)
    table = _bundlewrite.index(items, crc)
    with open(f"{temp}.index", "wb") as f:
        f.write(table)


def _save(prefix: str, keys: list, tensors: list) -> None:
    with tf.device("/cpu:0"):
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=keys, shape_and_slices=[""] * len(keys),
                          tensors=tensors)


def fsync_paths(paths, directory: str) -> None:
    """fsync of each file, then of the directory (local file systems only)."""
    for path in [*paths, directory or "."]:
        if "://" in path:
            continue
        flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path == (directory or ".")
                               else 0)
        fd = os.open(path, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- reading --------------------------------------------------------------------------

def _bytes_of(shape, dtype) -> int:
    if dtype == tf.string:
        return 1 << 10
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * dtype.size


def thread_groups(sizes: list[int], workers: int) -> list[list[int]]:
    """Indices into sizes, in groups of about equal bytes, one per reading or writing thread
    (each of at least MIN_THREAD_BYTES)."""
    count = max(1, min(workers, len(sizes), sum(sizes) // MIN_THREAD_BYTES))
    return _balance(sizes, count) if count > 1 else [list(range(len(sizes)))]


def read_tensors(prefix: str, keys: list, dtypes: list, shapes: list | None = None) -> list:
    """RestoreV2 of `keys` (TF checks each tensor's crc32c), in parallel groups by bytes."""
    if not keys:
        return []
    sizes = ([_bytes_of(s, d) for s, d in zip(shapes, dtypes)] if shapes is not None
             else [1] * len(keys))
    workers = threads()
    groups = thread_groups(sizes, workers)

    def read(group):
        with tf.device("/cpu:0"):
            return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[keys[i] for i in group],
                                        shape_and_slices=[""] * len(group),
                                        dtypes=[dtypes[i] for i in group])

    out: list = [None] * len(keys)
    for group, values in zip(groups, _run_all(read, groups, workers)):
        for i, value in zip(group, values):
            out[i] = value
    return out


# DataType enums whose bytes in a checkpoint are the tensor's buffer, little-endian,
# and that DLPack carries (bool, bfloat16 and the quantized types are copied instead).
# Only those TF's CPU `Empty` kernel takes in every supported TF (2.12 registers few):
# float32, float64, int32, uint8, int64, float16.
_DIRECT = frozenset({1, 2, 3, 4, 9, 19})


class Loader:
    """Restores (key -> variable) pairs from one checkpoint, all or nothing, one tensor at a
    time: `verify()` checks every entry's checksum (nothing assigned), then `assign()`.

    `assign_to(variable, value)` assigns a value through the caller's rules (a distributed
    variable's replicas); large entries of plain CPU resource variables are read straight
    into a new tensor the variable adopts.
    """

    def __init__(self, prefix: str, pairs: list, assign_to, describe):
        self.prefix = prefix
        self.index = _bundle.read_index(prefix)
        self.pairs = pairs  # [(key, variable, label)]
        self._assign_to, self._describe = assign_to, describe
        self._files: dict = {}
        self._lock = threading.Lock()
        self._crc = native_crc32c()
        self._sizes = [_bytes_of(v.shape, v.dtype.base_dtype) for _, v, _ in pairs]
        # New tensors in flight at once while assigning: at most the memory budget.
        self._gate = _Budget(memory_budget(self._sizes))

    # --- checks ---

    def _entry(self, key: str):
        entry = self.index.entries.get(key)
        if entry is None or key in self.index.beyond:
            problem = self.index.beyond.get(key, "missing from its index")
            raise self._corrupt(key, problem)
        return entry

    def _corrupt(self, key: str, problem: str) -> errors.CheckpointCorruptError:
        return errors.CheckpointCorruptError(
            f"Checkpoint `{_render.safe(self.prefix)}` is damaged: entry "
            f"`{_render.safe(key)}` ({self._describe(key)}) {problem}. Nothing was changed: "
            "every variable keeps its value. Fix: restore from another checkpoint (pass the "
            "directory to use its newest intact one), or write this one again.", source=self.prefix)

    def _fd(self, shard: int) -> int:
        with self._lock:
            fd = self._files.get(shard)
            if fd is None:
                path = _bundle.shard_name(self.prefix, shard, self.index.num_shards)
                fd = self._files[shard] = os.open(path, os.O_RDONLY)
            return fd

    def close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def _plain(self, entry) -> bool:
        return (not entry.slices and entry.dtype != 7 and self._crc is not None
                and _bundle.dtype_size(entry.dtype) > 0)

    def _check_one(self, job) -> None:
        key, variable, _ = job
        entry = self._entry(key)
        dtype = tf.as_dtype(entry.dtype)
        if _compat.misfit((tuple(entry.shape), dtype), variable):
            raise self._corrupt(key, f"holds {dtype.name}{tuple(entry.shape)} where its "
                                     f"metadata promised {variable.dtype.base_dtype.name}"
                                     f"{tuple(variable.shape)}")
        if not self._plain(entry):
            try:  # TF checks the checksum (and string framing) as it reads
                read_tensors(self.prefix, [key], [dtype])
            except tf.errors.OpError as err:
                raise self._corrupt(key, f"could not be read: {_render.first_line(err)}") \
                    from err
            return
        actual = self._checksum(entry)
        if actual != _unmask(entry.crc32c):
            raise self._corrupt(key, "does not match its checksum (crc32c): its bytes "
                                     "changed after it was written")

    def _checksum(self, entry) -> int:
        fd = self._fd(entry.shard)
        if entry.size < MAP_BYTES:
            data = os.pread(fd, entry.size, entry.offset)
            if len(data) != entry.size:
                return -1
            return self._crc(data)
        return _mapped(fd, entry.offset, entry.size,
                       lambda view: -1 if view is None else self._crc.extend(
                           view.ctypes.data, view.nbytes, 0))

    def verify(self) -> None:
        """Checks every pair's entry (dtype, shape, checksum) without assigning anything."""
        try:
            self._each(self._check_one)
        except errors.ObjckptError:
            raise
        except OSError as err:
            raise errors.CheckpointCorruptError(
                f"Checkpoint `{_render.safe(self.prefix)}` could not be read: "
                f"{_render.first_line(err)}. Nothing was changed. Fix: check the files, or "
                "restore from another checkpoint.", source=self.prefix) from err

    def _each(self, function) -> None:
        workers = threads()
        groups = thread_groups(self._sizes, workers)
        _run_all(lambda group: [function(self.pairs[i]) for i in group], groups, workers)

    # --- assigning ---

    def _assign_one(self, job) -> None:
        key, variable, _ = job
        entry = self.index.entries[key]
        if not self._plain(entry):
            (value,) = read_tensors(self.prefix, [key], [tf.as_dtype(entry.dtype)])
            self._assign_to(variable, value)
            return
        dtype = tf.as_dtype(entry.dtype)
        shape = tuple(entry.shape)
        fd = self._fd(entry.shard)
        if (entry.dtype in _DIRECT and entry.size >= MAP_BYTES
                and _compat.plain_cpu_variable(variable)):
            with self._gate.hold(entry.size):
                value = _read_direct(fd, entry.offset, entry.size, dtype, shape)
                if value is None:
                    raise self._corrupt(key, "was cut short while it was read")
                # The variable adopts the new buffer (AssignVariableOp shares its input);
                # the old one is freed, or kept by what shares it (a Snapshot), unchanged.
                # Through `assign_to`, as every value: the caller's variable may be another
                # (a clone's) or no variable at all (a checkpoint being written).
                self._assign_to(variable, value)
            return
        data = os.pread(fd, entry.size, entry.offset)
        if len(data) != entry.size:
            raise self._corrupt(key, "was cut short while it was read")
        array = np.frombuffer(data, dtype.as_numpy_dtype).reshape(shape)
        self._assign_to(variable, tf.constant(array, dtype=dtype))

    def assign(self) -> None:
        """Writes every pair's value into its variable (after `verify`)."""
        self._each(self._assign_one)


def _mapped(fd: int, offset: int, size: int, use):
    """use(view) on a read-only memory map of [offset, offset + size) of an open file (view:
    uint8 NumPy array; None when the file is shorter); the map is closed when use returns.
    Its pages are mapped up front (MAP_POPULATE where the OS has it: one call instead of a
    page fault per page)."""
    if os.fstat(fd).st_size < offset + size:
        return use(None)
    base = offset - offset % mmap.ALLOCATIONGRANULARITY
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    mapped = mmap.mmap(fd, offset + size - base, flags=flags, prot=mmap.PROT_READ,
                       offset=base)
    try:
        return use(np.frombuffer(mapped, np.uint8, count=size, offset=offset - base))
    finally:
        with contextlib.suppress(BufferError):  # a view still alive: closed when collected
            mapped.close()


class _Budget:
    """Bytes held at once across threads: `hold(n)` waits while others hold too much (one
    holder may always go ahead, whatever its size)."""

    def __init__(self, limit: int):
        self._limit, self._used = limit, 0
        self._free = threading.Condition()

    @contextlib.contextmanager
    def hold(self, size: int):
        with self._free:
            self._free.wait_for(lambda: self._used == 0 or self._used + size <= self._limit)
            self._used += size
        try:
            yield
        finally:
            with self._free:
                self._used -= size
                self._free.notify_all()


class _Exported:
    """A DLPack capsule as NumPy's `from_dlpack` takes it (NumPy asks for `__dlpack__`)."""

    def __init__(self, tensor):
        self._capsule = tf.experimental.dlpack.to_dlpack(tensor)

    def __dlpack__(self, *args, **kwargs):
        del args, kwargs
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU, device 0


def empty_tensor(dtype, shape):
    """(a new CPU tensor TF allocated, uninitialized; its buffer as a writable ctypes char
    array). The buffer is TF's and shared with nothing else until the tensor is used."""
    with tf.device("/cpu:0"):
        value = tf.raw_ops.Empty(shape=tuple(shape), dtype=dtype, init=False)
    view = np.from_dlpack(_Exported(value))  # read-only to NumPy
    return value, (ctypes.c_char * view.nbytes).from_address(view.ctypes.data)


def _read_direct(fd: int, offset: int, size: int, dtype, shape):
    """A new CPU tensor of `dtype` and `shape` holding the `size` bytes at `offset` of an open
    file, read straight into TF's freshly allocated (64-byte aligned) buffer: one copy, from
    the page cache into the tensor; None when the file is shorter. The buffer is TF's and is
    shared with nothing else until the tensor is returned."""
    value, buffer = empty_tensor(dtype, shape)
    if len(buffer) != size:
        raise ValueError(f"tensor of {len(buffer)} bytes for an entry of {size}")
    target = memoryview(buffer).cast("B")
    try:
        got = 0
        while got < size:
            count = os.preadv(fd, [target[got:]], offset + got)
            if count <= 0:
                return None
            got += count
    finally:
        target.release()
        del buffer
    return value


# For the other formats' streaming loaders (safetensors): the same reads, threads and budget.
Budget = _Budget
read_direct = _read_direct
run_all = _run_all
