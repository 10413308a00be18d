# Types for the compiled build of episodes.py (sbus_relay.accel).
cimport cython

cdef class Episode:
    cdef public long long count
    cdef public str event
    cdef public bint held
    cdef public long long reported
    cdef public double said_at
    cdef public long long seen
    cdef public double since
    cdef public bint tell_end

    cpdef bint untold(self)

cdef class Episodes:
    cdef public dict open
