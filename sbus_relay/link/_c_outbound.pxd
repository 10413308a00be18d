# Types for the compiled build of outbound.py (sbus_relay.accel).
cimport cython

from sbus_relay.protocol._c_natsledger cimport Ledger as CLedger

cdef class Outbound:
    cdef public object map
    cdef public CLedger ledger
    cdef object _export
    cdef object _identity
    cdef dict _decided
    cdef bytes _long
    cdef public dict drops
    cdef public long long payload_bytes

    @cython.locals(got=tuple, keys=list, payloads=list, i=Py_ssize_t)
    cpdef bint take(self, list out, bytes packet) except -1
    @cython.locals(decided=object, seq=cython.longlong)
    cpdef add(self, list out, bytes key, bytes payload)
    cdef object _decide(self, bytes key)
