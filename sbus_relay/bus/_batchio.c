/* _batchio: many packets per system call, for the bus's hot path.
 *
 * An optional compiled helper (the pure-Python path in batchio.py does the
 * same, one packet per call, and is tested too).  Two functions:
 *
 *   recv_many(fd, max) -> list
 *       recvmmsg(2) up to `max` packets (at most RECV_SLOTS) without blocking.
 *       Each item is the packet as bytes; b"" for an empty packet (or the peer's
 *       end of stream: the caller tells them apart), or None for a packet longer
 *       than MAX_PACKET (its rest was cut off: the caller treats it as a protocol
 *       error).  [] when nothing is waiting.  Other errors raise OSError.
 *
 *   send_many(fd, packets, start) -> int
 *       sendmmsg(2) packets[start:] (a list of bytes) without blocking; returns
 *       how many the socket took (0 when it would block).  Other errors raise
 *       OSError.
 *
 * Each slot is MAX_PACKET + 1 bytes so that MSG_TRUNC marks an over-long
 * packet; the slots are allocated once, on first use, and only the pages a
 * packet touches become resident.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>

#define MAX_PACKET 409600
#define RECV_SLOTS 64
#define SEND_BATCH 256

static char *slots;
static struct mmsghdr recv_msgs[RECV_SLOTS];
static struct iovec recv_iov[RECV_SLOTS];

static PyObject *
recv_many(PyObject *self, PyObject *args)
{
	int fd, max, n, i;
	PyObject *out;
	(void)self;
	if (!PyArg_ParseTuple(args, "ii", &fd, &max))
		return NULL;
	if (max > RECV_SLOTS)
		max = RECV_SLOTS;
	if (max < 1)
		max = 1;
	if (!slots) {
		slots = malloc((size_t)RECV_SLOTS * (MAX_PACKET + 1));
		if (!slots)
			return PyErr_NoMemory();
		for (i = 0; i < RECV_SLOTS; i++) {
			recv_iov[i].iov_base = slots + (size_t)i * (MAX_PACKET + 1);
			recv_iov[i].iov_len = MAX_PACKET + 1;
		}
	}
	for (i = 0; i < max; i++) {
		memset(&recv_msgs[i].msg_hdr, 0, sizeof(recv_msgs[i].msg_hdr));
		recv_msgs[i].msg_hdr.msg_iov = &recv_iov[i];
		recv_msgs[i].msg_hdr.msg_iovlen = 1;
		recv_msgs[i].msg_len = 0;
	}
	/* non-blocking, and the slots are shared: the GIL stays held */
	n = recvmmsg(fd, recv_msgs, (unsigned)max, MSG_DONTWAIT, NULL);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return PyList_New(0);
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	out = PyList_New(n);
	if (!out)
		return NULL;
	for (i = 0; i < n; i++) {
		PyObject *item;
		unsigned len = recv_msgs[i].msg_len;
		if ((recv_msgs[i].msg_hdr.msg_flags & MSG_TRUNC) || len > MAX_PACKET) {
			Py_INCREF(Py_None);
			item = Py_None;
		} else {
			item = PyBytes_FromStringAndSize(recv_iov[i].iov_base, len);
			if (!item) {
				Py_DECREF(out);
				return NULL;
			}
		}
		PyList_SET_ITEM(out, i, item);
		if (len == 0) {
			/* an empty packet or the end of stream: nothing after it counts */
			PyObject *cut = PyList_GetSlice(out, 0, i + 1);
			Py_DECREF(out);
			return cut;
		}
	}
	return out;
}

static PyObject *
send_many(PyObject *self, PyObject *args)
{
	int fd, sent;
	Py_ssize_t start, count, i, k;
	PyObject *packets;
	struct mmsghdr msgs[SEND_BATCH];
	struct iovec iov[SEND_BATCH];
	(void)self;
	if (!PyArg_ParseTuple(args, "iO!n", &fd, &PyList_Type, &packets, &start))
		return NULL;
	count = PyList_GET_SIZE(packets) - start;
	if (count <= 0)
		return PyLong_FromLong(0);
	if (count > SEND_BATCH)
		count = SEND_BATCH;
	for (k = 0; k < count; k++) {
		PyObject *packet = PyList_GET_ITEM(packets, start + k);
		if (!PyBytes_Check(packet)) {
			PyErr_SetString(PyExc_TypeError, "packets must be bytes");
			return NULL;
		}
		iov[k].iov_base = PyBytes_AS_STRING(packet);
		iov[k].iov_len = (size_t)PyBytes_GET_SIZE(packet);
		memset(&msgs[k].msg_hdr, 0, sizeof(msgs[k].msg_hdr));
		msgs[k].msg_hdr.msg_iov = &iov[k];
		msgs[k].msg_hdr.msg_iovlen = 1;
	}
	/* the list holds its items, and nothing else runs while we send: no
	 * need to release the GIL around a non-blocking call */
	sent = sendmmsg(fd, msgs, (unsigned)count, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (sent < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return PyLong_FromLong(0);
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	i = sent;
	return PyLong_FromSsize_t(i);
}

static PyMethodDef methods[] = {
	{"recv_many", recv_many, METH_VARARGS, "recvmmsg(2) up to max packets."},
	{"send_many", send_many, METH_VARARGS, "sendmmsg(2) packets[start:]."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_batchio", "Many packets per system call.", -1, methods,
	NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__batchio(void)
{
	return PyModule_Create(&module);
}
