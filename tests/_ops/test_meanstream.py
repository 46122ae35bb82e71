"""The streamed mean's pieces (`_ops.meanstream`): the checksums it extends as it reads."""

import numpy as np
import pytest


def _implementations():
    """Every crc32c the averages may use here: the one chosen, each package on its own, TF's,
    and objckpt's NumPy one."""
    import importlib

    from objckpt._bundle import fastio, objgraph
    from objckpt._ops import meanstream

    found = {"chosen": meanstream.crc32c(),
             "numpy": lambda data, crc=0: objgraph.crc32c(memoryview(data), crc)}
    for name in ("crc32c", "google_crc32c"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found[name] = (lambda data, crc=0, m=module: m.crc32c(data, crc)) if name == "crc32c" \
            else (lambda data, crc=0, m=module: m.extend(crc, bytes(data)))
    native = fastio.native_crc32c()
    if native is not None:
        found["tensorflow"] = native
    return found


def test_every_crc32c_gives_the_same_checksum_in_pieces():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    implementations = _implementations()
    assert "chosen" in implementations and len(implementations) >= 3
    # the standard check value, then a buffer fed in uneven pieces (the chaining averages do)
    for name, crc in implementations.items():
        assert crc(np.frombuffer(b"123456789", np.uint8)) == 0xE3069283, name
    cuts = [0, 1, 7, 4096, 65537, 300000, data.size]
    want = None
    for name, crc in implementations.items():
        value = 0
        for start, stop in zip(cuts, cuts[1:]):
            piece = data[start:stop]
            value = crc(piece, value)
        assert want is None or value == want, name
        want = value


def test_the_crc32c_package_is_chosen_first_where_it_is_installed(monkeypatch):
    """The `crc32c` package checks a buffer without the GIL, so a window is checked on the
    reading thread while the caller adds the previous one: it is chosen over google-crc32c
    (which holds the GIL) when both are installed."""
    crc32c = pytest.importorskip("crc32c")

    from objckpt._ops import meanstream

    calls, real = [], crc32c.crc32c

    def recorded(data, value=0):
        calls.append(len(data))
        return real(data, value)

    monkeypatch.setattr(crc32c, "crc32c", recorded)
    data = np.arange(1 << 16, dtype=np.uint8)
    assert meanstream.crc32c(fallback=False)(data, 5) == real(data, 5)
    assert calls == [1 << 16]
