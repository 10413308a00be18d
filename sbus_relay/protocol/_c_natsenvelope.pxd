# Types for the compiled build of natsenvelope.py (sbus_relay.accel).
cimport cython

cdef object _DIGIT_SET

cdef object _number(str text)
@cython.locals(seq=object)
cpdef object split(object value)
cdef bytes _BLOCK_HEAD
cdef bytes _BLOCK_TAIL
cdef Py_ssize_t _BLOCK_MAX
cpdef bytes hpub(bytes subject, str value, bytes payload)
cpdef object from_block(object raw)
