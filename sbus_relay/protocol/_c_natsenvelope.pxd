# Types for the compiled build of natsenvelope.py (sbus_relay.accel).
cimport cython

cdef int _ZERO
cdef Py_ssize_t _DIGITS
cdef unsigned long long _END

@cython.locals(n=cython.ulonglong, ch=cython.Py_UCS4, digit=cython.long)
cdef long long _number(str text)
@cython.locals(seq=cython.longlong)
cpdef object split(object value)
cdef bytes _BLOCK_HEAD
cdef bytes _BLOCK_TAIL
cdef Py_ssize_t _BLOCK_MAX
cpdef bytes hpub(bytes subject, str value, bytes payload)
cpdef object from_block(object raw)
