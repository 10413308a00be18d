/* _batchio: many packets per system call, for the bus's hot path.
 *
 * An optional compiled helper (the pure-Python path in batchio.py does the
 * same, one packet per call, and is tested too).  Each takes the socket's
 * file descriptor, as the pure-Python ones do:
 *
 *   recv_many(fd, max) -> list
 *       recvmmsg(2) up to `max` packets (at most RECV_SLOTS) without blocking.
 *       Each item is the packet as bytes; b"" for an empty packet (or the peer's
 *       end of stream: the caller tells them apart), or None for a packet longer
 *       than MAX_PACKET (its rest was cut off: the caller treats it as a protocol
 *       error).  [] when nothing is waiting.  Other errors raise OSError.
 *
 *   send_all(fd, packets) -> int
 *       sendmmsg(2) the list of bytes `packets`, SEND_BATCH at a time, until
 *       all are sent or the socket would block; returns how many it took.
 *       Other errors raise OSError.
 *
 *   send_packed(fd, packets, head) -> int
 *       The same packets in packed batches (docs/protocol.md, "Packed
 *       batches"): each frame is `head` then, per MSG packet, its length in
 *       4 bytes (big-endian) and the packet, at most BATCH_MESSAGES packets
 *       and MAX_PACKET bytes a frame; a packet that is not a MSG, and a MSG
 *       that no other joins, goes alone, as it is (the frames codec.pack
 *       writes).  The frames are gathered from the packets themselves (one
 *       iovec each), nothing is copied.  Returns how many packets went, in
 *       whole frames.
 *
 *   send_one(fd, packet) -> None
 *       send(2) one packet without blocking; BlockingIOError when the socket
 *       is full, OSError on any other error.
 *
 * Each slot is MAX_PACKET + 1 bytes so that MSG_TRUNC marks an over-long
 * packet; the slots are allocated once, on first use, and only the pages a
 * packet touches become resident.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <stdlib.h>
#include <sys/socket.h>

#define MAX_PACKET 409600
#define RECV_SLOTS 64
#define SEND_BATCH 256
#define BATCH_MESSAGES 256
#define FRAMES 16

static char *slots;

/* An int argument (a file descriptor, a count): -1 with an exception if it is not one. */
static int
as_int(PyObject *value)
{
	long v = PyLong_AsLong(value);
	if (v == -1 && PyErr_Occurred())
		return -1;
	if (v < 0 || v > INT_MAX) {
		PyErr_SetString(PyExc_ValueError, "out of range");
		return -1;
	}
	return (int)v;
}
static struct mmsghdr recv_msgs[RECV_SLOTS];
static struct iovec recv_iov[RECV_SLOTS];

static PyObject *
recv_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	int fd, max, n, i;
	PyObject *out;
	(void)self;
	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "recv_many(fd, max)");
		return NULL;
	}
	fd = as_int(args[0]);
	max = as_int(args[1]);
	if (fd == -1 || max == -1)
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
send_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	int fd, sent;
	Py_ssize_t total, done = 0, count, k;
	PyObject *packets;
	struct mmsghdr msgs[SEND_BATCH];
	struct iovec iov[SEND_BATCH];
	(void)self;
	if (nargs != 2 || !PyList_Check(args[1])) {
		PyErr_SetString(PyExc_TypeError, "send_all(fd, packets: list)");
		return NULL;
	}
	fd = as_int(args[0]);
	if (fd == -1)
		return NULL;
	packets = args[1];
	total = PyList_GET_SIZE(packets);
	while (done < total) {
		count = total - done;
		if (count > SEND_BATCH)
			count = SEND_BATCH;
		for (k = 0; k < count; k++) {
			PyObject *packet = PyList_GET_ITEM(packets, done + k);
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
				break;
			if (done)
				break; /* report what went; the error comes back on the next call */
			return PyErr_SetFromErrno(PyExc_OSError);
		}
		done += sent;
		if (sent < count)
			break; /* the socket is full */
	}
	return PyLong_FromSsize_t(done);
}

/* Whether a packet is a MSG (only those are packed). */
static int
is_msg(PyObject *packet)
{
	return PyBytes_GET_SIZE(packet) >= 4 && !memcmp(PyBytes_AS_STRING(packet), "MSG ", 4);
}

static PyObject *
send_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	int fd, sent;
	Py_ssize_t total, done = 0, k, next, frames, f;
	PyObject *packets, *head;
	/* per frame: the head, then a length and a packet per packet */
	static struct iovec iov[FRAMES][1 + 2 * BATCH_MESSAGES];
	static unsigned char lengths[FRAMES][BATCH_MESSAGES][4];
	struct mmsghdr msgs[FRAMES];
	Py_ssize_t counts[FRAMES];
	(void)self;
	if (nargs != 3 || !PyList_Check(args[1]) || !PyBytes_Check(args[2])) {
		PyErr_SetString(PyExc_TypeError, "send_packed(fd, packets: list, head: bytes)");
		return NULL;
	}
	fd = as_int(args[0]);
	if (fd == -1)
		return NULL;
	packets = args[1];
	head = args[2];
	total = PyList_GET_SIZE(packets);
	while (done < total) {
		next = done;
		for (frames = 0; frames < FRAMES && next < total; frames++) {
			size_t bytes = (size_t)PyBytes_GET_SIZE(head);
			Py_ssize_t n = 0;
			PyObject *first = PyList_GET_ITEM(packets, next);
			if (!PyBytes_Check(first)) {
				PyErr_SetString(PyExc_TypeError, "packets must be bytes");
				return NULL;
			}
			if (!is_msg(first)) {
				/* not a MSG (a reply, a control message): alone, as it is */
				iov[frames][0].iov_base = PyBytes_AS_STRING(first);
				iov[frames][0].iov_len = (size_t)PyBytes_GET_SIZE(first);
				memset(&msgs[frames].msg_hdr, 0, sizeof(msgs[frames].msg_hdr));
				msgs[frames].msg_hdr.msg_iov = iov[frames];
				msgs[frames].msg_hdr.msg_iovlen = 1;
				counts[frames] = 1;
				next++;
				continue;
			}
			iov[frames][0].iov_base = PyBytes_AS_STRING(head);
			iov[frames][0].iov_len = bytes;
			while (next < total && n < BATCH_MESSAGES) {
				PyObject *packet = PyList_GET_ITEM(packets, next);
				size_t len;
				if (!PyBytes_Check(packet)) {
					PyErr_SetString(PyExc_TypeError, "packets must be bytes");
					return NULL;
				}
				if (!is_msg(packet))
					break; /* it goes alone, in the next frame */
				len = (size_t)PyBytes_GET_SIZE(packet);
				if (n && bytes + 4 + len > MAX_PACKET)
					break; /* the next frame takes it */
				lengths[frames][n][0] = (unsigned char)(len >> 24);
				lengths[frames][n][1] = (unsigned char)(len >> 16);
				lengths[frames][n][2] = (unsigned char)(len >> 8);
				lengths[frames][n][3] = (unsigned char)len;
				iov[frames][1 + 2 * n].iov_base = lengths[frames][n];
				iov[frames][1 + 2 * n].iov_len = 4;
				iov[frames][2 + 2 * n].iov_base = PyBytes_AS_STRING(packet);
				iov[frames][2 + 2 * n].iov_len = len;
				bytes += 4 + len;
				n++;
				next++;
			}
			memset(&msgs[frames].msg_hdr, 0, sizeof(msgs[frames].msg_hdr));
			msgs[frames].msg_hdr.msg_iov = iov[frames];
			msgs[frames].msg_hdr.msg_iovlen = (size_t)(1 + 2 * n);
			if (n == 1) {
				/* a MSG that no other joins goes as it is (codec.pack) */
				iov[frames][0] = iov[frames][2];
				msgs[frames].msg_hdr.msg_iovlen = 1;
			}
			counts[frames] = n;
		}
		sent = sendmmsg(fd, msgs, (unsigned)frames, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (sent < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			if (done)
				break; /* report what went; the error comes back on the next call */
			return PyErr_SetFromErrno(PyExc_OSError);
		}
		for (f = 0; f < sent; f++)
			done += counts[f];
		if (sent < frames)
			break; /* the socket is full */
	}
	k = done;
	return PyLong_FromSsize_t(k);
}

static PyObject *
send_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	int fd;
	(void)self;
	if (nargs != 2 || !PyBytes_Check(args[1])) {
		PyErr_SetString(PyExc_TypeError, "send_one(fd, packet: bytes)");
		return NULL;
	}
	fd = as_int(args[0]);
	if (fd == -1)
		return NULL;
	if (send(fd, PyBytes_AS_STRING(args[1]), (size_t)PyBytes_GET_SIZE(args[1]),
		 MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		return PyErr_SetFromErrno(PyExc_OSError);
	Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
	{"recv_many", (PyCFunction)(void (*)(void))recv_many, METH_FASTCALL,
	 "recvmmsg(2) up to max packets."},
	{"send_all", (PyCFunction)(void (*)(void))send_all, METH_FASTCALL,
	 "sendmmsg(2) the packets until the socket is full."},
	{"send_packed", (PyCFunction)(void (*)(void))send_packed, METH_FASTCALL,
	 "sendmmsg(2) the packets in packed batches until the socket is full."},
	{"send_one", (PyCFunction)(void (*)(void))send_one, METH_FASTCALL,
	 "send(2) one packet without blocking."},
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
