# Types for the compiled build of natssubs.py (sbus_relay.accel).
cimport cython

cdef class Subscription:
    cdef public long long added
    cdef public long long order
    cdef public Py_ssize_t patterns
    cdef public long long removed

cdef class Subscriptions:
    cdef public dict subs
    cdef object _live
    cdef object _grace
    cdef dict _ending
    cdef long long _made
    cdef set _added
    cdef set _removed
    cdef public Py_ssize_t version

    @cython.locals(holders=tuple, ending=tuple)
    cpdef object taker(self, bytes r, bytes key)
    @cython.locals(subs=dict, first=bytes, order=cython.longlong, h=bytes, s=Subscription)
    cdef bytes _oldest(self, tuple holders)
    @cython.locals(subs=dict, s=Subscription)
    cpdef bint counted(self, tuple holders, long long view)
    cpdef bint maybe_counted(self, tuple holders, long long view)
    @cython.locals(holders=tuple, ending=tuple)
    cpdef object decide(self, bytes key)
    cdef long long _oldest_sid(self, tuple holders)
