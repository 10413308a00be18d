# Types for the compiled build of natsledger.py (sbus_relay.accel).
cimport cython

cdef class Destination:
    cdef public long long count
    cdef public long long incarnation
    cdef public bint repeated
    cdef public bint silent
    cdef public long long start
    cdef public long long told
    cdef public double told_at
    cdef public long long view

    cpdef reset(self, long long incarnation, long long view, long long start)

cdef class Ledger:
    cdef public long long incarnation
    cdef public str prefix
    cdef public long long seq
    cdef public dict dests
    cdef dict _retired
    cdef object _index
    cdef public Py_ssize_t silenced
    cdef dict _cuts

    @cython.locals(holders=tuple, wanted=bint, d=Destination)
    cpdef long long stamp(self, bytes key)
    @cython.locals(d=Destination)
    cpdef long long stamp_long(self)
    cpdef str value(self, long long seq)
