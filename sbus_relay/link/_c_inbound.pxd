# Types for the compiled build of inbound.py (sbus_relay.accel).
cimport cython

# (cimported under names of their own: the Python names stay the .py's imports)
from sbus_relay.link._c_tobus cimport BusWriter as CBusWriter
from sbus_relay.protocol._c_natsorigins cimport Origins as COrigins
from sbus_relay.protocol._c_natssubs cimport Subscriptions as CSubscriptions

cdef class Inbound:
    cdef public object map
    cdef object _import
    cdef object _identity
    cdef CSubscriptions _subs
    cdef CBusWriter _writer
    cdef object _control
    cdef public COrigins origins
    cdef object _soon
    cdef bint _releasing
    cdef double _now
    cdef dict _decided
    cdef Py_ssize_t _version
    cdef public Py_ssize_t received
    cdef public Py_ssize_t received_bytes
    cdef public dict drops

    @cython.locals(known=object, decided=object, holders=object, deliver=bint, head=object,
                   held=int)
    cpdef message(self, Py_ssize_t sid, bytes subject, object envelope, bytes payload)
    cpdef release(self)
    cpdef count(self, object envelope, bytes payload)
    cdef _put(self, bytes head, bytes payload)
