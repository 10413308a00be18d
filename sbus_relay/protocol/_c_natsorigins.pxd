# Types for the compiled build of natsorigins.py (sbus_relay.accel).
cimport cython

from sbus_relay.protocol._c_natssubs cimport Subscriptions as CSubscriptions

cdef long long _MASK
cdef int _SILENT
cdef object _first

cdef class Origin:
    cdef public long long arrived
    cdef public long long base
    cdef public int causes
    cdef public long long delivered
    cdef public long long duplicate
    cdef public object early
    cdef public long long excess
    cdef public long long floor
    cdef public double heard
    cdef public str host
    cdef public long long incarnation
    cdef public str label
    cdef public long long last
    cdef public long long late
    cdef public list lost
    cdef public tuple marks
    cdef public bint rebase
    cdef public object ring
    cdef public long long sent
    cdef public long long start
    cdef public long long streak
    cdef public double streak_since
    cdef public bint unordered
    cdef public long long view

    cpdef list row(self)

cdef class Origins:
    cdef public long long incarnation
    cdef public CSubscriptions subs
    cdef str _own
    cdef public dict origins
    cdef dict _by_host
    cdef long long _downs
    cdef long long _slows
    cdef dict _batch
    cdef dict _gone
    cdef set _labels
    cdef set _strangers
    cdef set _known
    cdef dict _shown
    cdef object _episodes
    cdef dict _episode_start
    cdef double _ticked
    cdef list _reports
    cdef public long long malformed
    cdef public long long own
    cdef public long long stale
    cdef public long long evicted
    cdef public long long crowded
    cdef public long long resyncs
    cdef long long _early

    @cython.locals(got=object, o=Origin)
    cpdef int arrive(self, object value, object holders, bint deliver, object item, double now)
    @cython.locals(got=object, o=Origin)
    cpdef int count(self, object value, bytes payload, double now)
    @cython.locals(o=Origin)
    cdef Origin _origin(self, str text, double now)
    @cython.locals(batch=dict, entries=list)
    cdef int _hold(self, Origin o, long long place, object holders, bint deliver,
                   object item) except -1
    @cython.locals(out=list, o=Origin, entries=list, place=cython.longlong, seq=cython.longlong,
                   superseded=bint)
    cpdef list release(self, double now)
    cdef inline void _arrived(self, Origin o, object holders, long long seq) except *
    @cython.locals(newest=Origin)
    cdef bint _superseded(self, Origin o) except -1
    cdef bint _resync(self, Origin o, long long seq, double now) except -1
    @cython.locals(early=dict, seqs=list)
    cdef void _early_add(self, Origin o, object holders, long long seq) except *
    @cython.locals(got=cython.longlong, seqs=list)
    cdef long long _early_got(self, Origin o, long long view, long long start,
                              long long upto) except -1
    cdef void _early_done(self, Origin o) except *
