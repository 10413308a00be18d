"""Bytes scanned and cut on the hot path, without Python's per-call costs.  No I/O.

What it owns: finding and cutting bytes on the hot path.  What it may touch:
nothing (pure functions).

``bytes.find`` parses its arguments on every call and slicing builds a
slice object; on a path that runs several times per message that is most of
the cost.  Compiled (``sbus_relay.accel``), these are plain loops and copies
in C; in pure Python they are the built-in methods they stand for.
"""

from __future__ import annotations

from sbus_relay.accel import compiled, load_compiled

if not compiled():
    try:
        import cython
    except ImportError:  # Cython is needed only to build the compiled path
        from sbus_relay.accel import NotCompiled as cython
else:
    # The compiled twin replaces this module at its end: until then only
    # ``cython.compiled`` is read, so Cython's shadow module (1.5 MiB) stays out.
    from sbus_relay.accel import NotCompiled as cython


def find_byte(data: bytes, byte: int, start: int) -> int:
    """``data.find(byte, start)``: compiled, a plain loop in C, with none of the
    argument parsing a call of ``bytes.find`` costs."""
    if cython.compiled:
        chars = cython.cast(cython.p_uchar, data)
        for i in range(start, len(data)):
            if chars[i] == byte:
                return i
        return -1
    return data.find(byte, start)


def cut(data: bytes, start: int, end: int) -> bytes:
    """``data[start:end]`` (0 <= start <= end <= len(data)): compiled, one copy
    and no slice object."""
    if cython.compiled:
        copy: bytes = cython.cast(cython.p_char, data)[start:end]
        return copy
    return data[start:end]


def read_u32(data: bytes, offset: int) -> int:
    """The 4 bytes at ``offset`` as a big-endian number (the caller checked
    they are there)."""
    if cython.compiled:
        chars = cython.cast(cython.p_uchar, data)
        # widened before the shift: an int's ``0x80 << 24`` is negative
        value: int = (
            (cython.cast(cython.Py_ssize_t, chars[offset]) << 24)
            | (chars[offset + 1] << 16)
            | (chars[offset + 2] << 8)
            | chars[offset + 3]
        )
        return value
    return int.from_bytes(data[offset : offset + 4], "big")


def size_of(packets: list[bytes], n: int) -> int:
    """The bytes of ``packets[:n]``."""
    if cython.compiled:
        total = 0
        for i in range(n):
            total += len(cython.cast(bytes, packets[i]))
        return total
    return sum(map(len, packets if n >= len(packets) else packets[:n]))


load_compiled(globals(), "sbus_relay.protocol._c_scan")
