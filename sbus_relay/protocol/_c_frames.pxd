# Types for the compiled build of frames.py (sbus_relay.accel).
cimport cython

from sbus_relay.protocol._c_scan cimport cut, find_byte, read_u32

cdef bytes _MSG
cdef int _NUL
cdef bytes _BATCH

@cython.locals(nul=Py_ssize_t)
cdef Py_ssize_t _msg_nul(bytes packet) except -2
@cython.locals(nul=Py_ssize_t)
cpdef bytes msg_key(bytes packet)
@cython.locals(nul=Py_ssize_t)
cpdef tuple msg_parts(bytes packet)
cpdef bint is_msg(bytes packet)
cpdef bint is_batch(bytes packet)
@cython.locals(offset=Py_ssize_t, end=Py_ssize_t, count=Py_ssize_t, size=Py_ssize_t,
               nul=Py_ssize_t, packet=bytes, packets=list, keys=list, bodies=list)
cdef tuple _walk(bytes frame, bint payloads, bint whole=*)
@cython.locals(packets=list, keys=list)
cpdef tuple unpack(bytes frame)
cpdef tuple unpack_full(bytes frame)
cpdef tuple unpack_messages(bytes frame)

cdef object _LENGTH

cdef class BatchFrame:
    cdef public bytearray data
    cdef public Py_ssize_t count
    cdef public Py_ssize_t limit

    @cython.locals(size=Py_ssize_t, data=bytearray)
    cpdef bint add(self, bytes head, bytes payload)
    cpdef bytes frame(self)
