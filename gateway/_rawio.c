/* The few system-level steps of reading a body past the parser (gateway/rawbody.py), in C.
 * No Python-visible state; each call is one step.
 *
 * Why: rawbody.py set the socket's low-water mark through the event loop's socket object
 * (uvloop's PseudoSocket makes a new socket.socket for every setsockopt: a getsockname call and
 * two objects) three times per body and direction, and took each read buffer from numpy.empty
 * (an array, its descriptor and two memoryviews). On a 1 MiB JSON pass-through those were ~12 %
 * of the gateway's user time (perf, docs/performance.md).
 *
 * buffer(n) -> memoryview: a writable view of n uninitialised bytes (a bytearray made with
 *   PyByteArray_FromStringAndSize(NULL, n): CPython copies nothing into it, so its pages become
 *   memory only as reads write into them — as numpy.empty's did); from 64 KiB to 16 MiB, part
 *   of a pooled bytearray no one else holds any more (the pool, below).
 * release() -> int: the pool lets go of its free buffers; the bytes it let go.
 * pool_limit(n): the most bytes the pool holds, in use or free (128 MiB unless set).
 * pool_stats() -> (buffers, of them free, bytes).
 * lowat(fd, n) -> None: setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, n); OSError on failure.
 * unread(fd) -> int: bytes waiting in the socket's receive queue (ioctl FIONREAD); OSError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

/* The pool of large buffers (buffer(n) for n >= POOL_MIN). A bytearray the pool made is reused
 * once the pool's own reference is its only one (every view of it gone: a view holds a reference
 * to its bytearray) for a later buffer of about its size. Why: with the allocator tuned for large
 * tensors (gateway/malloc.py) a freed buffer goes back to the heap, where small allocations split
 * it before the next request's buffer of the same size is asked for, so the heap grows by a
 * buffer now and then instead of reusing one: HTTP binary -> gRPC at 1 MiB, 4 in flight, peaked
 * at ~2 x the live bytes (benchmarks/conversion, docs/performance.md). Bounded: buffers of at most
 * POOL_MAX bytes, POOL_SLOTS of them, pool_limit bytes in all; release() lets go of the free ones
 * (the idle trim, gateway/malloc.py). Only with the GIL held, as every call here is. */
#define POOL_MIN (64 * 1024)
#define POOL_ROUND (64 * 1024)
#define POOL_MAX (16 * 1024 * 1024)
#define POOL_SLOTS 256

static PyObject *pool[POOL_SLOTS];
static Py_ssize_t pool_count;
static Py_ssize_t pool_bytes;
static Py_ssize_t pool_limit = 128 * 1024 * 1024;

static int pool_free(PyObject *o) { return Py_REFCNT(o) == 1 && ((PyByteArrayObject *)o)->ob_exports == 0; }

static void pool_drop(Py_ssize_t i) {
    PyObject *o = pool[i];
    pool_bytes -= PyByteArray_GET_SIZE(o);
    pool[i] = pool[--pool_count];
    pool[pool_count] = NULL;
    Py_DECREF(o);
}

/* A free pooled bytearray of at least n bytes and at most twice that (the smallest), or NULL. */
static PyObject *pool_take(Py_ssize_t n) {
    Py_ssize_t best = -1, best_size = 0;
    for (Py_ssize_t i = 0; i < pool_count; i++) {
        Py_ssize_t size = PyByteArray_GET_SIZE(pool[i]);
        if (size >= n && size / 2 <= n && (best < 0 || size < best_size) && pool_free(pool[i])) {
            best = i;
            best_size = size;
        }
    }
    return best < 0 ? NULL : pool[best];
}

/* Room for `size` more pooled bytes, free buffers let go to make it; 0 if there is none. */
static int pool_room(Py_ssize_t size) {
    for (Py_ssize_t i = pool_count - 1; i >= 0 && (pool_count == POOL_SLOTS || pool_bytes + size > pool_limit); i--)
        if (pool_free(pool[i]))
            pool_drop(i);
    return pool_count < POOL_SLOTS && pool_bytes + size <= pool_limit;
}

static PyObject *view_of(PyObject *array, Py_ssize_t n) {
    PyObject *view = PyMemoryView_FromObject(array);
    if (view == NULL || PyByteArray_GET_SIZE(array) == n)
        return view;
    PyObject *part = PySequence_GetSlice(view, 0, n);
    Py_DECREF(view);
    return part;
}

static PyObject *buffer(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "buffer: at least 1 byte");
        return NULL;
    }
    if (n >= POOL_MIN && n <= POOL_MAX) {
        PyObject *array = pool_take(n);
        if (array != NULL)
            return view_of(array, n);
        Py_ssize_t size = (n + POOL_ROUND - 1) / POOL_ROUND * POOL_ROUND;
        if (pool_room(size)) {
            array = PyByteArray_FromStringAndSize(NULL, size);
            if (array == NULL)
                return NULL;
            pool[pool_count++] = array;
            pool_bytes += size;
            return view_of(array, n);
        }
    }
    PyObject *array = PyByteArray_FromStringAndSize(NULL, n);
    if (array == NULL)
        return NULL;
    PyObject *view = PyMemoryView_FromObject(array);
    Py_DECREF(array);
    return view;
}

static PyObject *release(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    Py_ssize_t before = pool_bytes;
    for (Py_ssize_t i = pool_count - 1; i >= 0; i--)
        if (pool_free(pool[i]))
            pool_drop(i);
    return PyLong_FromSsize_t(before - pool_bytes);
}

static PyObject *set_limit(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "pool_limit: at least 0 bytes");
        return NULL;
    }
    pool_limit = n;
    for (Py_ssize_t i = pool_count - 1; i >= 0 && pool_bytes > pool_limit; i--)
        if (pool_free(pool[i]))
            pool_drop(i);
    Py_RETURN_NONE;
}

static PyObject *pool_stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    Py_ssize_t idle = 0;
    for (Py_ssize_t i = 0; i < pool_count; i++)
        idle += pool_free(pool[i]);
    return Py_BuildValue("(nnn)", pool_count, idle, pool_bytes);
}

static int fd_of(PyObject *arg, int *fd) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "not a file descriptor");
        return -1;
    }
    *fd = (int)v;
    return 0;
}

static PyObject *lowat(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "lowat(fd, n)");
        return NULL;
    }
    int fd;
    if (fd_of(args[0], &fd) < 0)
        return NULL;
    long n = PyLong_AsLong(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "lowat: the mark is 1 to INT_MAX bytes");
        return NULL;
    }
    int value = (int)n;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &value, sizeof value) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *unread(PyObject *self, PyObject *arg) {
    (void)self;
    int fd;
    if (fd_of(arg, &fd) < 0)
        return NULL;
    int queued = 0;
    if (ioctl(fd, FIONREAD, &queued) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(queued);
}

static PyMethodDef methods[] = {
    {"buffer", buffer, METH_O, "A writable memoryview of n uninitialised bytes (a pooled buffer's when large)."},
    {"release", release, METH_NOARGS, "Let go of the pool's free buffers; the bytes let go."},
    {"pool_limit", set_limit, METH_O, "The most bytes the pool holds, in use or free."},
    {"pool_stats", pool_stats, METH_NOARGS, "(buffers, of them free, bytes) of the pool."},
    {"lowat", (PyCFunction)(void (*)(void))lowat, METH_FASTCALL, "Set a socket's SO_RCVLOWAT."},
    {"unread", unread, METH_O, "Bytes waiting in a socket's receive queue (FIONREAD)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rawio", "Reading a body past the parser: buffers and the socket's mark.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rawio(void) { return PyModule_Create(&module); }
