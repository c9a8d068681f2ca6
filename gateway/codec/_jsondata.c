/* A tensor's JSON "data" array → its raw little-endian bytes, read in place, for codec/jsonfast.py.
 * No I/O, no Python object per element.
 *
 * Why C: the plain reading (orjson.loads of the whole body, then numpy.asarray of the list) makes a
 * Python object per element — 1 MiB of FP32 as JSON (262,144 numbers) took 7.8 ms to parse, 5.5 ms
 * to convert and ~9 MB of objects; this reads the same text in ~2 ms into the tensor's bytes.
 *
 * It reads a subset, exactly as the plain reading does, and answers None for anything outside it,
 * so the caller reads that body the plain way (which also words every refusal): numbers for the
 * numeric datatypes, true/false for BOOL; integer tokens of at most 18 digits; an integer token for
 * an integer datatype only, in its range; nesting regular, no empty array, at most MAX_DEPTH deep.
 * The values are the plain reading's (numpy's, of orjson's numbers): an integer token is that
 * integer (for FP32 only when |v| <= 2^53, where numpy's int64 → float32 and the double → float32 of
 * a mixed array agree), so "-0" is +0.0; a fraction or exponent is the correctly rounded double —
 * Clinger's exact case (at most 2^53 and a power of ten up to 22, one IEEE operation), else strtod
 * (glibc rounds correctly; the gateway never sets LC_NUMERIC) — then rounded to FP32 by a cast,
 * as numpy's astype does. A token that overflows or underflows a double is left to the plain
 * reading. The differential test is tests/unit/test_jsondata_fast.py (hypothesis, against it).
 *
 * numbers(buffer, start, end, code, count) -> (bytearray, dims) | None: the array's contents are
 * buffer[start:end] (its brackets excluded); code: see CODE_*; count: the elements the shape has
 * (the result holds exactly that many, else None); dims: the nesting, a tuple.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 32
#define MAX_TOKEN 64 /* a float token longer than this goes to the plain reading */

enum {
    CODE_BOOL = 0, CODE_INT8, CODE_INT16, CODE_INT32, CODE_INT64,
    CODE_UINT8, CODE_UINT16, CODE_UINT32, CODE_UINT64, CODE_FP32, CODE_FP64, CODE_COUNT
};
static const int ITEMSIZE[CODE_COUNT] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 4, 8};
static const int64_t INT_MIN_OF[CODE_COUNT] = {0, INT8_MIN, INT16_MIN, INT32_MIN, INT64_MIN, 0, 0, 0, 0, 0, 0};
static const int64_t INT_MAX_OF[CODE_COUNT] = {0, INT8_MAX, INT16_MAX, INT32_MAX, INT64_MAX,
                                               UINT8_MAX, UINT16_MAX, UINT32_MAX, INT64_MAX, 0, 0};

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
#define TWO_53 9007199254740992ULL

static inline int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* One JSON number at p[*i] (RFC 8259 section 6), as an integer (*is_int) or a double. 0: not one
 * this reads (malformed, too long, beyond a double): the plain reading decides. */
static int read_number(const unsigned char *p, Py_ssize_t *i, Py_ssize_t end, int *is_int, int64_t *iv,
                       double *dv) {
    Py_ssize_t s = *i, k = s;
    int neg = 0;
    if (k < end && p[k] == '-') {
        neg = 1;
        k++;
    }
    if (k >= end || !is_digit(p[k]))
        return 0;
    uint64_t w = 0; /* the significant digits, while there are at most 19 */
    int digits = 0;   /* significant digits read (leading zeros are not) */
    int int_digits = 0;
    if (p[k] == '0') {
        k++;
        int_digits = 1;
    } else {
        while (k < end && is_digit(p[k])) {
            if (digits < 19)
                w = w * 10 + (uint64_t)(p[k] - '0');
            digits++;
            int_digits++;
            k++;
        }
    }
    int frac_digits = 0, has_frac = 0, has_exp = 0;
    if (k < end && p[k] == '.') {
        has_frac = 1;
        k++;
        if (k >= end || !is_digit(p[k]))
            return 0;
        while (k < end && is_digit(p[k])) {
            if (digits == 0 && p[k] == '0') {
                frac_digits++; /* a leading zero of the fraction: scale only */
            } else {
                if (digits < 19) /* (past 19 significant digits w is not exact: strtod below) */
                    w = w * 10 + (uint64_t)(p[k] - '0');
                digits++;
                frac_digits++;
            }
            k++;
        }
    }
    int exp = 0;
    if (k < end && (p[k] == 'e' || p[k] == 'E')) {
        has_exp = 1;
        k++;
        int eneg = 0;
        if (k < end && (p[k] == '+' || p[k] == '-')) {
            eneg = p[k] == '-';
            k++;
        }
        if (k >= end || !is_digit(p[k]))
            return 0;
        while (k < end && is_digit(p[k])) {
            if (exp < 10000)
                exp = exp * 10 + (p[k] - '0');
            k++;
        }
        if (eneg)
            exp = -exp;
    }
    *i = k;
    if (!has_frac && !has_exp) {
        if (int_digits > 18)
            return 0;
        *is_int = 1;
        *iv = neg ? -(int64_t)w : (int64_t)w;
        return 1;
    }
    *is_int = 0;
    int e10 = exp - frac_digits;
    if (digits <= 19 && w <= TWO_53 && e10 >= -22 && e10 <= 22) {
        double d = (double)w; /* exact */
        d = e10 < 0 ? d / POW10[-e10] : d * POW10[e10];
        *dv = neg ? -d : d;
        return 1;
    }
    /* The general case: glibc's strtod, correctly rounded, on a NUL-terminated copy. */
    Py_ssize_t n = k - s;
    if (n >= MAX_TOKEN)
        return 0;
    char token[MAX_TOKEN];
    memcpy(token, p + s, (size_t)n);
    token[n] = '\0';
    char *stop = NULL;
    errno = 0;
    double d = strtod(token, &stop);
    if (stop != token + n || errno == ERANGE || d - d != 0.0) /* (overflow, underflow, non-finite) */
        return 0;
    *dv = d;
    return 1;
}

/* Stores one value of a number token; 0 when the plain reading would refuse it or read it
 * differently. */
static inline int store(unsigned char *out, Py_ssize_t n, int code, int is_int, int64_t iv, double dv) {
    switch (code) {
    case CODE_FP32: {
        if (is_int) {
            if (iv > (int64_t)TWO_53 || iv < -(int64_t)TWO_53)
                return 0;
            dv = (double)iv;
        }
        float f = (float)dv;
        memcpy(out + n * 4, &f, 4);
        return 1;
    }
    case CODE_FP64: {
        if (is_int)
            dv = (double)iv; /* (numpy: int64 → float64, or Python's int → float: both round once) */
        memcpy(out + n * 8, &dv, 8);
        return 1;
    }
    case CODE_BOOL:
        return 0;
    default:
        break;
    }
    if (!is_int || iv < INT_MIN_OF[code] || iv > INT_MAX_OF[code])
        return 0;
    switch (ITEMSIZE[code]) {
    case 1: {
        uint8_t v = (uint8_t)iv;
        out[n] = v;
        break;
    }
    case 2: {
        uint16_t v = (uint16_t)iv;
        memcpy(out + n * 2, &v, 2);
        break;
    }
    case 4: {
        uint32_t v = (uint32_t)iv;
        memcpy(out + n * 4, &v, 4);
        break;
    }
    default: {
        uint64_t v = (uint64_t)iv;
        memcpy(out + n * 8, &v, 8);
        break;
    }
    }
    return 1;
}

/* The array's contents into out (count elements); fills dims[0..*ndim). 0: the plain reading decides. */
static int read_array(const unsigned char *p, Py_ssize_t i, Py_ssize_t end, int code, Py_ssize_t count,
                      unsigned char *out, Py_ssize_t *dims, int *ndim_out) {
    Py_ssize_t elements[MAX_DEPTH + 1];
    int depth = 1, ndim = -1;
    Py_ssize_t n = 0;
    for (int d = 0; d <= MAX_DEPTH; d++)
        dims[d] = -1;
    elements[1] = 0;
    int want_value = 1;
    for (;;) {
        while (i < end && is_ws(p[i]))
            i++;
        if (i >= end)
            break;
        unsigned char c = p[i];
        if (want_value) {
            if (c == '[') {
                if ((ndim != -1 && depth >= ndim) || depth >= MAX_DEPTH)
                    return 0;
                depth++;
                elements[depth] = 0;
                i++;
                continue;
            }
            if (ndim == -1)
                ndim = depth;
            else if (depth != ndim)
                return 0;
            if (n >= count)
                return 0;
            if (code == CODE_BOOL) {
                if (end - i >= 4 && memcmp(p + i, "true", 4) == 0) {
                    out[n] = 1;
                    i += 4;
                } else if (end - i >= 5 && memcmp(p + i, "false", 5) == 0) {
                    out[n] = 0;
                    i += 5;
                } else {
                    return 0;
                }
            } else {
                int is_int = 0;
                int64_t iv = 0;
                double dv = 0.0;
                if (!read_number(p, &i, end, &is_int, &iv, &dv) || !store(out, n, code, is_int, iv, dv))
                    return 0;
            }
            n++;
            elements[depth]++;
            want_value = 0;
            continue;
        }
        if (c == ',') {
            want_value = 1;
            i++;
            continue;
        }
        if (c == ']') {
            if (depth == 1) /* (the span excludes the outer bracket: this one closes nothing) */
                return 0;
            if (dims[depth - 1] == -1)
                dims[depth - 1] = elements[depth];
            else if (dims[depth - 1] != elements[depth])
                return 0; /* ragged */
            depth--;
            elements[depth]++;
            i++;
            continue;
        }
        return 0;
    }
    if (want_value || depth != 1 || n != count || ndim < 1)
        return 0; /* (empty, a trailing comma, unclosed, or a count the shape does not have) */
    dims[0] = elements[1];
    *ndim_out = ndim;
    return 1;
}

static PyObject *numbers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "numbers(buffer, start, end, code, count) takes 5 arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    long code = PyLong_AsLong(args[3]);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[4]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (code < 0 || code >= CODE_COUNT || count < 1 || start < 0 || end < start) {
        PyErr_SetString(PyExc_ValueError, "numbers: code, count or range out of bounds");
        return NULL;
    }
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    Py_RETURN_NONE; /* (the values are stored in the machine's order: little-endian only) */
#endif
    if (count > (end - start + 1) / 2 + 1)
        Py_RETURN_NONE; /* (each element takes at least one byte and a comma) */
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "numbers: end is past the buffer");
        return NULL;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, count * ITEMSIZE[code]);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t dims[MAX_DEPTH + 1];
    int ndim = 0;
    int ok = read_array((const unsigned char *)view.buf, start, end, (int)code, count,
                        (unsigned char *)PyByteArray_AS_STRING(out), dims, &ndim);
    PyBuffer_Release(&view);
    if (!ok) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    PyObject *shape = PyTuple_New(ndim);
    if (shape == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    for (int d = 0; d < ndim; d++) {
        PyObject *v = PyLong_FromSsize_t(dims[d]);
        if (v == NULL) {
            Py_DECREF(shape);
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, d, v);
    }
    PyObject *result = PyTuple_Pack(2, out, shape);
    Py_DECREF(out);
    Py_DECREF(shape);
    return result;
}

static PyMethodDef methods[] = {
    {"numbers", (PyCFunction)(void (*)(void))numbers, METH_FASTCALL,
     "numbers(buffer, start, end, code, count) -> (bytearray, dims) or None: a JSON data array's "
     "contents read into count values of the datatype code, or None where the plain reading decides."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsondata", "JSON data arrays read into tensor bytes in place.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jsondata(void) { return PyModule_Create(&module); }
