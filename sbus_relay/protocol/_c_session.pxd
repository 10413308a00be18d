# Types for the compiled build of session.py (sbus_relay.accel): Session is
# the base of bus.connection.Connection, whose C layout begins with these.
cimport cython

cdef class Session:
    cdef public str ended
    cdef public bint alive
    cdef public bint echo
    cdef public bint follows
    cdef public bint interest
    cdef public bint packs
    cdef public bint relay
    cdef public bint upward

    cpdef receive(self, bytes packet)
    cpdef bint end(self, str reason)
    cpdef notice(self, str reason, str detail=*)
