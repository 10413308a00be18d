# Types for the compiled build of scan.py (sbus_relay.accel).
cimport cython

@cython.locals(i=Py_ssize_t, chars=cython.p_uchar)
cpdef Py_ssize_t find_byte(bytes data, int byte, Py_ssize_t start)
cpdef bytes cut(bytes data, Py_ssize_t start, Py_ssize_t end)
@cython.locals(i=Py_ssize_t, total=Py_ssize_t)
cpdef Py_ssize_t size_of(list packets, Py_ssize_t n)
@cython.locals(chars=cython.p_uchar)
cpdef Py_ssize_t read_u32(bytes data, Py_ssize_t offset)
