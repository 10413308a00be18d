# Types for the compiled build of index.py (sbus_relay.accel): the Python
# source is the one truth; this file only says what is a C type.
cimport cython

from sbus_relay.protocol._c_scan cimport cut, find_byte, size_of

cdef int _SLASH
cdef int _STAR
cdef bytes CRED

cdef tuple _EMPTY

cdef class _Node:
    cdef public dict children
    cdef public _Node star
    cdef public dict prefixed
    cdef public tuple exact
    cdef public tuple tail

    cpdef bint empty(self)

cdef class _Level:
    cdef public dict down
    cdef public dict ends

@cython.locals(level=_Level, nxt=_Level, start=Py_ssize_t, slash=Py_ssize_t, seg=bytes)
cdef void _file(_Level root, bytes key) except *
cdef list _chosen(dict table, bytes seg, bint starred)
cdef void _gather(_Level level, list out) except *
@cython.locals(last=bint, child=_Level)
cdef void _found(_Level level, list segs, list starred, bint tail, Py_ssize_t i,
                 list out) except *

cdef class SubscriptionIndex:
    cdef readonly _Node _public
    cdef readonly _Node _secret
    cdef tuple _everything
    cdef dict _exact
    cdef dict _prefix
    cdef dict _dead
    cdef dict _owned
    cdef dict _stale
    cdef dict _extra
    cdef dict _solo
    cdef public dict cache
    cdef public Py_ssize_t cache_size
    cdef _Level _keys
    cdef Py_ssize_t _filed
    cdef bint _keeping
    cdef Py_ssize_t _hits
    cdef Py_ssize_t _misses
    cdef Py_ssize_t _prefix_longest
    cdef Py_ssize_t _depth
    cdef Py_ssize_t _distinct
    cdef Py_ssize_t _total
    cdef public object on_first
    cdef public object on_last
    cdef public object quiet

    @cython.locals(hit=tuple, cache=dict, result=tuple)
    cpdef tuple match(self, bytes key)
    cpdef tuple lookup(self, bytes key)
    @cython.locals(slash=Py_ssize_t, longest=Py_ssize_t, secret=bint, parts=list,
                   hit=tuple, head=bytes, prefixes=dict, result=tuple, merged=dict)
    cdef tuple _lookup(self, bytes key)
    @cython.locals(cache=dict, star=Py_ssize_t, segs=list, starred=list, tail=bint,
                   out=list, secret=bint)
    cpdef list cached(self, bytes pattern)
    @cython.locals(cache=dict, hit=tuple)
    cdef void _cache_add(self, client, bytes pattern) except *
    @cython.locals(cache=dict)
    cdef void _cache_drop(self, client, bytes pattern) except *
    @cython.locals(cache=dict)
    cdef void _cache_store(self, bytes key, tuple result) except *
    cpdef tuple holders(self, bytes pattern)
    cdef tuple _holders(self, bytes pattern)
    cdef list _held(self, client)
    @cython.locals(seen=set, held=list)
    cdef list _live(self, client, list owned)
    cpdef Py_ssize_t distinct_of(self, client)
    cpdef Py_ssize_t count_of(self, client, bytes pattern)
    cpdef add(self, client, bytes pattern)
    cpdef bint remove(self, client, bytes pattern)
    cdef tuple _with(self, tuple holders, client)
    cdef tuple _without(self, tuple holders, client)
    cdef bint _heard(self, tuple holders)

@cython.locals(i=Py_ssize_t)
cdef void _walk(_Node node, list segs, Py_ssize_t i, list out) except *
