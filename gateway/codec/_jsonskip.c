/* The one loop of codec/jsonscan.py that sees every byte of a large JSON body: inside a tensor's
 * "data" array, the position of the next byte that may matter. No I/O, no Python objects kept.
 *
 * Why C: the scanner reads a streamed body's chunks as they arrive, which are views of the
 * listener's read buffers (rawbody.py). bytes.find needs a bytes object (a copy of every chunk:
 * callgrind counted ~1.3 M instructions of memcpy per 1.28 MB request), and one find per byte kind
 * (five passes over the chunk). Here one pass reads the buffer in place: 64 bytes a step with AVX2
 * where the CPU has it (chosen at run time), else 16 with SSE2 (every x86-64 CPU), else a plain
 * loop, which also takes the tail.
 *
 * special(buffer, start, end, in_string) -> int: the first index i in [start, end) whose byte is
 * a quote or a backslash (in_string) or a quote or a bracket [ ] { } (outside strings); end (at
 * most the buffer's length) when there is none, start when the range is empty. The buffer is
 * anything C-contiguous of bytes (bytes, bytearray, memoryview). The differential test is
 * tests/unit/test_jsonskip.py (against a plain reading in Python).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define JSONSKIP_AVX2 1
static int have_avx2;
#endif

/* '[' 0x5B and '{' 0x7B differ only in bit 0x20, as do ']' 0x5D and '}' 0x7D: with that bit
 * set, a bracket of either kind is one of two values, and no other byte becomes either. */
static inline int is_bracket(unsigned char c) {
    unsigned char f = (unsigned char)(c | 0x20);
    return f == '{' || f == '}';
}

#ifdef JSONSKIP_AVX2
/* The first hit of a 64-byte step whose two halves' matches are ``a`` and ``b`` (one is set). */
__attribute__((target("avx2"))) static inline Py_ssize_t first_hit(Py_ssize_t i, __m256i a, __m256i b) {
    unsigned ma = (unsigned)_mm256_movemask_epi8(a);
    if (ma)
        return i + __builtin_ctz(ma);
    return i + 32 + __builtin_ctz((unsigned)_mm256_movemask_epi8(b));
}

/* Where the 64-byte steps stopped: at a hit, or where fewer than 64 bytes are left. */
__attribute__((target("avx2"))) static Py_ssize_t in_string_avx2(const unsigned char *p, Py_ssize_t i,
                                                                Py_ssize_t end) {
    const __m256i quote = _mm256_set1_epi8('"');
    const __m256i backslash = _mm256_set1_epi8('\\');
    for (; i + 64 <= end; i += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(p + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(p + i + 32));
        __m256i ha = _mm256_or_si256(_mm256_cmpeq_epi8(a, quote), _mm256_cmpeq_epi8(a, backslash));
        __m256i hb = _mm256_or_si256(_mm256_cmpeq_epi8(b, quote), _mm256_cmpeq_epi8(b, backslash));
        __m256i any = _mm256_or_si256(ha, hb);
        if (!_mm256_testz_si256(any, any))
            return first_hit(i, ha, hb);
    }
    return i;
}

__attribute__((target("avx2"))) static Py_ssize_t outside_avx2(const unsigned char *p, Py_ssize_t i,
                                                              Py_ssize_t end) {
    const __m256i quote = _mm256_set1_epi8('"');
    const __m256i bit = _mm256_set1_epi8(0x20);
    const __m256i open = _mm256_set1_epi8('{');
    const __m256i close = _mm256_set1_epi8('}');
    for (; i + 64 <= end; i += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(p + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(p + i + 32));
        __m256i fa = _mm256_or_si256(a, bit), fb = _mm256_or_si256(b, bit);
        __m256i ha = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(fa, open), _mm256_cmpeq_epi8(fa, close)),
                                     _mm256_cmpeq_epi8(a, quote));
        __m256i hb = _mm256_or_si256(_mm256_or_si256(_mm256_cmpeq_epi8(fb, open), _mm256_cmpeq_epi8(fb, close)),
                                     _mm256_cmpeq_epi8(b, quote));
        __m256i any = _mm256_or_si256(ha, hb);
        if (!_mm256_testz_si256(any, any))
            return first_hit(i, ha, hb);
    }
    return i;
}
#endif

static Py_ssize_t special_in_string(const unsigned char *p, Py_ssize_t i, Py_ssize_t end) {
#ifdef JSONSKIP_AVX2
    if (have_avx2) {
        i = in_string_avx2(p, i, end);
        if (i + 64 <= end) /* (stopped at a hit) */
            return i;
    }
#endif
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i backslash = _mm_set1_epi8('\\');
    for (; i + 16 <= end; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        int m = _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
        if (m)
            return i + __builtin_ctz((unsigned)m);
    }
#endif
    for (; i < end; i++)
        if (p[i] == '"' || p[i] == '\\')
            return i;
    return end;
}

static Py_ssize_t special_outside(const unsigned char *p, Py_ssize_t i, Py_ssize_t end) {
#ifdef JSONSKIP_AVX2
    if (have_avx2) {
        i = outside_avx2(p, i, end);
        if (i + 64 <= end) /* (stopped at a hit) */
            return i;
    }
#endif
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i bit = _mm_set1_epi8(0x20);
    const __m128i open = _mm_set1_epi8('{');
    const __m128i close = _mm_set1_epi8('}');
    for (; i + 16 <= end; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        __m128i f = _mm_or_si128(v, bit);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(f, open), _mm_cmpeq_epi8(f, close)),
                                   _mm_cmpeq_epi8(v, quote));
        int m = _mm_movemask_epi8(hit);
        if (m)
            return i + __builtin_ctz((unsigned)m);
    }
#endif
    for (; i < end; i++)
        if (p[i] == '"' || is_bracket(p[i]))
            return i;
    return end;
}

static PyObject *special(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "special(buffer, start, end, in_string) takes 4 arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "special: start must not be negative");
        return NULL;
    }
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    int in_string = PyObject_IsTrue(args[3]);
    if (in_string < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (end > view.len)
        end = view.len;
    Py_ssize_t at = start < end ? end : start; /* (an empty range: nothing in it) */
    if (start < end) {
        const unsigned char *p = (const unsigned char *)view.buf;
        at = in_string ? special_in_string(p, start, end) : special_outside(p, start, end);
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(at);
}

static PyMethodDef methods[] = {
    {"special", (PyCFunction)(void (*)(void))special, METH_FASTCALL,
     "special(buffer, start, end, in_string) -> the index of the next byte that may matter "
     "inside a JSON data array (a quote or backslash in a string, else a quote or a bracket), "
     "or end."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsonskip", "The byte loop of codec/jsonscan.py's data skip.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jsonskip(void) {
#ifdef JSONSKIP_AVX2
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
#endif
    return PyModule_Create(&module);
}
