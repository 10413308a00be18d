# Types for the compiled build of tobus.py (sbus_relay.accel).
cimport cython

from sbus_relay.protocol._c_frames cimport BatchFrame as CBatchFrame

cdef Py_ssize_t _MESSAGES_MAX
cdef Py_ssize_t _CONTROL_MAX
cdef Py_ssize_t _FRAME_BYTES

cdef class BusWriter:
    cdef object _sock
    cdef int _fd
    cdef object _loop
    cdef object _frames
    cdef Py_ssize_t _queued
    cdef dict _notices
    cdef object _control
    cdef object _stats
    cdef bint _writing
    cdef bint _soon
    cdef public bint gone

    cpdef tell(self, bytes pattern, bint present)
    cpdef bint control(self, bytes packet) except -1
    cpdef stats(self, bytes packet)
    @cython.locals(queue=object, frame=CBatchFrame)
    cpdef bint put(self, bytes head, bytes payload) except -1
    cpdef stop(self)
    cdef _schedule(self)
