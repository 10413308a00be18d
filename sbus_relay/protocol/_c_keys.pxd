# Types for the compiled build of keys.py (sbus_relay.accel).
cimport cython

cdef bytes _BANG
cdef bytes _CRED_SEG
cdef Py_ssize_t _GROUP

@cython.locals(i=Py_ssize_t, n=Py_ssize_t)
cdef object _chain_end(list segs, bint digits)
cpdef bint valid_key(bytes key)

