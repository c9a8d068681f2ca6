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
 *   memory only as reads write into them — as numpy.empty's did).
 * lowat(fd, n) -> None: setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, n); OSError on failure.
 * unread(fd) -> int: bytes waiting in the socket's receive queue (ioctl FIONREAD); OSError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

static PyObject *buffer(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "buffer: at least 1 byte");
        return NULL;
    }
    PyObject *array = PyByteArray_FromStringAndSize(NULL, n);
    if (array == NULL)
        return NULL;
    PyObject *view = PyMemoryView_FromObject(array);
    Py_DECREF(array);
    return view;
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
    {"buffer", buffer, METH_O, "A writable memoryview of n uninitialised bytes."},
    {"lowat", (PyCFunction)(void (*)(void))lowat, METH_FASTCALL, "Set a socket's SO_RCVLOWAT."},
    {"unread", unread, METH_O, "Bytes waiting in a socket's receive queue (FIONREAD)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rawio", "Reading a body past the parser: buffers and the socket's mark.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rawio(void) { return PyModule_Create(&module); }
