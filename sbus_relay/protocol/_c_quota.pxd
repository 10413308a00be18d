# Types for the compiled build of quota.py (sbus_relay.accel): a queue adds
# to its user's queued bytes on every packet it takes or gives.
cimport cython

cdef class Account:
    cdef public Py_ssize_t connections
    cdef public Py_ssize_t max_bytes
    cdef public Py_ssize_t nbytes
    cdef public Py_ssize_t pattern_bytes
    cdef public Py_ssize_t patterns
    cdef public object quota
