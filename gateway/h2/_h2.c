/* gateway.h2._h2: one libnghttp2 session per TCP connection, driven from memory buffers.
 *
 * Python hands received bytes to feed() and writes what flush() returns; it never sees a frame.
 * The nghttp2 callbacks are C and only build Python objects (bytes, tuples, lists): no Python
 * code runs inside the library (docs/h2-design.md, sections 0 and 2). Every limit of section 3
 * is enforced here, before any Python object is built for what it limits. The API is documented
 * in _h2.pyi next to this file.
 *
 * Build-time features (setup.py probes the installed library, since Debian's 1.52 carries
 * backports that NGHTTP2_VERSION_NUM does not show):
 *   H2_HAVE_SSIZE2              the nghttp2_ssize API of 1.60+ (the ssize_t one is deprecated there)
 *   H2_HAVE_MAX_CONTINUATIONS   nghttp2_option_set_max_continuations (1.61, CVE-2024-28182)
 *   H2_HAVE_STREAM_RESET_LIMIT  nghttp2_option_set_stream_reset_rate_limit (1.57, CVE-2023-44487)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <nghttp2/nghttp2.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------------------------ */
/* The ssize_t / nghttp2_ssize split: 1.60 added the *2 functions and deprecated the others.  */

#ifdef H2_HAVE_SSIZE2
typedef nghttp2_ssize h2_ssize;
typedef nghttp2_data_provider2 h2_data_provider;
#define h2_mem_recv nghttp2_session_mem_recv2
#define h2_mem_send nghttp2_session_mem_send2
#define h2_submit_request nghttp2_submit_request2
#define h2_submit_response nghttp2_submit_response2
#else
typedef ssize_t h2_ssize;
typedef nghttp2_data_provider h2_data_provider;
#define h2_mem_recv nghttp2_session_mem_recv
#define h2_mem_send nghttp2_session_mem_send
#define h2_submit_request nghttp2_submit_request
#define h2_submit_response nghttp2_submit_response
#endif

/* ------------------------------------------------------------------------------------------ */
/* Event kinds (module constants) and the names of the flood buckets.                         */

enum {
  EV_HEAD = 1,
  EV_DATA = 2,
  EV_TRAILERS = 3,
  EV_CLOSE = 4,
  EV_WRITABLE = 5,
  EV_GOAWAY = 6,
  EV_DEAD = 7,
  EV_PING_ACK = 8,
  EV_SETTINGS = 9,
};

enum {
  B_PING,
  B_SETTINGS,
  B_WINDOW_UPDATE,
  B_PRIORITY,
  B_EMPTY_DATA,
  B_RST_STREAM,
  B_GLITCH,
  NBUCKETS
};

static const char *const bucket_names[NBUCKETS] = {
    "ping", "settings", "window_update", "priority", "empty_data", "rst_stream", "glitch",
};

/* DATA payloads at least this long go out zero-copy (a memoryview of the app's buffer); shorter
 * ones are copied into the frame, which is cheaper than one more object and iovec entry. */
#define ZC_MIN 4096

#define NS_PER_S 1000000000LL

/* NGHTTP2_ERR_TOO_MANY_CONTINUATIONS (nghttp2 1.61, backported by Debian). An enum, so it cannot
 * be tested with #ifdef; the value is part of the ABI, and a build against an older header may
 * still run on a library that returns it. */
#define H2_ERR_TOO_MANY_CONTINUATIONS (-905)

/* ------------------------------------------------------------------------------------------ */
/* Limits: keyword ints copied into C once, at construction.                                  */

typedef struct {
  uint32_t burst; /* 0: the bucket is off */
  uint32_t rate;  /* tokens added per second */
} bucket_limit_t;

typedef struct {
  uint32_t max_concurrent_streams;
  uint32_t initial_window_size;
  uint32_t connection_window_size;
  uint32_t max_header_list_size;
  uint32_t max_header_fields;
  uint32_t max_frame_size;
  uint32_t header_table_size;
  uint32_t max_continuations;
  uint64_t max_stream_data; /* 0: no limit */
  uint64_t write_low_water;
  bucket_limit_t bucket[NBUCKETS];
} limits_t;

typedef struct {
  const char *name;
  long long dflt;
  long long lo;
  long long hi;
} limit_spec_t;

/* Order matches the fields filled in limits_parse(); LIMITS_SIGNATURE repeats the defaults. */
static const limit_spec_t limit_specs[] = {
    {"max_concurrent_streams", 100, 1, 0x7fffffff},
    {"initial_window_size", 1 << 20, 0, 0x7fffffff},
    {"connection_window_size", 8 << 20, 65535, 0x7fffffff},
    {"max_header_list_size", 16384, 1, 1 << 30},
    {"max_header_fields", 100, 1, 65535},
    {"max_frame_size", 16384, 16384, 16777215},
    {"header_table_size", 4096, 0, 1 << 24},
    {"max_continuations", 8, 0, 1000},
    {"max_stream_data", 64LL << 20, 0, 1LL << 62},
    {"write_low_water", 65536, 0, 1LL << 62},
    {"ping_burst", 1000, 0, 0xffffffffLL},
    {"ping_rate", 100, 0, 0xffffffffLL},
    {"settings_burst", 100, 0, 0xffffffffLL},
    {"settings_rate", 10, 0, 0xffffffffLL},
    {"window_update_burst", 10000, 0, 0xffffffffLL},
    {"window_update_rate", 1000, 0, 0xffffffffLL},
    {"priority_burst", 1000, 0, 0xffffffffLL},
    {"priority_rate", 100, 0, 0xffffffffLL},
    {"empty_data_burst", 100, 0, 0xffffffffLL},
    {"empty_data_rate", 10, 0, 0xffffffffLL},
    /* nghttp2's own defaults for the received-RST bucket (CVE-2023-44487) */
    {"rst_stream_burst", 1000, 0, 0xffffffffLL},
    {"rst_stream_rate", 33, 0, 0xffffffffLL},
    {"glitch_burst", 1000, 0, 0xffffffffLL},
    {"glitch_rate", 33, 0, 0xffffffffLL},
};
#define NLIMITS ((int)(sizeof(limit_specs) / sizeof(limit_specs[0])))
#define LIMIT_FIRST_BUCKET 10

/* ------------------------------------------------------------------------------------------ */
/* Token buckets, in nano-tokens so that refill needs no floating point.                       */

typedef struct {
  int64_t tokens; /* nano-tokens */
  int64_t last_ns;
  uint64_t count; /* frames or events charged, for counters() */
} bucket_t;

static void bucket_init(bucket_t *b, const bucket_limit_t *lim, int64_t now) {
  b->tokens = (int64_t)lim->burst * NS_PER_S;
  b->last_ns = now;
  b->count = 0;
}

/* Returns -1 when the bucket is empty (the peer went over its budget). */
static int bucket_take(bucket_t *b, const bucket_limit_t *lim, int64_t now) {
  int64_t cap;
  b->count++;
  if (lim->burst == 0) return 0;
  cap = (int64_t)lim->burst * NS_PER_S;
  if (now > b->last_ns) {
    int64_t elapsed = now - b->last_ns;
    if (lim->rate) {
      /* compare before multiplying: elapsed * rate may not fit in 64 bits */
      if (elapsed >= cap / (int64_t)lim->rate + 1)
        b->tokens = cap;
      else {
        b->tokens += elapsed * (int64_t)lim->rate;
        if (b->tokens > cap) b->tokens = cap;
      }
    }
    b->last_ns = now;
  }
  if (b->tokens < NS_PER_S) return -1;
  b->tokens -= NS_PER_S;
  return 0;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------------ */
/* Per-stream state.                                                                           */

/* One buffer the app handed to send_data()/respond()/request(). */
typedef struct {
  PyObject *obj;  /* a bytes object, or a 1-D byte memoryview that pins the app's exporter */
  PyObject *mv;   /* memoryview over obj for zero-copy slices; made on first use for bytes */
  const char *ptr;
  Py_ssize_t len;
  Py_ssize_t off; /* bytes of it already sent */
} seg_t;

/* One DATA chunk of the feed() under way, where it lies in the input (nghttp2 hands DATA over
 * in place); `next`: the stream's next chunk (1-based, 0: none). */
typedef struct {
  const uint8_t *p;
  size_t len;
  uint32_t next;
} inseg_t;

typedef struct stream_s {
  int32_t id;
  unsigned announced : 1;       /* the app knows this sid (HEAD emitted, or request() made it) */
  unsigned head_done : 1;       /* the peer's head was received: another block is trailers */
  unsigned recv_end : 1;        /* the peer ended its side */
  unsigned fin_sent : 1;        /* our END_STREAM went out */
  unsigned hdr_sent : 1;        /* our head is submitted */
  unsigned out_end : 1;         /* the app said our side ends once the queue drains */
  unsigned has_provider : 1;    /* a data provider is attached */
  unsigned deferred : 1;        /* the provider returned NGHTTP2_ERR_DEFERRED */
  unsigned rst_sent : 1;        /* a RST_STREAM is queued or sent: never another (nghttp2 1.66 fix) */
  unsigned app_reset : 1;       /* that RST_STREAM came from reset() */
  unsigned close_reported : 1;  /* a CLOSE event was emitted already */
  unsigned want_writable : 1;   /* the queue went over the low-water mark */
  uint64_t recv_total;          /* DATA payload received, for max_stream_data */
  uint64_t unconsumed;          /* delivered or pending bytes the app has not consume()d */
  /* DATA received in the current feed(), coalesced into one bytes object: noted where it lies
   * in the input (Conn.inseg, 1-based, 0: none) and copied once, into an object of its exact
   * size, when the stream's event is emitted (pend_gather); `pend` holds it instead when a chunk
   * did not lie in the input */
  PyObject *pend;
  Py_ssize_t pend_len;
  uint32_t in_head, in_tail;
  struct stream_s *pend_prev, *pend_next;
  int on_pend;
  /* outgoing queue */
  seg_t *segs;
  int seg_head, seg_count, seg_cap; /* live segments are segs[seg_head .. seg_head+seg_count) */
  uint64_t queued;                  /* bytes queued and not yet sent */
  PyObject *trailers;               /* tuple of (name, value), sent when the queue drains */
} stream_t;

/* Streams by id: open addressing with linear probing and backward-shift deletion. */
typedef struct {
  stream_t **slots;
  uint32_t cap; /* a power of two */
  uint32_t count;
} smap_t;

static inline uint32_t smap_home(int32_t id, uint32_t mask) {
  uint32_t x = (uint32_t)id;
  x ^= x >> 16;
  x *= 0x45d9f3bu;
  x ^= x >> 16;
  return x & mask;
}

static stream_t *smap_get(const smap_t *m, int32_t id) {
  uint32_t mask, i;
  if (m->cap == 0) return NULL;
  mask = m->cap - 1;
  for (i = smap_home(id, mask); m->slots[i]; i = (i + 1) & mask)
    if (m->slots[i]->id == id) return m->slots[i];
  return NULL;
}

static int smap_grow(smap_t *m) {
  uint32_t ncap = m->cap ? m->cap * 2 : 16, i, j;
  stream_t **ns = PyMem_Calloc(ncap, sizeof(stream_t *));
  if (!ns) return -1;
  for (i = 0; i < m->cap; i++) {
    if (!m->slots[i]) continue;
    for (j = smap_home(m->slots[i]->id, ncap - 1); ns[j]; j = (j + 1) & (ncap - 1)) {
    }
    ns[j] = m->slots[i];
  }
  PyMem_Free(m->slots);
  m->slots = ns;
  m->cap = ncap;
  return 0;
}

/* The id must not be present. */
static int smap_put(smap_t *m, stream_t *st) {
  uint32_t mask, i;
  if ((m->count + 1) * 2 > m->cap && smap_grow(m) < 0) return -1;
  mask = m->cap - 1;
  for (i = smap_home(st->id, mask); m->slots[i]; i = (i + 1) & mask) {
  }
  m->slots[i] = st;
  m->count++;
  return 0;
}

static void smap_del(smap_t *m, int32_t id) {
  uint32_t mask, i, j, k;
  if (m->cap == 0) return;
  mask = m->cap - 1;
  for (i = smap_home(id, mask); m->slots[i]; i = (i + 1) & mask)
    if (m->slots[i]->id == id) break;
  if (!m->slots[i]) return;
  m->slots[i] = NULL;
  m->count--;
  /* Move back every later entry of the run whose home is not cyclically in (i, j]. */
  for (j = (i + 1) & mask; m->slots[j]; j = (j + 1) & mask) {
    int stays;
    k = smap_home(m->slots[j]->id, mask);
    stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      m->slots[i] = m->slots[j];
      m->slots[j] = NULL;
      i = j;
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* The connection object.                                                                      */

typedef struct {
  uint32_t name_off, name_len, value_off, value_len;
} hfield_t;

enum { HB_NONE, HB_HEAD, HB_TRAILERS };

typedef struct {
  PyObject_HEAD
  nghttp2_session *session;
  int server;
  limits_t lim;
  bucket_t buckets[NBUCKETS];
  int64_t now;
  smap_t streams;
  PyObject *events;    /* events not yet returned (list), or NULL */
  stream_t *pend_head; /* streams holding coalesced DATA of the current feed() */
  /* The header block being received: one at a time per connection, since CONTINUATION frames
   * must follow their HEADERS with nothing in between (RFC 9113 section 6.10). Fields are
   * copied here and become Python objects only once the whole block passed the limits. */
  int32_t hb_sid;
  int hb_kind;
  int hb_rejected;
  uint64_t hb_size;
  uint32_t hb_count;
  uint32_t hb_cont;
  int cont_flood;
  char *hb_buf;
  size_t hb_len, hb_cap;
  hfield_t *hb_fields;
  uint32_t hb_fcap;
  /* output of the running flush() */
  char *obuf;
  size_t olen, ocap;
  PyObject *out;
  size_t out_bytes;
  size_t out_limit;
  /* state */
  int busy;             /* inside nghttp2: refuse reentrant calls (a finalizer run by GC) */
  int pyerr;            /* a Python exception is set; the callbacks stop */
  int fatal;            /* mem_recv/mem_send failed: the session cannot go on */
  int calm_pending;     /* 1 + bucket index tripped during mem_send */
  const char *dead;     /* the bucket that tripped, or NULL */
  uint64_t pending_consume; /* connection window to return after the library call */
  const uint8_t *in_start, *in_end; /* the input of the feed() under way (NULL outside one) */
  inseg_t *inseg;                   /* DATA chunks of this feed, where they lie in its input */
  uint32_t inseg_n, inseg_cap;
  uint64_t header_resets;
  uint64_t data_resets;
} Conn;

static PyObject *H2Error;
static nghttp2_session_callbacks *g_callbacks;
static PyTypeObject ConnType, ServerType, ClientType;

/* Names and values seen on nearly every gRPC message are shared objects, not new bytes each. */
static const char *const common_strings[] = {
    ":method", ":scheme", ":authority", ":path", ":status", "content-type", "te", "user-agent",
    "grpc-encoding", "grpc-accept-encoding", "grpc-timeout", "grpc-status", "grpc-message",
    "content-length", "accept-encoding", "POST", "http", "https", "application/grpc", "trailers",
    "200", "0", "identity",
};
#define NCOMMON ((int)(sizeof(common_strings) / sizeof(common_strings[0])))
static PyObject *common_bytes[NCOMMON];
/* common_by_len[n]: indexes of the common strings n bytes long, -1 terminated */
#define COMMON_MAXLEN 24
#define COMMON_PER_LEN 8
static signed char common_by_len[COMMON_MAXLEN + 1][COMMON_PER_LEN + 1];

static int common_init(void) {
  int i, n;
  memset(common_by_len, -1, sizeof(common_by_len));
  for (i = 0; i < NCOMMON; i++) {
    size_t len = strlen(common_strings[i]);
    if (len > COMMON_MAXLEN) continue;
    for (n = 0; common_by_len[len][n] >= 0; n++) {
    }
    if (n < COMMON_PER_LEN) common_by_len[len][n] = (signed char)i;
    common_bytes[i] = PyBytes_FromStringAndSize(common_strings[i], (Py_ssize_t)len);
    if (!common_bytes[i]) return -1;
  }
  return 0;
}

static PyObject *bytes_of(const char *p, size_t n) {
  const signed char *idx;
  if (n <= COMMON_MAXLEN) {
    for (idx = common_by_len[n]; *idx >= 0; idx++) {
      if (memcmp(common_strings[*idx], p, n) == 0) return Py_NewRef(common_bytes[*idx]);
    }
  }
  return PyBytes_FromStringAndSize(p, (Py_ssize_t)n);
}

/* ------------------------------------------------------------------------------------------ */
/* Errors.                                                                                     */

static void h2_raise(int code, const char *fmt, ...) {
  va_list va;
  PyObject *msg, *exc, *pcode;
  va_start(va, fmt);
  msg = PyUnicode_FromFormatV(fmt, va);
  va_end(va);
  if (!msg) return;
  exc = PyObject_CallOneArg(H2Error, msg);
  Py_DECREF(msg);
  if (!exc) return;
  pcode = PyLong_FromLong(code);
  if (!pcode || PyObject_SetAttrString(exc, "code", pcode) < 0) {
    Py_XDECREF(pcode);
    Py_DECREF(exc);
    return;
  }
  Py_DECREF(pcode);
  PyErr_SetObject(H2Error, exc);
  Py_DECREF(exc);
}

/* ------------------------------------------------------------------------------------------ */
/* Events.                                                                                     */

/* Appends ev (a new reference, or NULL after a failed build) to the pending events. */
static int ev_push(Conn *c, PyObject *ev) {
  if (!ev) goto fail;
  if (!c->events) {
    c->events = PyList_New(0);
    if (!c->events) {
      Py_DECREF(ev);
      goto fail;
    }
  }
  if (PyList_Append(c->events, ev) < 0) {
    Py_DECREF(ev);
    goto fail;
  }
  Py_DECREF(ev);
  return 0;
fail:
  c->pyerr = 1;
  return -1;
}

/* (kind, a, b[, c]) with a, b, c new references (NULL: a failed build, cleaned up here). */
static PyObject *tuple_of(int n, PyObject *a, PyObject *b, PyObject *d, PyObject *e) {
  PyObject *items[4] = {a, b, d, e};
  PyObject *t = NULL;
  int i;
  for (i = 0; i < n; i++)
    if (!items[i]) goto fail;
  t = PyTuple_New(n);
  if (!t) goto fail;
  for (i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, items[i]);
  return t;
fail:
  for (i = 0; i < n; i++) Py_XDECREF(items[i]);
  return NULL;
}

static PyObject *pybool(int v) { return Py_NewRef(v ? Py_True : Py_False); }

static int ev_close(Conn *c, stream_t *st, uint32_t code) {
  st->close_reported = 1;
  return ev_push(c, tuple_of(3, PyLong_FromLong(EV_CLOSE), PyLong_FromLong(st->id),
                             PyLong_FromUnsignedLong(code), NULL));
}

/* ------------------------------------------------------------------------------------------ */
/* Streams: creation, outgoing queue, teardown.                                                */

static stream_t *stream_new(Conn *c, int32_t id) {
  stream_t *st = PyMem_Calloc(1, sizeof(stream_t));
  if (!st) {
    PyErr_NoMemory();
    return NULL;
  }
  st->id = id;
  if (smap_put(&c->streams, st) < 0) {
    PyMem_Free(st);
    PyErr_NoMemory();
    return NULL;
  }
  return st;
}

static void seg_release(seg_t *s) {
  Py_CLEAR(s->mv);
  Py_CLEAR(s->obj);
}

static void queue_clear(stream_t *st) {
  int i;
  for (i = 0; i < st->seg_count; i++) seg_release(&st->segs[st->seg_head + i]);
  st->seg_head = st->seg_count = 0;
  st->queued = 0;
}

/* Takes a new reference to obj. */
static int queue_push(stream_t *st, PyObject *obj, PyObject *mv, const char *ptr, Py_ssize_t len) {
  seg_t *s;
  if (st->seg_head + st->seg_count == st->seg_cap) {
    if (st->seg_head > 0) {
      memmove(st->segs, st->segs + st->seg_head, (size_t)st->seg_count * sizeof(seg_t));
      st->seg_head = 0;
    } else {
      int ncap = st->seg_cap ? st->seg_cap * 2 : 4;
      seg_t *ns = PyMem_Realloc(st->segs, (size_t)ncap * sizeof(seg_t));
      if (!ns) {
        PyErr_NoMemory();
        return -1;
      }
      st->segs = ns;
      st->seg_cap = ncap;
    }
  }
  s = &st->segs[st->seg_head + st->seg_count++];
  s->obj = obj;
  s->mv = mv;
  s->ptr = ptr;
  s->len = len;
  s->off = 0;
  st->queued += (uint64_t)len;
  return 0;
}

static void queue_pop(stream_t *st) {
  seg_release(&st->segs[st->seg_head]);
  st->seg_head++;
  if (--st->seg_count == 0) st->seg_head = 0;
}

static void pend_unlink(Conn *c, stream_t *st) {
  if (!st->on_pend) return;
  if (st->pend_prev)
    st->pend_prev->pend_next = st->pend_next;
  else
    c->pend_head = st->pend_next;
  if (st->pend_next) st->pend_next->pend_prev = st->pend_prev;
  st->pend_prev = st->pend_next = NULL;
  st->on_pend = 0;
}

/* Drops coalesced DATA nobody will see; its flow-control credit goes back to the peer. */
static void pend_discard(Conn *c, stream_t *st) {
  pend_unlink(c, st);
  if (st->pend || st->in_head) {
    c->pending_consume += (uint64_t)st->pend_len;
    st->unconsumed -= (uint64_t)st->pend_len;
    Py_CLEAR(st->pend);
    st->in_head = st->in_tail = 0;
    st->pend_len = 0;
  }
}

static void stream_free(Conn *c, stream_t *st) {
  pend_discard(c, st);
  /* Bytes delivered and never consumed would shrink the connection window for good. */
  c->pending_consume += st->unconsumed;
  smap_del(&c->streams, st->id);
  queue_clear(st);
  PyMem_Free(st->segs);
  Py_CLEAR(st->trailers);
  PyMem_Free(st);
}

/* ------------------------------------------------------------------------------------------ */
/* Headers from Python: a sequence of (bytes, bytes) tuples, checked and turned into nghttp2_nv. */

#define NV_STACK 32

typedef struct {
  nghttp2_nv stack[NV_STACK];
  nghttp2_nv *nva;
  size_t n;
} nvbuf_t;

static void nv_free(nvbuf_t *b) {
  if (b->nva && b->nva != b->stack) PyMem_Free(b->nva);
  b->nva = NULL;
}

/* Fills b from headers (a tuple or list of (name, value) bytes tuples). nghttp2 copies the
 * fields at submit time, so the pointers only need to outlive the submit call. With check=0 the
 * fields were validated before (stored trailers): no Python exception can be raised then. */
static int nv_build(PyObject *headers, nvbuf_t *b, int check) {
  PyObject *const *items;
  Py_ssize_t n, i;
  b->nva = b->stack;
  b->n = 0;
  if (PyTuple_Check(headers)) {
    items = &PyTuple_GET_ITEM(headers, 0);
    n = PyTuple_GET_SIZE(headers);
  } else if (PyList_Check(headers)) {
    items = PySequence_Fast_ITEMS(headers);
    n = PyList_GET_SIZE(headers);
  } else {
    PyErr_SetString(PyExc_TypeError, "headers must be a list or tuple of (bytes, bytes)");
    return -1;
  }
  if (n > NV_STACK) {
    b->nva = PyMem_Malloc((size_t)n * sizeof(nghttp2_nv));
    if (!b->nva) {
      PyErr_NoMemory();
      return -1;
    }
  }
  for (i = 0; i < n; i++) {
    PyObject *t = items[i], *k, *v;
    nghttp2_nv *nv = &b->nva[i];
    if (check) {
      if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(t, 0)) ||
          !PyBytes_Check(PyTuple_GET_ITEM(t, 1))) {
        PyErr_SetString(PyExc_TypeError, "each header must be a (bytes, bytes) tuple");
        goto fail;
      }
    }
    k = PyTuple_GET_ITEM(t, 0);
    v = PyTuple_GET_ITEM(t, 1);
    nv->name = (uint8_t *)PyBytes_AS_STRING(k);
    nv->namelen = (size_t)PyBytes_GET_SIZE(k);
    nv->value = (uint8_t *)PyBytes_AS_STRING(v);
    nv->valuelen = (size_t)PyBytes_GET_SIZE(v);
    nv->flags = NGHTTP2_NV_FLAG_NONE;
    if (check) {
      /* nghttp2 does not validate what it sends (nghttp2.h, nghttp2_submit_request): a field a
       * peer would reject, or one carrying CR/LF towards an HTTP/1 hop, stops here. Names are
       * lowercase tokens (RFC 9113 section 8.2.1), pseudo-headers after their ':'. */
      const uint8_t *name = nv->name;
      size_t namelen = nv->namelen;
      if (namelen > 1 && name[0] == ':') {
        name++;
        namelen--;
      }
      if (namelen == 0 || !nghttp2_check_header_name(name, namelen)) {
        PyErr_Format(PyExc_ValueError, "invalid header name %R", k);
        goto fail;
      }
      if (!nghttp2_check_header_value_rfc9113(nv->value, nv->valuelen)) {
        PyErr_Format(PyExc_ValueError, "invalid value for header %R", k);
        goto fail;
      }
    }
  }
  b->n = (size_t)n;
  return 0;
fail:
  nv_free(b);
  return -1;
}

/* Validated headers to send later (trailers): a tuple as it is, a list copied (the app may
 * change it; its items are tuples of bytes, which cannot change). */
static PyObject *headers_snapshot(PyObject *headers) {
  nvbuf_t b;
  if (nv_build(headers, &b, 1) < 0) return NULL;
  nv_free(&b);
  if (PyTuple_CheckExact(headers)) return Py_NewRef(headers);
  return PySequence_Tuple(headers);
}

/* ------------------------------------------------------------------------------------------ */
/* Receive callbacks.                                                                          */

/* A bucket ran dry: GOAWAY(ENHANCE_YOUR_CALM) and stop reading (nghttp2 ignores the rest of the
 * input once the session is terminating). Inside mem_send it is only noted and done after. */
static int trip(Conn *c, int b, int in_send) {
  int rv;
  if (c->dead) return 0;
  if (in_send) {
    if (!c->calm_pending) c->calm_pending = b + 1;
    return 0;
  }
  c->dead = bucket_names[b];
  rv = nghttp2_session_terminate_session(c->session, NGHTTP2_ENHANCE_YOUR_CALM);
  if (nghttp2_is_fatal(rv)) return NGHTTP2_ERR_CALLBACK_FAILURE;
  if (ev_push(c, tuple_of(2, PyLong_FromLong(EV_DEAD), PyUnicode_FromString(c->dead), NULL, NULL)) < 0)
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  return 0;
}

static int charge(Conn *c, int b, int in_send) {
  /* one clock read per feed()/flush() at most, and none for the frames no bucket counts */
  if (c->now == 0) c->now = now_ns();
  if (bucket_take(&c->buckets[b], &c->lim.bucket[b], c->now) < 0) return trip(c, b, in_send);
  return 0;
}

/* Called for every frame header nghttp2 accepts for processing (unknown frame types and DATA for
 * closed streams are skipped by the library before this): the flood counters of section 3. */
static int cb_begin_frame(nghttp2_session *session, const nghttp2_frame_hd *hd, void *ud) {
  Conn *c = ud;
  (void)session;
  if (c->pyerr) return NGHTTP2_ERR_CALLBACK_FAILURE;
  switch (hd->type) {
  case NGHTTP2_DATA:
    /* Empty DATA without END_STREAM does nothing but cost us (padded ones: cb_frame_recv). */
    if (hd->length == 0 && !(hd->flags & NGHTTP2_FLAG_END_STREAM)) return charge(c, B_EMPTY_DATA, 0);
    return 0;
  case NGHTTP2_HEADERS:
    c->hb_cont = 0;
    return 0;
  case NGHTTP2_CONTINUATION:
#ifndef H2_HAVE_MAX_CONTINUATIONS
    /* Without the library's limit (CVE-2024-28182) count them here; fatal like the library's. */
    if (++c->hb_cont > c->lim.max_continuations) {
      c->cont_flood = 1;
      return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
#endif
    return 0;
  case NGHTTP2_PRIORITY:
    return charge(c, B_PRIORITY, 0);
  case NGHTTP2_RST_STREAM:
    return charge(c, B_RST_STREAM, 0);
  case NGHTTP2_SETTINGS:
    return charge(c, B_SETTINGS, 0);
  case NGHTTP2_PING:
    return charge(c, B_PING, 0);
  case NGHTTP2_WINDOW_UPDATE:
    if (hd->stream_id == 0) return charge(c, B_WINDOW_UPDATE, 0);
    return 0;
  default:
    return 0;
  }
}

static int cb_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *ud) {
  Conn *c = ud;
  stream_t *st;
  (void)session;
  if (c->pyerr) return NGHTTP2_ERR_CALLBACK_FAILURE;
  c->hb_kind = HB_NONE;
  c->hb_rejected = 0;
  c->hb_size = 0;
  c->hb_count = 0;
  c->hb_len = 0;
  /* PUSH_PROMISE never gets here: the client sends ENABLE_PUSH=0 and nghttp2 refuses pushes. */
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  c->hb_sid = frame->hd.stream_id;
  st = smap_get(&c->streams, frame->hd.stream_id);
  switch (frame->headers.cat) {
  case NGHTTP2_HCAT_REQUEST:
    if (!st) {
      st = stream_new(c, frame->hd.stream_id);
      if (!st) {
        c->pyerr = 1;
        return NGHTTP2_ERR_CALLBACK_FAILURE;
      }
    }
    c->hb_kind = HB_HEAD;
    break;
  case NGHTTP2_HCAT_RESPONSE:
  case NGHTTP2_HCAT_HEADERS:
    if (st && !st->rst_sent) c->hb_kind = st->head_done ? HB_TRAILERS : HB_HEAD;
    break;
  default:
    break;
  }
  return 0;
}

static int pend_flush(Conn *c, stream_t *st, int end);
static int pend_gather(Conn *c, stream_t *st, Py_ssize_t cap);

/* A limit reset of a stream the app may know: RST_STREAM, CLOSE now, nothing more delivered.
 * DATA already received in this feed goes out first, as it would have had the input been split
 * before the offending frame. */
static int limit_reset(Conn *c, stream_t *st, uint32_t code, int submit) {
  if (pend_flush(c, st, 0) < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
  queue_clear(st);
  st->rst_sent = 1;
  if (submit) {
    int rv = nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, st->id, code);
    if (nghttp2_is_fatal(rv)) return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  if (st->announced && !st->close_reported && ev_close(c, st, code) < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
  return 0;
}

static int hb_append(Conn *c, const uint8_t *name, size_t namelen, const uint8_t *value, size_t valuelen) {
  hfield_t *f;
  size_t need = c->hb_len + namelen + valuelen;
  if (need > c->hb_cap) {
    size_t ncap = c->hb_cap ? c->hb_cap : 1024;
    char *nb;
    while (ncap < need) ncap *= 2;
    nb = PyMem_Realloc(c->hb_buf, ncap);
    if (!nb) return -1;
    c->hb_buf = nb;
    c->hb_cap = ncap;
  }
  if (c->hb_count > c->hb_fcap) {
    uint32_t ncap = c->hb_fcap ? c->hb_fcap * 2 : 16;
    hfield_t *nf;
    while (ncap < c->hb_count) ncap *= 2;
    nf = PyMem_Realloc(c->hb_fields, ncap * sizeof(hfield_t));
    if (!nf) return -1;
    c->hb_fields = nf;
    c->hb_fcap = ncap;
  }
  f = &c->hb_fields[c->hb_count - 1];
  f->name_off = (uint32_t)c->hb_len;
  f->name_len = (uint32_t)namelen;
  memcpy(c->hb_buf + c->hb_len, name, namelen);
  c->hb_len += namelen;
  f->value_off = (uint32_t)c->hb_len;
  f->value_len = (uint32_t)valuelen;
  memcpy(c->hb_buf + c->hb_len, value, valuelen);
  c->hb_len += valuelen;
  return 0;
}

static int cb_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags, void *ud) {
  Conn *c = ud;
  (void)session;
  (void)flags;
  if (c->pyerr) return NGHTTP2_ERR_CALLBACK_FAILURE;
  if (c->hb_kind == HB_NONE || frame->hd.stream_id != c->hb_sid) return 0;
  /* nghttp2 1.52 stores our SETTINGS_MAX_HEADER_LIST_SIZE but does not enforce it on receive:
   * the size is counted as RFC 9113 section 6.5.2 defines it (name + value + 32 per field). */
  c->hb_size += namelen + valuelen + 32;
  c->hb_count++;
  if (c->hb_size > c->lim.max_header_list_size || c->hb_count > c->lim.max_header_fields) {
    stream_t *st = smap_get(&c->streams, c->hb_sid);
    c->hb_rejected = 1;
    c->header_resets++;
    /* TEMPORAL_CALLBACK_FAILURE makes nghttp2 send RST_STREAM(INTERNAL_ERROR) and decode the
     * rest of the block without calling us again. */
    if (st && limit_reset(c, st, NGHTTP2_INTERNAL_ERROR, 0) != 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }
  if (hb_append(c, name, namelen, value, valuelen) < 0) {
    PyErr_NoMemory();
    c->pyerr = 1;
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  return 0;
}

static PyObject *hb_build(Conn *c) {
  uint32_t i;
  PyObject *list = PyList_New(c->hb_count);
  if (!list) return NULL;
  for (i = 0; i < c->hb_count; i++) {
    const hfield_t *f = &c->hb_fields[i];
    PyObject *t = tuple_of(2, bytes_of(c->hb_buf + f->name_off, f->name_len),
                           bytes_of(c->hb_buf + f->value_off, f->value_len), NULL, NULL);
    if (!t) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, i, t);
  }
  return list;
}

/* Emits the stream's coalesced DATA (an empty one only when it carries the end). */
static int pend_flush(Conn *c, stream_t *st, int end) {
  PyObject *b;
  if (st->in_head && pend_gather(c, st, st->pend_len) < 0) {
    pend_discard(c, st);
    c->pyerr = 1;
    return -1;
  }
  b = st->pend;
  pend_unlink(c, st);
  st->pend = NULL;
  if (b) {
    if (PyBytes_GET_SIZE(b) != st->pend_len && _PyBytes_Resize(&b, st->pend_len) < 0) {
      st->pend_len = 0;
      c->pyerr = 1;
      return -1;
    }
  } else {
    if (!end) return 0;
    b = PyBytes_FromStringAndSize(NULL, 0);
  }
  st->pend_len = 0;
  return ev_push(c, tuple_of(4, PyLong_FromLong(EV_DATA), PyLong_FromLong(st->id), b, pybool(end)));
}

/* Interim (1xx) response heads are dropped: gRPC has none and the final head follows
 * (RFC 9110 section 15.2). nghttp2 puts :status first and checks it is three digits. */
static int hb_is_interim(Conn *c) {
  const hfield_t *f;
  if (c->server || c->hb_count == 0) return 0;
  f = &c->hb_fields[0];
  return f->name_len == 7 && memcmp(c->hb_buf + f->name_off, ":status", 7) == 0 && f->value_len > 0 &&
         c->hb_buf[f->value_off] == '1';
}

static int on_headers_done(Conn *c, const nghttp2_frame *frame) {
  stream_t *st;
  PyObject *list;
  int end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  int kind = c->hb_kind;
  c->hb_kind = HB_NONE;
  if (kind == HB_NONE || c->hb_rejected || frame->hd.stream_id != c->hb_sid) return 0;
  st = smap_get(&c->streams, frame->hd.stream_id);
  if (!st || st->rst_sent) return 0;
  if (kind == HB_HEAD) {
    if (hb_is_interim(c)) return 0;
    list = hb_build(c);
    st->head_done = 1;
    st->announced = 1;
    if (end) st->recv_end = 1;
    return ev_push(c, tuple_of(4, PyLong_FromLong(EV_HEAD), PyLong_FromLong(st->id), list, pybool(end)));
  }
  /* Trailers end the stream (nghttp2's HTTP messaging rejects them without END_STREAM). */
  if (pend_flush(c, st, 0) < 0) return -1;
  list = hb_build(c);
  st->recv_end = 1;
  return ev_push(c, tuple_of(3, PyLong_FromLong(EV_TRAILERS), PyLong_FromLong(st->id), list, NULL));
}

static int cb_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *ud) {
  Conn *c = ud;
  stream_t *st;
  if (c->pyerr) return NGHTTP2_ERR_CALLBACK_FAILURE;
  switch (frame->hd.type) {
  case NGHTTP2_HEADERS:
    return on_headers_done(c, frame) < 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : 0;
  case NGHTTP2_DATA:
    /* padlen counts the Pad Length byte too (nghttp2.h, nghttp2_data) */
    if (frame->hd.length > 0 && frame->hd.length == frame->data.padlen &&
        !(frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
      int rv = charge(c, B_EMPTY_DATA, 0);
      if (rv) return rv;
    }
    if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) return 0;
    st = smap_get(&c->streams, frame->hd.stream_id);
    if (!st || st->rst_sent) return 0;
    st->recv_end = 1;
    return pend_flush(c, st, 1) < 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : 0;
  case NGHTTP2_GOAWAY:
    return ev_push(c, tuple_of(3, PyLong_FromLong(EV_GOAWAY), PyLong_FromLong(frame->goaway.last_stream_id),
                               PyLong_FromUnsignedLong(frame->goaway.error_code), NULL)) < 0
               ? NGHTTP2_ERR_CALLBACK_FAILURE
               : 0;
  case NGHTTP2_PING:
    if (frame->hd.flags & NGHTTP2_FLAG_ACK) {
      uint64_t v = 0;
      int i;
      for (i = 0; i < 8; i++) v = (v << 8) | frame->ping.opaque_data[i];
      return ev_push(c, tuple_of(2, PyLong_FromLong(EV_PING_ACK), PyLong_FromUnsignedLongLong(v), NULL, NULL)) < 0
                 ? NGHTTP2_ERR_CALLBACK_FAILURE
                 : 0;
    }
    return 0;
  case NGHTTP2_SETTINGS:
    if (frame->hd.flags & NGHTTP2_FLAG_ACK) return 0;
    return ev_push(c, tuple_of(2, PyLong_FromLong(EV_SETTINGS),
                               PyLong_FromUnsignedLong(nghttp2_session_get_remote_settings(
                                   session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)),
                               NULL, NULL)) < 0
               ? NGHTTP2_ERR_CALLBACK_FAILURE
               : 0;
  default:
    return 0;
  }
}

/* The stream's noted chunks copied into st->pend, a new bytes object of `cap` bytes (at least
 * pend_len): the exact size at pend_flush, room for one more chunk in pend_append. */
static int pend_gather(Conn *c, stream_t *st, Py_ssize_t cap) {
  PyObject *b = PyBytes_FromStringAndSize(NULL, cap);
  char *at;
  uint32_t i;
  if (!b) return -1;
  at = PyBytes_AS_STRING(b);
  for (i = st->in_head; i; i = c->inseg[i - 1].next) {
    memcpy(at, c->inseg[i - 1].p, c->inseg[i - 1].len);
    at += c->inseg[i - 1].len;
  }
  st->in_head = st->in_tail = 0;
  st->pend = b;
  return 0;
}

static int pend_append(Conn *c, stream_t *st, const uint8_t *data, size_t len) {
  Py_ssize_t need = st->pend_len + (Py_ssize_t)len;
  if (len == 0) return 0;
  if (!st->pend && c->in_start && data >= c->in_start && data + len <= c->in_end) {
    /* Noted, not copied: a stream's DATA of one read (16 KiB frames of a 256 KiB read) becomes
     * one object of its exact size at pend_flush, not a chain of doubling reallocs — blocks of
     * five sizes per read, which fragmented the heap with large answers in flight. */
    inseg_t *e;
    if (c->inseg_n == c->inseg_cap) {
      uint32_t ncap = c->inseg_cap ? c->inseg_cap * 2 : 64;
      inseg_t *grown = PyMem_Realloc(c->inseg, ncap * sizeof(inseg_t));
      if (!grown) return -1;
      c->inseg = grown;
      c->inseg_cap = ncap;
    }
    e = &c->inseg[c->inseg_n++];
    e->p = data;
    e->len = len;
    e->next = 0;
    if (st->in_tail)
      c->inseg[st->in_tail - 1].next = c->inseg_n;
    else
      st->in_head = c->inseg_n;
    st->in_tail = c->inseg_n;
  } else if (st->in_head) {
    if (pend_gather(c, st, need) < 0) return -1;
    memcpy(PyBytes_AS_STRING(st->pend) + st->pend_len, data, len);
  } else if (!st->pend) {
    /* NULL contents: a fresh object even for one byte (CPython shares 1-byte bytes objects,
     * and _PyBytes_Resize needs one nobody else holds) */
    st->pend = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!st->pend) return -1;
    memcpy(PyBytes_AS_STRING(st->pend), data, len);
  } else {
    if (need > PyBytes_GET_SIZE(st->pend)) {
      Py_ssize_t ncap = PyBytes_GET_SIZE(st->pend) * 2;
      if (ncap < need) ncap = need;
      if (_PyBytes_Resize(&st->pend, ncap) < 0) {
        st->pend_len = 0;
        return -1;
      }
    }
    memcpy(PyBytes_AS_STRING(st->pend) + st->pend_len, data, len);
  }
  st->pend_len = need;
  if (!st->on_pend) {
    st->on_pend = 1;
    st->pend_prev = NULL;
    st->pend_next = c->pend_head;
    if (c->pend_head) c->pend_head->pend_prev = st;
    c->pend_head = st;
  }
  return 0;
}

static int cb_data_chunk(nghttp2_session *session, uint8_t flags, int32_t sid, const uint8_t *data, size_t len,
                         void *ud) {
  Conn *c = ud;
  stream_t *st;
  (void)session;
  (void)flags;
  if (c->pyerr) return NGHTTP2_ERR_CALLBACK_FAILURE;
  st = smap_get(&c->streams, sid);
  if (!st || st->rst_sent) {
    c->pending_consume += len; /* nobody reads it: the window goes straight back */
    return 0;
  }
  st->recv_total += len;
  if (c->lim.max_stream_data && st->recv_total > c->lim.max_stream_data) {
    c->data_resets++;
    c->pending_consume += len;
    /* ENHANCE_YOUR_CALM: grpc maps it to RESOURCE_EXHAUSTED, the status of a too-big message */
    return limit_reset(c, st, NGHTTP2_ENHANCE_YOUR_CALM, 1);
  }
  if (pend_append(c, st, data, len) < 0) {
    c->pending_consume += len;
    c->pyerr = 1;
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  st->unconsumed += len;
  return 0;
}

/* Must never fail: a fatal return from here leaks in nghttp2 < 1.55.1 (CVE-2023-35945). */
static int cb_stream_close(nghttp2_session *session, int32_t sid, uint32_t code, void *ud) {
  Conn *c = ud;
  stream_t *st;
  (void)session;
  st = smap_get(&c->streams, sid);
  if (!st) return 0;
  /* DATA received in this feed before the close is delivered, whatever the split of the input */
  if (c->pyerr || pend_flush(c, st, 0) < 0) pend_discard(c, st);
  if (st->announced && !st->close_reported && !st->app_reset && !c->pyerr &&
      (code != NGHTTP2_NO_ERROR || !(st->recv_end && st->fin_sent)))
    ev_close(c, st, code);
  stream_free(c, st);
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Send callbacks.                                                                             */

static int cb_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *ud) {
  Conn *c = ud;
  stream_t *st;
  (void)session;
  switch (frame->hd.type) {
  case NGHTTP2_HEADERS:
  case NGHTTP2_DATA:
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) {
      st = smap_get(&c->streams, frame->hd.stream_id);
      if (st) st->fin_sent = 1;
    }
    return 0;
  case NGHTTP2_RST_STREAM:
    /* Every reset the app did not ask for was provoked by the peer (stream errors nghttp2
     * detects, our limit resets): the glitch bucket of CVE-2025-8671 counts them. */
    st = smap_get(&c->streams, frame->hd.stream_id);
    if (!st || !st->app_reset) return charge(c, B_GLITCH, 1);
    return 0;
  default:
    return 0;
  }
}

static int cb_frame_not_send(nghttp2_session *session, const nghttp2_frame *frame, int lib_error, void *ud) {
  Conn *c = ud;
  stream_t *st;
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  st = smap_get(&c->streams, frame->hd.stream_id);
  /* If nghttp2 has the stream, on_stream_close follows and cleans up; a request whose HEADERS
   * never went out has no nghttp2 stream, so it ends here (REFUSED_STREAM after GOAWAY: safe to
   * retry on another connection). */
  if (!st || nghttp2_session_find_stream(session, frame->hd.stream_id)) return 0;
  if (st->announced && !st->app_reset && !st->close_reported && !c->pyerr) {
    uint32_t code = (lib_error == NGHTTP2_ERR_START_STREAM_NOT_ALLOWED || lib_error == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE ||
                     lib_error == NGHTTP2_ERR_SESSION_CLOSING)
                        ? NGHTTP2_REFUSED_STREAM
                        : NGHTTP2_INTERNAL_ERROR;
    ev_close(c, st, code);
  }
  stream_free(c, st);
  return 0;
}

static void writable_check(Conn *c, stream_t *st) {
  if (st->want_writable && st->queued <= c->lim.write_low_water) {
    st->want_writable = 0;
    ev_push(c, tuple_of(2, PyLong_FromLong(EV_WRITABLE), PyLong_FromLong(st->id), NULL, NULL));
  }
}

/* Copies n queued bytes into buf and drops what was fully sent. */
static void queue_copy_out(stream_t *st, uint8_t *buf, size_t n) {
  while (n) {
    seg_t *s = &st->segs[st->seg_head];
    size_t take = (size_t)(s->len - s->off);
    if (take > n) take = n;
    memcpy(buf, s->ptr + s->off, take);
    buf += take;
    n -= take;
    s->off += (Py_ssize_t)take;
    st->queued -= take;
    if (s->off == s->len) queue_pop(st);
  }
}

/* End of our side: EOF, with the trailers (if any) as a HEADERS frame after the last DATA.
 * nghttp2_submit_trailer may be called from inside the read callback (nghttp2.h). */
static int data_eof(Conn *c, stream_t *st, uint32_t *data_flags) {
  *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  if (st->trailers) {
    nvbuf_t b;
    int rv;
    *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    if (nv_build(st->trailers, &b, 0) < 0) { /* only an allocation can fail here */
      PyErr_Clear();
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    rv = nghttp2_submit_trailer(c->session, st->id, b.nva, b.n);
    nv_free(&b);
    Py_CLEAR(st->trailers);
    if (rv != 0) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }
  st->has_provider = 0;
  return 0;
}

/* The data provider of every stream we send a body on: it pulls from the stream's queue. */
static h2_ssize cb_read(nghttp2_session *session, int32_t sid, uint8_t *buf, size_t length, uint32_t *data_flags,
                        nghttp2_data_source *source, void *ud) {
  Conn *c = ud;
  stream_t *st = smap_get(&c->streams, sid);
  size_t n;
  int eof, rv;
  (void)session;
  (void)source;
  if (!st) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  if (st->queued == 0) {
    if (!st->out_end) {
      /* nothing to send yet: parked until send_data() calls nghttp2_session_resume_data */
      st->deferred = 1;
      return NGHTTP2_ERR_DEFERRED;
    }
    rv = data_eof(c, st, data_flags);
    return rv ? rv : 0;
  }
  n = length < st->queued ? length : (size_t)st->queued;
  eof = st->out_end && n == st->queued;
  if (n >= ZC_MIN) {
    /* zero-copy: cb_send_data emits this frame's payload from the queue */
    *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  } else {
    queue_copy_out(st, buf, n);
    writable_check(c, st);
    if (c->pyerr) return NGHTTP2_ERR_CALLBACK_FAILURE;
  }
  if (eof && (rv = data_eof(c, st, data_flags)) != 0) return rv;
  return (h2_ssize)n;
}

static int out_reserve(Conn *c, size_t n) {
  if (c->olen + n > c->ocap) {
    size_t ncap = c->ocap ? c->ocap : 16384;
    char *nb;
    while (ncap < c->olen + n) ncap *= 2;
    nb = PyMem_Realloc(c->obuf, ncap);
    if (!nb) {
      PyErr_NoMemory();
      return -1;
    }
    c->obuf = nb;
    c->ocap = ncap;
  }
  return 0;
}

static int out_append(Conn *c, const void *p, size_t n) {
  if (out_reserve(c, n) < 0) return -1;
  memcpy(c->obuf + c->olen, p, n);
  c->olen += n;
  return 0;
}

static int out_add(Conn *c, PyObject *item) { /* steals item */
  int rv;
  if (!item) return -1;
  if (!c->out) {
    c->out = PyList_New(0);
    if (!c->out) {
      Py_DECREF(item);
      return -1;
    }
  }
  rv = PyList_Append(c->out, item);
  Py_DECREF(item);
  return rv;
}

/* Turns the bytes gathered so far into one output item. */
static int out_seal(Conn *c) {
  if (c->olen == 0) return 0;
  if (out_add(c, PyBytes_FromStringAndSize(c->obuf, (Py_ssize_t)c->olen)) < 0) return -1;
  c->olen = 0;
  return 0;
}

static PyObject *seg_slice(seg_t *s, Py_ssize_t n) {
  if (!s->mv) {
    s->mv = PyMemoryView_FromObject(s->obj);
    if (!s->mv) return NULL;
  }
  return PySequence_GetSlice(s->mv, s->off, s->off + n);
}

/* Zero-copy DATA (NGHTTP2_DATA_FLAG_NO_COPY): the 9-byte frame header, the pad length byte if
 * padded, `length` bytes of payload, then padding (nghttp2.h, nghttp2_send_data_callback). The
 * payload goes out as memoryview slices of the app's buffers, which hold them alive until the
 * transport is done with them. */
static int cb_send_data(nghttp2_session *session, nghttp2_frame *frame, const uint8_t *framehd, size_t length,
                        nghttp2_data_source *source, void *ud) {
  Conn *c = ud;
  stream_t *st = smap_get(&c->streams, frame->hd.stream_id);
  size_t padlen = frame->data.padlen;
  (void)session;
  (void)source;
  if (!st || st->queued < length) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  c->out_bytes += 9 + padlen + length;
  if (out_append(c, framehd, 9) < 0) goto fail;
  if (padlen > 0) {
    uint8_t p = (uint8_t)(padlen - 1);
    if (out_append(c, &p, 1) < 0) goto fail;
  }
  if (out_seal(c) < 0) goto fail;
  while (length) {
    seg_t *s = &st->segs[st->seg_head];
    size_t take = (size_t)(s->len - s->off);
    if (take > length) take = length;
    if (out_add(c, seg_slice(s, (Py_ssize_t)take)) < 0) goto fail;
    s->off += (Py_ssize_t)take;
    st->queued -= take;
    length -= take;
    if (s->off == s->len) queue_pop(st);
  }
  if (padlen > 1) {
    if (out_reserve(c, padlen - 1) < 0) goto fail;
    memset(c->obuf + c->olen, 0, padlen - 1);
    c->olen += padlen - 1;
  }
  writable_check(c, st);
  if (c->pyerr) return NGHTTP2_ERR_CALLBACK_FAILURE;
  /* flush(limit) reached: PAUSE makes mem_send return after this frame (nghttp2 loops over
   * zero-copy frames without returning otherwise) */
  return c->out_bytes >= c->out_limit ? NGHTTP2_ERR_PAUSE : 0;
fail:
  c->pyerr = 1;
  return NGHTTP2_ERR_CALLBACK_FAILURE;
}

/* ------------------------------------------------------------------------------------------ */
/* Construction and teardown.                                                                  */

static int limits_parse(limits_t *lim, PyObject *kwargs) {
  long long v[NLIMITS];
  int i, b;
  Py_ssize_t used = 0;
  for (i = 0; i < NLIMITS; i++) {
    PyObject *o = kwargs ? PyDict_GetItemString(kwargs, limit_specs[i].name) : NULL;
    v[i] = limit_specs[i].dflt;
    if (!o) continue;
    used++;
    if (!PyLong_Check(o) || PyBool_Check(o)) {
      PyErr_Format(PyExc_TypeError, "%s must be an int", limit_specs[i].name);
      return -1;
    }
    v[i] = PyLong_AsLongLong(o);
    if (v[i] == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      v[i] = limit_specs[i].hi + 1;
    }
    if (v[i] < limit_specs[i].lo || v[i] > limit_specs[i].hi) {
      PyErr_Format(PyExc_ValueError, "%s must be in [%lld, %lld]", limit_specs[i].name, limit_specs[i].lo,
                   limit_specs[i].hi);
      return -1;
    }
  }
  if (kwargs && PyDict_GET_SIZE(kwargs) != used) {
    PyObject *key;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &key, NULL)) {
      int known = 0;
      for (i = 0; i < NLIMITS && !known; i++) known = PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, limit_specs[i].name) == 0;
      if (!known) {
        PyErr_Format(PyExc_TypeError, "unknown limit %R", key);
        return -1;
      }
    }
  }
  lim->max_concurrent_streams = (uint32_t)v[0];
  lim->initial_window_size = (uint32_t)v[1];
  lim->connection_window_size = (uint32_t)v[2];
  lim->max_header_list_size = (uint32_t)v[3];
  lim->max_header_fields = (uint32_t)v[4];
  lim->max_frame_size = (uint32_t)v[5];
  lim->header_table_size = (uint32_t)v[6];
  lim->max_continuations = (uint32_t)v[7];
  lim->max_stream_data = (uint64_t)v[8];
  lim->write_low_water = (uint64_t)v[9];
  for (b = 0; b < NBUCKETS; b++) {
    lim->bucket[b].burst = (uint32_t)v[LIMIT_FIRST_BUCKET + 2 * b];
    lim->bucket[b].rate = (uint32_t)v[LIMIT_FIRST_BUCKET + 2 * b + 1];
  }
  return 0;
}

static int session_create(Conn *c) {
  nghttp2_option *opt;
  nghttp2_settings_entry iv[8];
  size_t n = 0;
  int rv;
  if (nghttp2_option_new(&opt) != 0) {
    PyErr_NoMemory();
    return -1;
  }
  /* Window credit goes back only when the app says it took the bytes (consume()). */
  nghttp2_option_set_no_auto_window_update(opt, 1);
  /* Before the peer's SETTINGS arrive, assume the 100 streams RFC 9113 section 6.5.2 advises. */
  nghttp2_option_set_peer_max_concurrent_streams(opt, 100);
#ifdef H2_HAVE_MAX_CONTINUATIONS
  nghttp2_option_set_max_continuations(opt, c->lim.max_continuations);
#endif
#ifdef H2_HAVE_STREAM_RESET_LIMIT
  /* A backstop behind our own rst_stream bucket (which runs first, at the frame header). */
  if (c->lim.bucket[B_RST_STREAM].burst)
    nghttp2_option_set_stream_reset_rate_limit(opt, c->lim.bucket[B_RST_STREAM].burst,
                                               c->lim.bucket[B_RST_STREAM].rate);
#endif
  if (c->server)
    rv = nghttp2_session_server_new2(&c->session, g_callbacks, c, opt);
  else
    rv = nghttp2_session_client_new2(&c->session, g_callbacks, c, opt);
  nghttp2_option_del(opt);
  if (rv != 0) {
    c->session = NULL;
    h2_raise(rv, "cannot create the session: %s", nghttp2_strerror(rv));
    return -1;
  }
  if (c->server) {
    iv[n].settings_id = NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS;
    iv[n++].value = c->lim.max_concurrent_streams;
  } else {
    iv[n].settings_id = NGHTTP2_SETTINGS_ENABLE_PUSH;
    iv[n++].value = 0;
  }
  iv[n].settings_id = NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE;
  iv[n++].value = c->lim.initial_window_size;
  iv[n].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE;
  iv[n++].value = c->lim.max_header_list_size;
  if (c->lim.max_frame_size != 16384) {
    iv[n].settings_id = NGHTTP2_SETTINGS_MAX_FRAME_SIZE;
    iv[n++].value = c->lim.max_frame_size;
  }
  if (c->lim.header_table_size != 4096) {
    iv[n].settings_id = NGHTTP2_SETTINGS_HEADER_TABLE_SIZE;
    iv[n++].value = c->lim.header_table_size;
  }
  /* RFC 9218 section 2.1: no RFC 7540 priority tree (nghttp2 then keeps no closed streams for it). */
  iv[n].settings_id = NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES;
  iv[n++].value = 1;
  rv = nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, n);
  if (rv == 0 && c->lim.connection_window_size != 65535)
    rv = nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0,
                                               (int32_t)c->lim.connection_window_size);
  if (rv != 0) {
    h2_raise(rv, "cannot queue the connection preface: %s", nghttp2_strerror(rv));
    return -1;
  }
  return 0;
}

static PyObject *conn_new(PyTypeObject *type, PyObject *args, PyObject *kwargs, int server) {
  Conn *c;
  int b;
  if (args && PyTuple_GET_SIZE(args) != 0) {
    PyErr_SetString(PyExc_TypeError, "limits are keyword arguments");
    return NULL;
  }
  c = (Conn *)type->tp_alloc(type, 0);
  if (!c) return NULL;
  c->server = server;
  if (limits_parse(&c->lim, kwargs) < 0) goto fail;
  c->now = now_ns();
  for (b = 0; b < NBUCKETS; b++) bucket_init(&c->buckets[b], &c->lim.bucket[b], c->now);
  if (session_create(c) < 0) goto fail;
  return (PyObject *)c;
fail:
  Py_DECREF(c);
  return NULL;
}

static PyObject *Server_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  return conn_new(type, args, kwargs, 1);
}

static PyObject *Client_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  return conn_new(type, args, kwargs, 0);
}

static void streams_free_all(Conn *c) {
  uint32_t i;
  for (i = 0; i < c->streams.cap; i++) {
    stream_t *st = c->streams.slots[i];
    if (!st) continue;
    c->streams.slots[i] = NULL;
    Py_CLEAR(st->pend);
    queue_clear(st);
    PyMem_Free(st->segs);
    Py_CLEAR(st->trailers);
    PyMem_Free(st);
  }
  c->streams.count = 0;
  c->pend_head = NULL;
}

static int Conn_traverse(Conn *c, visitproc visit, void *arg) {
  uint32_t i;
  int j;
  Py_VISIT(c->events);
  Py_VISIT(c->out);
  for (i = 0; i < c->streams.cap; i++) {
    stream_t *st = c->streams.slots[i];
    if (!st) continue;
    Py_VISIT(st->pend);
    Py_VISIT(st->trailers);
    for (j = 0; j < st->seg_count; j++) {
      Py_VISIT(st->segs[st->seg_head + j].obj);
      Py_VISIT(st->segs[st->seg_head + j].mv);
    }
  }
  return 0;
}

/* Breaks a reference cycle through a queued buffer: the queues are emptied, the streams stay. */
static int Conn_clear(Conn *c) {
  uint32_t i;
  Py_CLEAR(c->events);
  Py_CLEAR(c->out);
  for (i = 0; i < c->streams.cap; i++) {
    stream_t *st = c->streams.slots[i];
    if (!st) continue;
    pend_unlink(c, st);
    Py_CLEAR(st->pend);
    st->pend_len = 0;
    Py_CLEAR(st->trailers);
    queue_clear(st);
  }
  return 0;
}

static void Conn_dealloc(Conn *c) {
  PyObject_GC_UnTrack(c);
  /* nghttp2_session_del calls no callback; our stream states are freed after it. */
  if (c->session) nghttp2_session_del(c->session);
  c->session = NULL;
  streams_free_all(c);
  PyMem_Free(c->streams.slots);
  Py_CLEAR(c->events);
  Py_CLEAR(c->out);
  PyMem_Free(c->hb_buf);
  PyMem_Free(c->hb_fields);
  PyMem_Free(c->obuf);
  PyMem_Free(c->inseg);
  Py_TYPE(c)->tp_free((PyObject *)c);
}

/* ------------------------------------------------------------------------------------------ */
/* Method helpers.                                                                             */

static int enter(Conn *c) {
  if (c->busy) {
    h2_raise(NGHTTP2_ERR_INVALID_STATE, "reentrant call into the HTTP/2 connection");
    return -1;
  }
  return 0;
}

/* Minimal argument parsing for METH_FASTCALL | METH_KEYWORDS: names[] lists every parameter,
 * the first nreq are required. out[] receives borrowed references (NULL when absent). */
static int parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *const *names,
                      int nreq, int nmax, PyObject **out, const char *fname) {
  Py_ssize_t i;
  int j;
  if (nargs > nmax) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fname, nmax, nargs);
    return -1;
  }
  for (j = 0; j < nmax; j++) out[j] = j < nargs ? args[j] : NULL;
  if (kwnames) {
    for (i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
      PyObject *k = PyTuple_GET_ITEM(kwnames, i);
      for (j = 0; j < nmax; j++)
        if (PyUnicode_CompareWithASCIIString(k, names[j]) == 0) break;
      if (j == nmax) {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", fname, k);
        return -1;
      }
      if (out[j]) {
        PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, names[j]);
        return -1;
      }
      out[j] = args[nargs + i];
    }
  }
  for (j = 0; j < nreq; j++) {
    if (!out[j]) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[j]);
      return -1;
    }
  }
  return 0;
}

static int sid_of(PyObject *o, int32_t *sid) {
  long v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (v < 1 || v > 0x7fffffffL) {
    PyErr_SetString(PyExc_ValueError, "stream id must be in [1, 2**31-1]");
    return -1;
  }
  *sid = (int32_t)v;
  return 0;
}

static int truth(PyObject *o, int *v) {
  int r;
  if (!o) {
    *v = 0;
    return 0;
  }
  r = PyObject_IsTrue(o);
  if (r < 0) return -1;
  *v = r;
  return 0;
}

/* Queues a buffer on the stream. Bytes are kept as they are; any other buffer is held as a 1-D
 * byte memoryview, which keeps the exporter pinned (a bytearray cannot be resized under us). */
static int queue_buffer(stream_t *st, PyObject *buf) {
  PyObject *mv;
  Py_buffer *view;
  if (PyBytes_CheckExact(buf)) {
    if (PyBytes_GET_SIZE(buf) == 0) return 0;
    Py_INCREF(buf);
    if (queue_push(st, buf, NULL, PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf)) < 0) {
      Py_DECREF(buf);
      return -1;
    }
    return 0;
  }
  mv = PyMemoryView_FromObject(buf);
  if (!mv) return -1;
  view = PyMemoryView_GET_BUFFER(mv);
  if (!PyBuffer_IsContiguous(view, 'C')) {
    Py_DECREF(mv);
    PyErr_SetString(PyExc_BufferError, "body buffers must be C-contiguous");
    return -1;
  }
  if (view->ndim != 1 || view->itemsize != 1 || (view->format && strcmp(view->format, "B") != 0)) {
    PyObject *cast = PyObject_CallMethod(mv, "cast", "s", "B");
    Py_DECREF(mv);
    if (!cast) return -1;
    mv = cast;
    view = PyMemoryView_GET_BUFFER(mv);
  }
  if (view->len == 0) {
    Py_DECREF(mv);
    return 0;
  }
  Py_INCREF(mv); /* one reference as the owner, one as the slicing view */
  if (queue_push(st, mv, mv, view->buf, view->len) < 0) {
    Py_DECREF(mv);
    Py_DECREF(mv);
    return -1;
  }
  return 0;
}

static void data_provider_init(h2_data_provider *prd) {
  prd->source.ptr = NULL;
  prd->read_callback = cb_read;
}

/* After send_data()/send_trailers(): wake the provider if it is parked. */
static int resume(Conn *c, stream_t *st) {
  int rv;
  if (!st->deferred) return 0;
  st->deferred = 0;
  rv = nghttp2_session_resume_data(c->session, st->id);
  if (rv != 0 && rv != NGHTTP2_ERR_INVALID_ARGUMENT) {
    h2_raise(rv, "resume_data: %s", nghttp2_strerror(rv));
    return -1;
  }
  return 0;
}

/* The stream for a send call: NULL without an exception when it is gone (closed, reset) or
 * not known to the app yet (a request whose head is still arriving). */
static stream_t *live_stream(Conn *c, int32_t sid) {
  stream_t *st = smap_get(&c->streams, sid);
  if (!st || st->rst_sent || !st->announced) return NULL;
  return st;
}

static int check_open(Conn *c) {
  if (enter(c) < 0) return -1;
  if (c->fatal) {
    h2_raise(NGHTTP2_ERR_INVALID_STATE, "the connection failed");
    return -1;
  }
  return 0;
}

/* Applies window credit noted inside callbacks (nghttp2 calls done outside the library). */
static int apply_pending_consume(Conn *c) {
  while (c->pending_consume) {
    uint64_t n = c->pending_consume > 0x7fffffff ? 0x7fffffff : c->pending_consume;
    int rv = nghttp2_session_consume_connection(c->session, (size_t)n);
    c->pending_consume -= n;
    if (nghttp2_is_fatal(rv)) {
      h2_raise(rv, "consume: %s", nghttp2_strerror(rv));
      return -1;
    }
  }
  return 0;
}

static PyObject *take_events(Conn *c) {
  PyObject *evs = c->events;
  c->events = NULL;
  if (!evs) evs = PyList_New(0);
  return evs;
}

/* ------------------------------------------------------------------------------------------ */
/* feed / flush / poll.                                                                        */

static PyObject *Conn_feed(Conn *c, PyObject *const *args, Py_ssize_t nargs) {
  Py_buffer view;
  Py_ssize_t n;
  h2_ssize rv;
  stream_t *st;
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "feed(data[, nbytes])");
    return NULL;
  }
  if (check_open(c) < 0) return NULL;
  if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
  n = view.len;
  if (nargs == 2 && args[1] != Py_None) {
    n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) goto fail_view;
    if (n < 0 || n > view.len) {
      PyErr_SetString(PyExc_ValueError, "nbytes out of range");
      goto fail_view;
    }
  }
  c->now = 0;
  c->busy = 1;
  c->in_start = view.buf;
  c->in_end = (const uint8_t *)view.buf + n;
  rv = h2_mem_recv(c->session, view.buf, (size_t)n);
  c->busy = 0;
  /* DATA of this feed not ended yet goes out now, one event per stream (copied from the input,
   * which is released only after). */
  while ((st = c->pend_head) && !c->pyerr) pend_flush(c, st, 0);
  while ((st = c->pend_head)) pend_discard(c, st); /* (after an error: nothing points into it) */
  c->inseg_n = 0;
  c->in_start = c->in_end = NULL;
  PyBuffer_Release(&view);
  if (c->pyerr) {
    c->fatal = 1;
    nghttp2_session_terminate_session(c->session, NGHTTP2_INTERNAL_ERROR);
    Py_CLEAR(c->events);
    if (!PyErr_Occurred()) PyErr_NoMemory();
    return NULL;
  }
  if (rv < 0) {
    /* Fatal: queue a GOAWAY for flush() where the library did not (too many CONTINUATIONs,
     * outbound flood, bad preface), then the caller closes the connection. */
    uint32_t code = NGHTTP2_INTERNAL_ERROR;
    const char *what = nghttp2_strerror((int)rv);
    if ((int)rv == NGHTTP2_ERR_BAD_CLIENT_MAGIC) {
      code = NGHTTP2_PROTOCOL_ERROR;
    } else if ((int)rv == NGHTTP2_ERR_FLOODED) {
      code = NGHTTP2_ENHANCE_YOUR_CALM;
    } else if (c->cont_flood || (int)rv == H2_ERR_TOO_MANY_CONTINUATIONS) {
      code = NGHTTP2_ENHANCE_YOUR_CALM;
      what = "too many CONTINUATION frames";
    }
    c->fatal = 1;
    nghttp2_session_terminate_session(c->session, code);
    Py_CLEAR(c->events); /* the connection is over: nothing it produced is delivered */
    h2_raise((int)rv, "%s", what);
    return NULL;
  }
  if (apply_pending_consume(c) < 0) return NULL;
  return take_events(c);
fail_view:
  PyBuffer_Release(&view);
  return NULL;
}

static PyObject *Conn_flush(Conn *c, PyObject *const *args, Py_ssize_t nargs) {
  Py_ssize_t limit = PY_SSIZE_T_MAX;
  PyObject *out;
  if (nargs > 1) {
    PyErr_SetString(PyExc_TypeError, "flush([limit])");
    return NULL;
  }
  if (nargs == 1 && args[0] != Py_None) {
    limit = PyLong_AsSsize_t(args[0]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (limit <= 0) {
      PyErr_SetString(PyExc_ValueError, "limit must be positive");
      return NULL;
    }
  }
  if (enter(c) < 0) return NULL;
  c->now = 0;
  c->olen = 0;
  c->out_bytes = 0;
  c->out_limit = (size_t)limit;
  for (;;) {
    const uint8_t *data;
    h2_ssize n;
    if (apply_pending_consume(c) < 0) goto fail;
    c->busy = 1;
    n = h2_mem_send(c->session, &data);
    c->busy = 0;
    if (c->pyerr) {
      if (!PyErr_Occurred()) PyErr_NoMemory();
      goto fail;
    }
    if (n < 0) {
      h2_raise((int)n, "%s", nghttp2_strerror((int)n));
      goto fail;
    }
    if (n > 0) {
      if (out_append(c, data, (size_t)n) < 0) goto fail;
      c->out_bytes += (size_t)n;
      if (c->out_bytes >= (size_t)limit) break;
      continue;
    }
    if (c->out_bytes >= (size_t)limit) break;
    /* Nothing more to send now, unless a bucket tripped on what was just sent (GOAWAY now,
     * then send it too) or a stream closed with unconsumed bytes (a WINDOW_UPDATE to send). */
    if (c->calm_pending && !c->dead) {
      int b = c->calm_pending - 1;
      c->calm_pending = 0;
      if (trip(c, b, 0) != 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto fail;
      }
      continue;
    }
    if (c->pending_consume) continue;
    break;
  }
  if (out_seal(c) < 0) goto fail;
  out = c->out;
  c->out = NULL;
  if (!out) Py_RETURN_NONE;
  return out;
fail:
  /* nghttp2 counts what it handed over as sent: losing it leaves the connection unusable */
  c->fatal = 1;
  Py_CLEAR(c->out);
  Py_CLEAR(c->events);
  return NULL;
}

static PyObject *Conn_poll(Conn *c, PyObject *unused) {
  (void)unused;
  return take_events(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Sending: server.                                                                            */

static PyObject *Server_respond(Conn *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"sid", "headers", "body", "trailers"};
  PyObject *a[4];
  int32_t sid;
  stream_t *st;
  nvbuf_t hb, tb;
  h2_data_provider prd;
  int rv, has_body, has_trailers;
  if (parse_args(args, nargs, kwnames, names, 2, 4, a, "respond") < 0) return NULL;
  if (sid_of(a[0], &sid) < 0 || check_open(c) < 0) return NULL;
  has_body = a[2] && a[2] != Py_None;
  has_trailers = a[3] && a[3] != Py_None;
  st = live_stream(c, sid);
  if (!st) Py_RETURN_FALSE;
  if (st->hdr_sent) {
    h2_raise(NGHTTP2_ERR_INVALID_STATE, "stream %d already has its head", (int)sid);
    return NULL;
  }
  if (nv_build(a[1], &hb, 1) < 0) return NULL;
  if (!has_body && !has_trailers) {
    /* gRPC trailers-only: one HEADERS frame with END_STREAM */
    rv = h2_submit_response(c->session, sid, hb.nva, hb.n, NULL);
    nv_free(&hb);
    if (rv != 0) goto submit_failed;
    st->hdr_sent = st->out_end = 1;
    Py_RETURN_TRUE;
  }
  if (!has_body) {
    /* HEADERS, then the trailers as HEADERS with END_STREAM; no DATA */
    if (nv_build(a[3], &tb, 1) < 0) {
      nv_free(&hb);
      return NULL;
    }
    rv = nghttp2_submit_headers(c->session, NGHTTP2_FLAG_NONE, sid, NULL, hb.nva, hb.n, NULL);
    if (rv == 0) {
      st->hdr_sent = 1;
      rv = nghttp2_submit_trailer(c->session, sid, tb.nva, tb.n);
    }
    nv_free(&hb);
    nv_free(&tb);
    if (rv != 0) goto submit_failed;
    st->out_end = 1;
    Py_RETURN_TRUE;
  }
  if (has_trailers) {
    st->trailers = headers_snapshot(a[3]);
    if (!st->trailers) {
      nv_free(&hb);
      return NULL;
    }
  }
  if (queue_buffer(st, a[2]) < 0) {
    Py_CLEAR(st->trailers);
    nv_free(&hb);
    return NULL;
  }
  data_provider_init(&prd);
  rv = h2_submit_response(c->session, sid, hb.nva, hb.n, &prd);
  nv_free(&hb);
  if (rv != 0) {
    queue_clear(st);
    Py_CLEAR(st->trailers);
    goto submit_failed;
  }
  st->hdr_sent = st->out_end = st->has_provider = 1;
  Py_RETURN_TRUE;
submit_failed:
  h2_raise(rv, "cannot answer stream %d: %s", (int)sid, nghttp2_strerror(rv));
  return NULL;
}

static PyObject *Server_send_headers(Conn *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"sid", "headers", "end"};
  PyObject *a[3];
  int32_t sid;
  stream_t *st;
  nvbuf_t hb;
  h2_data_provider prd;
  int rv, end;
  if (parse_args(args, nargs, kwnames, names, 2, 3, a, "send_headers") < 0) return NULL;
  if (sid_of(a[0], &sid) < 0 || truth(a[2], &end) < 0 || check_open(c) < 0) return NULL;
  st = live_stream(c, sid);
  if (!st) Py_RETURN_FALSE;
  if (st->hdr_sent) {
    h2_raise(NGHTTP2_ERR_INVALID_STATE, "stream %d already has its head", (int)sid);
    return NULL;
  }
  if (nv_build(a[1], &hb, 1) < 0) return NULL;
  data_provider_init(&prd);
  /* Without end the provider is attached now and parks (DEFERRED) until send_data(). */
  rv = h2_submit_response(c->session, sid, hb.nva, hb.n, end ? NULL : &prd);
  nv_free(&hb);
  if (rv != 0) {
    h2_raise(rv, "cannot answer stream %d: %s", (int)sid, nghttp2_strerror(rv));
    return NULL;
  }
  st->hdr_sent = 1;
  if (end)
    st->out_end = 1;
  else
    st->has_provider = 1;
  Py_RETURN_TRUE;
}

static PyObject *Server_shutdown_notice(Conn *c, PyObject *unused) {
  int rv;
  (void)unused;
  if (check_open(c) < 0) return NULL;
  rv = nghttp2_submit_shutdown_notice(c->session);
  if (rv != 0) {
    h2_raise(rv, "shutdown_notice: %s", nghttp2_strerror(rv));
    return NULL;
  }
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------ */
/* Sending: client.                                                                            */

static int client_can_request(Conn *c) {
  uint32_t remote;
  if (c->fatal || c->dead || !nghttp2_session_check_request_allowed(c->session)) return 0;
  remote = nghttp2_session_get_remote_settings(c->session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
  if (c->streams.count >= remote || c->streams.count >= c->lim.max_concurrent_streams) return 0;
  return 1;
}

static PyObject *Client_request(Conn *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"headers", "body", "end"};
  PyObject *a[3];
  stream_t *st;
  nvbuf_t hb;
  h2_data_provider prd;
  int32_t sid;
  int end, has_body;
  if (parse_args(args, nargs, kwnames, names, 1, 3, a, "request") < 0) return NULL;
  end = 1;
  if (a[2] && truth(a[2], &end) < 0) return NULL;
  if (check_open(c) < 0) return NULL;
  has_body = a[1] && a[1] != Py_None;
  if (!client_can_request(c)) {
    h2_raise(NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE, "no new stream allowed on this connection");
    return NULL;
  }
  if (nv_build(a[0], &hb, 1) < 0) return NULL;
  /* the stream id is only known after submit; the state starts detached and is keyed then */
  st = PyMem_Calloc(1, sizeof(stream_t));
  if (!st) {
    nv_free(&hb);
    return PyErr_NoMemory();
  }
  if (has_body && queue_buffer(st, a[1]) < 0) goto fail;
  data_provider_init(&prd);
  sid = h2_submit_request(c->session, NULL, hb.nva, hb.n, (has_body || !end) ? &prd : NULL, NULL);
  nv_free(&hb);
  if (sid < 0) {
    h2_raise(sid, "cannot start a request: %s", nghttp2_strerror(sid));
    goto fail_nohb;
  }
  st->id = sid;
  st->announced = st->hdr_sent = 1;
  st->out_end = end ? 1 : 0;
  st->has_provider = (has_body || !end) ? 1 : 0;
  if (!end && st->queued > c->lim.write_low_water) st->want_writable = 1;
  if (smap_put(&c->streams, st) < 0) {
    /* nghttp2 has the request queued: cancel it (the not-sent callback finds no state) */
    nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL);
    PyErr_NoMemory();
    goto fail_nohb;
  }
  return PyLong_FromLong(sid);
fail:
  nv_free(&hb);
fail_nohb:
  queue_clear(st);
  PyMem_Free(st->segs);
  PyMem_Free(st);
  return NULL;
}

static PyObject *Client_can_request(Conn *c, PyObject *unused) {
  (void)unused;
  return pybool(client_can_request(c));
}

static PyObject *Client_get_remote_mcs(Conn *c, void *closure) {
  (void)closure;
  return PyLong_FromUnsignedLong(
      nghttp2_session_get_remote_settings(c->session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS));
}

/* ------------------------------------------------------------------------------------------ */
/* Sending: both.                                                                              */

static PyObject *Conn_send_data(Conn *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"sid", "data", "end"};
  PyObject *a[3];
  int32_t sid;
  stream_t *st;
  int end;
  if (parse_args(args, nargs, kwnames, names, 2, 3, a, "send_data") < 0) return NULL;
  if (sid_of(a[0], &sid) < 0 || truth(a[2], &end) < 0 || check_open(c) < 0) return NULL;
  st = live_stream(c, sid);
  if (!st) Py_RETURN_FALSE;
  if (!st->has_provider || st->out_end) {
    h2_raise(NGHTTP2_ERR_INVALID_STATE,
             st->out_end ? "stream %d: our side has ended" : "stream %d: send the head first (without end)",
             (int)sid);
    return NULL;
  }
  if (queue_buffer(st, a[1]) < 0) return NULL;
  /* WRITABLE only matters while the app still has more to send */
  if (end) {
    st->out_end = 1;
    st->want_writable = 0;
  } else if (st->queued > c->lim.write_low_water) {
    st->want_writable = 1;
  }
  if (resume(c, st) < 0) return NULL;
  Py_RETURN_TRUE;
}

static PyObject *Conn_send_trailers(Conn *c, PyObject *const *args, Py_ssize_t nargs) {
  int32_t sid;
  stream_t *st;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "send_trailers(sid, headers)");
    return NULL;
  }
  if (sid_of(args[0], &sid) < 0 || check_open(c) < 0) return NULL;
  st = live_stream(c, sid);
  if (!st) Py_RETURN_FALSE;
  if (!st->has_provider || st->out_end) {
    h2_raise(NGHTTP2_ERR_INVALID_STATE,
             st->out_end ? "stream %d: our side has ended" : "stream %d: send the head first (without end)",
             (int)sid);
    return NULL;
  }
  st->trailers = headers_snapshot(args[1]);
  if (!st->trailers) return NULL;
  st->out_end = 1;
  st->want_writable = 0;
  if (resume(c, st) < 0) return NULL;
  Py_RETURN_TRUE;
}

static PyObject *Conn_reset(Conn *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"sid", "code"};
  PyObject *a[2];
  int32_t sid;
  unsigned long code = NGHTTP2_CANCEL;
  stream_t *st;
  int rv;
  if (parse_args(args, nargs, kwnames, names, 1, 2, a, "reset") < 0) return NULL;
  if (sid_of(a[0], &sid) < 0) return NULL;
  if (a[1]) {
    code = PyLong_AsUnsignedLong(a[1]);
    if (code == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    if (code > 0xffffffffUL) {
      PyErr_SetString(PyExc_ValueError, "error code must fit in 32 bits");
      return NULL;
    }
  }
  if (check_open(c) < 0) return NULL;
  st = smap_get(&c->streams, sid);
  if (!st || st->rst_sent) Py_RETURN_FALSE;
  rv = nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, sid, (uint32_t)code);
  if (rv != 0) {
    h2_raise(rv, "reset: %s", nghttp2_strerror(rv));
    return NULL;
  }
  st->rst_sent = st->app_reset = 1;
  queue_clear(st);
  Py_CLEAR(st->trailers);
  Py_RETURN_TRUE;
}

static PyObject *Conn_consume(Conn *c, PyObject *const *args, Py_ssize_t nargs) {
  int32_t sid;
  Py_ssize_t n;
  stream_t *st;
  int rv;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "consume(sid, nbytes)");
    return NULL;
  }
  if (sid_of(args[0], &sid) < 0) return NULL;
  n = PyLong_AsSsize_t(args[1]);
  if (n == -1 && PyErr_Occurred()) return NULL;
  if (n < 0) {
    PyErr_SetString(PyExc_ValueError, "nbytes must be >= 0");
    return NULL;
  }
  if (enter(c) < 0) return NULL;
  st = smap_get(&c->streams, sid);
  if (!st || n == 0) Py_RETURN_NONE; /* a closed stream's bytes were returned when it closed */
  if ((uint64_t)n > st->unconsumed) {
    PyErr_Format(PyExc_ValueError, "stream %d has only %llu unconsumed bytes", (int)sid,
                 (unsigned long long)st->unconsumed);
    return NULL;
  }
  st->unconsumed -= (uint64_t)n;
  rv = nghttp2_session_consume(c->session, sid, (size_t)n);
  if (rv != 0) {
    h2_raise(rv, "consume: %s", nghttp2_strerror(rv));
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *Conn_ping(Conn *c, PyObject *const *args, Py_ssize_t nargs) {
  uint8_t opaque[8];
  unsigned long long v = 0;
  int i, rv;
  if (nargs > 1) {
    PyErr_SetString(PyExc_TypeError, "ping([opaque])");
    return NULL;
  }
  if (nargs == 1) {
    v = PyLong_AsUnsignedLongLong(args[0]);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  }
  if (check_open(c) < 0) return NULL;
  for (i = 7; i >= 0; i--) {
    opaque[i] = (uint8_t)(v & 0xff);
    v >>= 8;
  }
  rv = nghttp2_submit_ping(c->session, NGHTTP2_FLAG_NONE, opaque);
  if (rv != 0) {
    h2_raise(rv, "ping: %s", nghttp2_strerror(rv));
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *Conn_goaway(Conn *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  static const char *const names[] = {"code", "last_sid"};
  PyObject *a[2];
  unsigned long code = NGHTTP2_NO_ERROR;
  long last;
  int rv;
  if (parse_args(args, nargs, kwnames, names, 0, 2, a, "goaway") < 0) return NULL;
  if (a[0]) {
    code = PyLong_AsUnsignedLong(a[0]);
    if (code == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    if (code > 0xffffffffUL) {
      PyErr_SetString(PyExc_ValueError, "error code must fit in 32 bits");
      return NULL;
    }
  }
  if (check_open(c) < 0) return NULL;
  if (a[1] && a[1] != Py_None) {
    last = PyLong_AsLong(a[1]);
    if (last == -1 && PyErr_Occurred()) return NULL;
    if (last < 0 || last > 0x7fffffffL) {
      PyErr_SetString(PyExc_ValueError, "last_sid must be in [0, 2**31-1]");
      return NULL;
    }
  } else {
    last = nghttp2_session_get_last_proc_stream_id(c->session);
  }
  if (code == NGHTTP2_NO_ERROR)
    /* graceful: streams up to last_sid go on, newer ones are ignored (RFC 9113 section 6.8) */
    rv = nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE, (int32_t)last, NGHTTP2_NO_ERROR, NULL, 0);
  else
    /* an error: nghttp2 stops reading, and want_read/want_write go false once it is sent */
    rv = nghttp2_session_terminate_session2(c->session, (int32_t)last, (uint32_t)code);
  if (rv != 0) {
    h2_raise(rv, "goaway: %s", nghttp2_strerror(rv));
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *Conn_buffered(Conn *c, PyObject *arg) {
  int32_t sid;
  stream_t *st;
  if (sid_of(arg, &sid) < 0) return NULL;
  st = smap_get(&c->streams, sid);
  return PyLong_FromUnsignedLongLong(st ? st->queued : 0);
}

static PyObject *Conn_counters(Conn *c, PyObject *unused) {
  PyObject *d = PyDict_New(), *v;
  int b;
  (void)unused;
  if (!d) return NULL;
  for (b = 0; b < NBUCKETS; b++) {
    v = PyLong_FromUnsignedLongLong(c->buckets[b].count);
    if (!v || PyDict_SetItemString(d, bucket_names[b], v) < 0) goto fail;
    Py_DECREF(v);
  }
  v = PyLong_FromUnsignedLongLong(c->header_resets);
  if (!v || PyDict_SetItemString(d, "header_resets", v) < 0) goto fail;
  Py_DECREF(v);
  v = PyLong_FromUnsignedLongLong(c->data_resets);
  if (!v || PyDict_SetItemString(d, "data_resets", v) < 0) goto fail;
  Py_DECREF(v);
  return d;
fail:
  Py_XDECREF(v);
  Py_DECREF(d);
  return NULL;
}

static PyObject *Conn_get_want_read(Conn *c, void *closure) {
  (void)closure;
  return pybool(!c->fatal && nghttp2_session_want_read(c->session));
}

static PyObject *Conn_get_want_write(Conn *c, void *closure) {
  (void)closure;
  return pybool(nghttp2_session_want_write(c->session));
}

static PyObject *Conn_get_open_streams(Conn *c, void *closure) {
  (void)closure;
  return PyLong_FromUnsignedLong(c->streams.count);
}

static PyObject *Conn_get_outbound_queue_size(Conn *c, void *closure) {
  (void)closure;
  return PyLong_FromSize_t(nghttp2_session_get_outbound_queue_size(c->session));
}

static PyObject *Conn_get_dead(Conn *c, void *closure) {
  (void)closure;
  if (!c->dead) Py_RETURN_NONE;
  return PyUnicode_FromString(c->dead);
}

static PyObject *Conn_get_has_events(Conn *c, void *closure) {
  (void)closure;
  return pybool(c->events && PyList_GET_SIZE(c->events) > 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Types and module.                                                                           */

#define FASTKW(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
#define FAST(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

static PyMethodDef Conn_methods[] = {
    {"feed", FAST(Conn_feed), "feed($self, data, nbytes=None, /)\n--\n\nProcess received bytes; return the events."},
    {"flush", FAST(Conn_flush), "flush($self, limit=None, /)\n--\n\nEverything to write now (for writelines), or None."},
    {"poll", (PyCFunction)Conn_poll, METH_NOARGS, "poll($self, /)\n--\n\nThe events that arose outside feed()."},
    {"send_data", FASTKW(Conn_send_data), "send_data($self, sid, data, end=False)\n--\n\nQueue body bytes on a stream."},
    {"send_trailers", FAST(Conn_send_trailers), "send_trailers($self, sid, headers, /)\n--\n\nEnd a stream's body with trailers."},
    {"reset", FASTKW(Conn_reset), "reset($self, sid, code=8)\n--\n\nReset a stream (once)."},
    {"consume", FAST(Conn_consume), "consume($self, sid, nbytes, /)\n--\n\nReturn flow-control window for bytes the app took."},
    {"ping", FAST(Conn_ping), "ping($self, opaque=0, /)\n--\n\nSend a PING."},
    {"goaway", FASTKW(Conn_goaway), "goaway($self, code=0, last_sid=None)\n--\n\nSend GOAWAY (graceful with code 0)."},
    {"buffered", (PyCFunction)Conn_buffered, METH_O, "buffered($self, sid, /)\n--\n\nBytes queued on a stream and not yet sent."},
    {"counters", (PyCFunction)Conn_counters, METH_NOARGS, "counters($self, /)\n--\n\nFlood and limit counters, for metrics."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Conn_getset[] = {
    {"want_read", (getter)Conn_get_want_read, NULL, NULL, NULL},
    {"want_write", (getter)Conn_get_want_write, NULL, NULL, NULL},
    {"open_streams", (getter)Conn_get_open_streams, NULL, NULL, NULL},
    {"outbound_queue_size", (getter)Conn_get_outbound_queue_size, NULL, NULL, NULL},
    {"dead", (getter)Conn_get_dead, NULL, NULL, NULL},
    {"has_events", (getter)Conn_get_has_events, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef Server_methods[] = {
    {"respond", FASTKW(Server_respond), "respond($self, sid, headers, body=None, trailers=None)\n--\n\nAnswer a request in one call."},
    {"send_headers", FASTKW(Server_send_headers), "send_headers($self, sid, headers, end=False)\n--\n\nSend the response head alone."},
    {"shutdown_notice", (PyCFunction)Server_shutdown_notice, METH_NOARGS, "shutdown_notice($self, /)\n--\n\nFirst step of a graceful drain."},
    {NULL, NULL, 0, NULL}};

static PyMethodDef Client_methods[] = {
    {"request", FASTKW(Client_request), "request($self, headers, body=None, end=True)\n--\n\nStart a request; return its stream id."},
    {"can_request", (PyCFunction)Client_can_request, METH_NOARGS, "can_request($self, /)\n--\n\nWhether request() would succeed."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Client_getset[] = {
    {"remote_max_concurrent_streams", (getter)Client_get_remote_mcs, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}};

/* The constructors' keyword arguments with their defaults (limit_specs), for __text_signature__. */
#define LIMITS_SIGNATURE \
  "*, max_concurrent_streams=100, initial_window_size=1048576, connection_window_size=8388608, " \
  "max_header_list_size=16384, max_header_fields=100, max_frame_size=16384, " \
  "header_table_size=4096, max_continuations=8, max_stream_data=67108864, write_low_water=65536, " \
  "ping_burst=1000, ping_rate=100, settings_burst=100, settings_rate=10, " \
  "window_update_burst=10000, window_update_rate=1000, priority_burst=1000, priority_rate=100, " \
  "empty_data_burst=100, empty_data_rate=10, rst_stream_burst=1000, rst_stream_rate=33, " \
  "glitch_burst=1000, glitch_rate=33"

static PyTypeObject ConnType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway.h2._h2.Connection",
    .tp_doc = "One HTTP/2 connection on libnghttp2 (the base of ServerConnection and ClientConnection).",
    .tp_basicsize = sizeof(Conn),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_dealloc = (destructor)Conn_dealloc,
    .tp_traverse = (traverseproc)Conn_traverse,
    .tp_clear = (inquiry)Conn_clear,
    .tp_methods = Conn_methods,
    .tp_getset = Conn_getset,
};

static PyTypeObject ServerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway.h2._h2.ServerConnection",
    .tp_doc = "ServerConnection(" LIMITS_SIGNATURE ")\n--\n\nThe server side of one HTTP/2 connection.",
    .tp_basicsize = sizeof(Conn),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_base = &ConnType,
    .tp_new = Server_new,
    .tp_dealloc = (destructor)Conn_dealloc,
    .tp_traverse = (traverseproc)Conn_traverse,
    .tp_clear = (inquiry)Conn_clear,
    .tp_methods = Server_methods,
};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gateway.h2._h2.ClientConnection",
    .tp_doc = "ClientConnection(" LIMITS_SIGNATURE ")\n--\n\nThe client side of one HTTP/2 connection.",
    .tp_basicsize = sizeof(Conn),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_base = &ConnType,
    .tp_new = Client_new,
    .tp_dealloc = (destructor)Conn_dealloc,
    .tp_traverse = (traverseproc)Conn_traverse,
    .tp_clear = (inquiry)Conn_clear,
    .tp_methods = Client_methods,
    .tp_getset = Client_getset,
};

static int callbacks_create(void) {
  if (nghttp2_session_callbacks_new(&g_callbacks) != 0) return -1;
  nghttp2_session_callbacks_set_on_begin_frame_callback(g_callbacks, cb_begin_frame);
  nghttp2_session_callbacks_set_on_begin_headers_callback(g_callbacks, cb_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(g_callbacks, cb_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(g_callbacks, cb_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(g_callbacks, cb_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(g_callbacks, cb_stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(g_callbacks, cb_frame_send);
  nghttp2_session_callbacks_set_on_frame_not_send_callback(g_callbacks, cb_frame_not_send);
  nghttp2_session_callbacks_set_send_data_callback(g_callbacks, cb_send_data);
  return 0;
}

static void module_free(void *m) {
  int i;
  (void)m;
  if (g_callbacks) nghttp2_session_callbacks_del(g_callbacks);
  g_callbacks = NULL;
  for (i = 0; i < NCOMMON; i++) Py_CLEAR(common_bytes[i]);
}

static struct PyModuleDef h2module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway.h2._h2",
    .m_doc = "HTTP/2 connections on libnghttp2 for the gateway's gRPC data path (see _h2.pyi).",
    .m_size = -1,
    .m_free = module_free,
};

static int add_int(PyObject *m, const char *name, long v) { return PyModule_AddIntConstant(m, name, v); }

/* The library features this build uses (module FEATURES), for tests and the startup log. */
static PyObject *features(void) {
  static const char *const names[] = {
#ifdef H2_HAVE_SSIZE2
      "ssize2",
#endif
#ifdef H2_HAVE_MAX_CONTINUATIONS
      "max_continuations",
#endif
#ifdef H2_HAVE_STREAM_RESET_LIMIT
      "stream_reset_rate_limit",
#endif
      NULL,
  };
  Py_ssize_t n = 0, i;
  PyObject *t;
  while (names[n]) n++;
  t = PyTuple_New(n);
  if (!t) return NULL;
  for (i = 0; i < n; i++) {
    PyObject *s = PyUnicode_FromString(names[i]);
    if (!s) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, s);
  }
  return t;
}

PyMODINIT_FUNC PyInit__h2(void) {
  PyObject *m, *dict, *feats;
  if (PyType_Ready(&ConnType) < 0 || PyType_Ready(&ServerType) < 0 || PyType_Ready(&ClientType) < 0) return NULL;
  m = PyModule_Create(&h2module);
  if (!m) return NULL;
  if (common_init() < 0) goto fail;
  if (callbacks_create() < 0) {
    PyErr_NoMemory();
    goto fail;
  }
  dict = Py_BuildValue("{s:i}", "code", 0);
  if (!dict) goto fail;
  H2Error = PyErr_NewExceptionWithDoc(
      "gateway.h2._h2.H2Error",
      "An HTTP/2 connection error; .code is the nghttp2 library error (a negative int).", NULL, dict);
  Py_DECREF(dict);
  if (!H2Error || PyModule_AddObjectRef(m, "H2Error", H2Error) < 0) goto fail;
  if (PyModule_AddObjectRef(m, "Connection", (PyObject *)&ConnType) < 0 ||
      PyModule_AddObjectRef(m, "ServerConnection", (PyObject *)&ServerType) < 0 ||
      PyModule_AddObjectRef(m, "ClientConnection", (PyObject *)&ClientType) < 0)
    goto fail;
  if (add_int(m, "HEAD", EV_HEAD) || add_int(m, "DATA", EV_DATA) || add_int(m, "TRAILERS", EV_TRAILERS) ||
      add_int(m, "CLOSE", EV_CLOSE) || add_int(m, "WRITABLE", EV_WRITABLE) || add_int(m, "GOAWAY", EV_GOAWAY) ||
      add_int(m, "DEAD", EV_DEAD) || add_int(m, "PING_ACK", EV_PING_ACK) || add_int(m, "SETTINGS", EV_SETTINGS))
    goto fail;
  /* HTTP/2 error codes (RFC 9113 section 7) */
  if (add_int(m, "NO_ERROR", NGHTTP2_NO_ERROR) || add_int(m, "PROTOCOL_ERROR", NGHTTP2_PROTOCOL_ERROR) ||
      add_int(m, "INTERNAL_ERROR", NGHTTP2_INTERNAL_ERROR) ||
      add_int(m, "FLOW_CONTROL_ERROR", NGHTTP2_FLOW_CONTROL_ERROR) ||
      add_int(m, "STREAM_CLOSED", NGHTTP2_STREAM_CLOSED) || add_int(m, "REFUSED_STREAM", NGHTTP2_REFUSED_STREAM) ||
      add_int(m, "CANCEL", NGHTTP2_CANCEL) || add_int(m, "ENHANCE_YOUR_CALM", NGHTTP2_ENHANCE_YOUR_CALM))
    goto fail;
  if (PyModule_AddStringConstant(m, "NGHTTP2_VERSION", nghttp2_version(0)->version_str) < 0) goto fail;
  feats = features();
  if (!feats || PyModule_AddObject(m, "FEATURES", feats) < 0) {
    Py_XDECREF(feats);
    goto fail;
  }
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
