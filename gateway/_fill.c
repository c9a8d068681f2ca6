/* A bytes object filled as an answer's bytes arrive: the HTTP/1.1 client's whole-answer buffer
 * (backends/h1/framing.py, backends/h1/reader.py). No I/O.
 *
 * Why: an answer read whole was kept either as its pieces and joined at the end (the pieces and
 * the joined copy both held: twice the answer), or in a bytearray grown 4-fold (each growth a
 * copy, and bytearray(n) writes zeros over all n bytes, so it could not be sized by the
 * Content-Length up front: a backend announcing 256 MiB and sending 1 KiB would make the gateway
 * take 256 MiB of memory). Here the buffer is the answer's final bytes object, made once at the
 * announced size and left uninitialised — PyBytes_FromStringAndSize(NULL, n) is CPython's own way
 * to build a bytes object in C, "the contents are uninitialized" — so its pages become memory only
 * as bytes are written into them, and each piece is copied in once.
 *
 * The object is mutable only while the reader that made it holds it alone: it is handed on when
 * every byte is written (llhttp completes a message only after Content-Length bytes), and
 * dropped unread on any failure. Nothing hashes or shares it before.
 *
 * reserve(n) -> bytes: an uninitialised bytes object of n bytes (n > 1: CPython shares the empty
 *   and one-byte objects).
 * put(whole, at, data) -> int: data (any C-contiguous buffer) copied into whole at ``at``; the
 *   offset after it. ValueError when it would not fit.
 * window(whole, at) -> memoryview: whole's bytes from ``at`` on, writable, for the socket to be
 *   read into directly (the rest of a body of known length, read past the parser: rawbody.py).
 *   It holds no reference to whole: the reader keeps whole for as long as it keeps the view,
 *   and hands whole on only once every byte is written and the view dropped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *reserve(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 2) {
        PyErr_SetString(PyExc_ValueError, "reserve: at least 2 bytes");
        return NULL;
    }
    return PyBytes_FromStringAndSize(NULL, n);
}

static PyObject *put(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "put(whole, at, data)");
        return NULL;
    }
    PyObject *whole = args[0];
    if (!PyBytes_CheckExact(whole)) {
        PyErr_SetString(PyExc_TypeError, "put: whole must be bytes made by reserve()");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(whole);
    if (at < 0 || at > size || view.len > size - at) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "put: past the end of the reserved bytes");
        return NULL;
    }
    memcpy(PyBytes_AS_STRING(whole) + at, view.buf, (size_t)view.len);
    Py_ssize_t end = at + view.len;
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(end);
}

static PyObject *window(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "window(whole, at)");
        return NULL;
    }
    PyObject *whole = args[0];
    if (!PyBytes_CheckExact(whole)) {
        PyErr_SetString(PyExc_TypeError, "window: whole must be bytes made by reserve()");
        return NULL;
    }
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(whole);
    if (at < 0 || at >= size) {
        PyErr_SetString(PyExc_ValueError, "window: no reserved bytes left there");
        return NULL;
    }
    return PyMemoryView_FromMemory(PyBytes_AS_STRING(whole) + at, size - at, PyBUF_WRITE);
}

static PyMethodDef methods[] = {
    {"reserve", reserve, METH_O, "An uninitialised bytes object of n bytes, to be filled with put()."},
    {"put", (PyCFunction)(void (*)(void))put, METH_FASTCALL, "Copy data into whole at an offset; the offset after."},
    {"window", (PyCFunction)(void (*)(void))window, METH_FASTCALL, "whole's bytes from an offset on, writable."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fill", "A bytes object filled as an answer's bytes arrive.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fill(void) { return PyModule_Create(&module); }
