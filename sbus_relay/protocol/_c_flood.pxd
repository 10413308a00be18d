# Types for the compiled build of flood.py (sbus_relay.accel).
cimport cython

from sbus_relay.protocol._c_quota cimport Account as CAccount
from sbus_relay.protocol._c_scan cimport size_of

cdef object _QUEUE
cdef object _QUEUE_AND_WAIT_EMPTY
cdef object _QUEUE_AND_WAIT_BELOW
cdef object _DROP_SOFT
cdef object _DROP_HARD
cdef object _DROP_UPWARD
cdef object _DISCONNECT
cdef str _SOFT_DISCARD

cdef class OutboundQueue:
    cdef Py_ssize_t _front
    cdef Py_ssize_t _head
    cdef object _heap
    cdef list _packets
    cdef Py_ssize_t _seq
    cdef list _times
    cdef public CAccount account
    cdef public Py_ssize_t count
    cdef public str hard
    cdef public Py_ssize_t max_bytes
    cdef public Py_ssize_t max_messages
    cdef public Py_ssize_t nbytes
    cdef public str order
    cdef public str soft
    cdef public bint upward

    cpdef bint over_limit(self)
    @cython.locals(size=Py_ssize_t)
    cpdef push(self, bytes packet, double now)
    @cython.locals(size=Py_ssize_t, n=Py_ssize_t, head=Py_ssize_t, end=Py_ssize_t,
                   packets=list, times=list)
    cpdef tuple take(self, Py_ssize_t limit)
    @cython.locals(size=Py_ssize_t, i=Py_ssize_t, n=Py_ssize_t, head=Py_ssize_t)
    cpdef put_back(self, list packets, list times)
    cpdef Py_ssize_t clear(self)

cpdef decide(OutboundQueue q)
cpdef bint still_blocked(action, OutboundQueue q)
cpdef bint shedding_ends(str reason, OutboundQueue q)
cpdef decide_reply(OutboundQueue q)
