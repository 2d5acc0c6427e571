/* SPDX-License-Identifier: MIT */
/*
 * hixl._hixl: the CPython binding of libhixl (docs/python.md).
 *
 * Every Python call is one C call of the library, with argument conversion
 * in C: no ctypes and no per-call Python on the hot path.  The rules this
 * file keeps:
 *
 *  - Lifetimes.  Every object holds a strong reference to the object it
 *    came from (request -> context, remote region -> peer -> context), so a
 *    context is deallocated last.  A closed context (or peer, region) sets
 *    its handle to NULL, and every method checks it first and raises
 *    InvalidError: objects of a closed context raise, never crash.
 *  - Buffers in flight.  An operation with wait=False keeps the local
 *    buffer (a Py_buffer export or a reference to the tensor) and the
 *    atomic's old value in a `pend` record until it completes.  If the
 *    Request is dropped first, its record moves to the context's orphan
 *    list and is finished later (next operation, fence, close): the buffer
 *    stays alive until the library no longer touches it.
 *  - The GIL is released around every call that can block or copy much;
 *    waits are cut into slices of at most SLICE_MS so that Ctrl-C (and a
 *    close from another thread) is noticed within one slice.
 *  - Closing versus other threads.  `busy` counts threads inside the
 *    library without the GIL on a context / peer / remote region; close()
 *    marks the object closed, then waits (GIL released) for busy to drop to
 *    zero before destroying the C handle (hixl.h: a handle must not be used
 *    concurrently with the call that destroys it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <hixl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SLICE_MS 50
/* Copies at least this big are done with the GIL released. */
#define NOGIL_BYTES (256u << 10)

/* ------------------------------------------------------------ exceptions */

static PyObject *Error;          /* hixl.Error: .status */
static PyObject *status_exc[16]; /* index -status */

static const struct {
  int status;
  const char *name;
  const char *doc;
} exc_table[] = {
    {HIXL_ERR_INVALID, "InvalidError", "HIXL_ERR_INVALID: a bad argument, or a closed object"},
    {HIXL_ERR_NOMEM, "NoMemoryError", "HIXL_ERR_NOMEM: out of memory or of a bounded resource"},
    {HIXL_ERR_NOT_REGISTERED, "NotRegisteredError",
     "HIXL_ERR_NOT_REGISTERED: range not inside a registered region, or unknown/stale key"},
    {HIXL_ERR_ACCESS, "AccessError", "HIXL_ERR_ACCESS: the region lacks the right"},
    {HIXL_ERR_UNSUPPORTED, "UnsupportedError", "HIXL_ERR_UNSUPPORTED: the transport cannot"},
    {HIXL_ERR_TIMEOUT, "TimeoutError", "HIXL_ERR_TIMEOUT: the timeout expired"},
    {HIXL_ERR_PEER_LOST, "PeerLostError", "HIXL_ERR_PEER_LOST: the peer died or went away"},
    {HIXL_ERR_TRANSPORT, "TransportError", "HIXL_ERR_TRANSPORT: the transport failed"},
    {HIXL_ERR_AUTH, "AuthError", "HIXL_ERR_AUTH: auth token rejected"},
    {HIXL_ERR_AGAIN, "AgainError", "HIXL_ERR_AGAIN: a bounded queue stayed full; retry"},
    {HIXL_ERR_NO_DEVICE, "NoDeviceError", "HIXL_ERR_NO_DEVICE: no such device or runtime"},
};

static PyObject *builtin_for(int status)
{
  switch (status) {
  case HIXL_ERR_INVALID: return PyExc_ValueError;
  case HIXL_ERR_NOMEM: return PyExc_MemoryError;
  case HIXL_ERR_NOT_REGISTERED: return PyExc_LookupError;
  case HIXL_ERR_ACCESS: return PyExc_PermissionError;
  case HIXL_ERR_UNSUPPORTED: return PyExc_NotImplementedError;
  case HIXL_ERR_TIMEOUT: return PyExc_TimeoutError;
  case HIXL_ERR_PEER_LOST: return PyExc_ConnectionError;
  case HIXL_ERR_TRANSPORT: return PyExc_OSError;
  case HIXL_ERR_AUTH: return PyExc_PermissionError;
  case HIXL_ERR_AGAIN: return PyExc_BlockingIOError;
  case HIXL_ERR_NO_DEVICE: return PyExc_RuntimeError;
  default: return NULL;
  }
}

/* Raise the exception of st with message msg (NULL: hixl_last_error()). */
static PyObject *raise_status(int st, const char *msg)
{
  if (msg == NULL || msg[0] == 0) {
    msg = hixl_last_error();
    if (msg == NULL || msg[0] == 0)
      msg = hixl_strerror((hixl_status_t)st);
  }
  PyObject *cls = (st < 0 && -st < 16 && status_exc[-st]) ? status_exc[-st] : Error;
  PyObject *exc = PyObject_CallFunction(cls, "s", msg);
  if (exc == NULL)
    return NULL;
  PyObject *v = PyLong_FromLong(st);
  if (v == NULL || PyObject_SetAttrString(exc, "status", v) < 0) {
    Py_XDECREF(v);
    Py_DECREF(exc);
    return NULL;
  }
  Py_DECREF(v);
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
  return NULL;
}

static PyObject *raise_fmt(int st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static PyObject *raise_fmt(int st, const char *fmt, ...)
{
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return raise_status(st, buf);
}

/* ------------------------------------------------------------ timing */

static int64_t now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The next wait slice before deadline (ms; -1: none): at most SLICE_MS. */
static int slice_ms(int64_t deadline)
{
  if (deadline < 0)
    return SLICE_MS;
  int64_t left = deadline - now_ms();
  return left < 0 ? 0 : left < SLICE_MS ? (int)left : SLICE_MS;
}

/* timeout (seconds, None = forever) -> ms (-1 = forever); -2 on error. */
static int timeout_arg(PyObject *o, int *ms_p)
{
  if (o == NULL || o == Py_None) {
    *ms_p = -1;
    return 0;
  }
  double s = PyFloat_AsDouble(o);
  if (s == -1.0 && PyErr_Occurred())
    return -1;
  if (s < 0 || s != s) {
    raise_status(HIXL_ERR_INVALID, "timeout must be None or >= 0 seconds");
    return -1;
  }
  *ms_p = s * 1000.0 > 2e9 ? 2000000000 : (int)(s * 1000.0 + 0.5);
  return 0;
}

/* ------------------------------------------------------------ objects */

struct local;
static void local_release(struct local *l);

typedef struct pend {
  hixl_req_t *req;
  Py_buffer view; /* the local buffer, when has_view */
  int has_view;
  PyObject *keep;       /* a tensor or other owner of the local memory */
  uint64_t old;         /* atomics: the library writes the old value here */
  struct local *locals; /* batches given as a sequence: every element's buffer */
  size_t nlocals;
  struct pend *next;
} pend_t;

typedef struct RegionObject RegionObject;

typedef struct {
  PyObject_HEAD hixl_ctx_t *ctx; /* NULL once closed */
  int closing;
  int busy;               /* threads inside the library without the GIL */
  int timeout_ms;         /* the context default (config) */
  PyObject *peers;        /* dict id(hixl_peer_t*) -> Peer (inbound) or weakref (ours) */
  pend_t *orphans;        /* dropped requests still in flight */
  int notif_waiters;      /* threads in hixl_notif_wait without the GIL */
  RegionObject *regions;  /* live regions (intrusive list), for close() */
  struct ReqObject *live; /* unfinished requests (intrusive list), for close() */
  hixl_xfer_t *scratch;   /* batch descriptors, reused under the GIL */
  size_t scratch_cap;
  int scratch_busy;
  PyObject *weakreflist;
} CtxObject;

typedef struct {
  PyObject_HEAD CtxObject *ctx;
  hixl_peer_t *peer; /* NULL once closed */
  int owned;         /* 1: we connected it (close = hixl_disconnect + free) */
  int busy;
  void *id;  /* the handle, kept after close: hash and equality */
  int world; /* 1: a World's peer (the World closes it; borrowed, no reference) */
  PyObject *weakreflist;
} PeerObject;

struct RegionObject {
  PyObject_HEAD CtxObject *ctx;
  hixl_mr_t *mr; /* NULL once closed */
  void *addr;
  size_t len;
  int allocated; /* memory from hixl_mem_alloc */
  int device;    /* -1 for host memory */
  Py_ssize_t exports;
  PyObject *keep; /* the registered object */
  Py_buffer view; /* its export, when has_view */
  int has_view;
  RegionObject *prev, *next;
  PyObject *dict;
  PyObject *weakreflist;
};

typedef struct {
  PyObject_HEAD PeerObject *peer;
  hixl_rmr_t *rmr; /* NULL once released */
  int busy;
} RmrObject;

enum { REQ_PLAIN, REQ_ATOMIC };

typedef struct ReqObject {
  PyObject_HEAD CtxObject *ctx;
  pend_t *p; /* NULL once finished */
  int kind;
  int status;                      /* final status once finished */
  uint64_t old;                    /* final old value (atomics) */
  char *msg;                       /* the error message, captured when the error was seen */
  struct ReqObject *lprev, *lnext; /* the context's unfinished requests */
  int busy; /* threads waiting on it without the GIL: the last one finishes it */
} ReqObject;

typedef struct {
  PyObject_HEAD CtxObject *ctx;
  hixl_world_t *w; /* NULL once closed */
  PyObject *peers; /* list of Peer, index = rank */
  int owns_ctx;    /* created by World(): closed with it */
  int busy;        /* threads in barrier / exchange without the GIL */
} WorldObject;

static PyTypeObject CtxType, PeerType, RegionType, RmrType, ReqType, WorldType;
static PyTypeObject *NotifType;
static PyObject *await_impl; /* hixl._aio.await_request, set at import */

/* ------------------------------------------------------------ guards */

static int ctx_ok(CtxObject *c)
{
  if (c == NULL || c->ctx == NULL || c->closing) {
    raise_status(HIXL_ERR_INVALID, "the hixl context is closed");
    return 0;
  }
  return 1;
}

static int peer_ok(PeerObject *p)
{
  if (!ctx_ok(p->ctx))
    return 0;
  if (p->peer == NULL) {
    raise_status(HIXL_ERR_INVALID, "the peer is closed");
    return 0;
  }
  return 1;
}

static int rmr_ok(RmrObject *r)
{
  if (!peer_ok(r->peer))
    return 0;
  if (r->rmr == NULL) {
    raise_status(HIXL_ERR_INVALID, "the remote region is released");
    return 0;
  }
  return 1;
}

/* Wait, GIL released, until *busy is 0 (other threads leave within a slice). */
static void wait_idle(int *busy)
{
  while (*busy > 0) {
    Py_BEGIN_ALLOW_THREADS usleep(1000);
    Py_END_ALLOW_THREADS
  }
}

/* ------------------------------------------------------------ local buffers */

typedef struct local {
  void *ptr;
  size_t len;
  Py_buffer view;
  int has_view;
  PyObject *keep; /* new reference (tensor), or NULL */
} local_t;

static void local_release(local_t *l)
{
  if (l->has_view) {
    PyBuffer_Release(&l->view);
    l->has_view = 0;
  }
  Py_CLEAR(l->keep);
}

/* An integer in [0, 2**64): int or anything with __index__ (numpy
 * integers).  Never wraps.  May run user code (__index__): callers convert
 * every argument before they look at any handle. */
static int as_u64(PyObject *o, uint64_t *v, const char *what)
{
  PyObject *i = PyNumber_Index(o);
  if (i == NULL) {
    PyErr_Clear();
    raise_fmt(HIXL_ERR_INVALID, "%s must be an integer, not %s", what, Py_TYPE(o)->tp_name);
    return -1;
  }
  unsigned long long x = PyLong_AsUnsignedLongLong(i);
  Py_DECREF(i);
  if (x == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    raise_fmt(HIXL_ERR_INVALID, "%s must be in [0, 2**64)", what);
    return -1;
  }
  *v = x;
  return 0;
}

static int as_u32(PyObject *o, uint32_t *v, const char *what)
{
  uint64_t x;
  if (as_u64(o, &x, what) < 0)
    return -1;
  if (x > UINT32_MAX) {
    raise_fmt(HIXL_ERR_INVALID, "%s must fit in 32 bits", what);
    return -1;
  }
  *v = (uint32_t)x;
  return 0;
}

/* A numpy integer scalar (numpy.uint64, ...): an address, not a buffer of
 * its own 8 bytes. */
static int is_numpy_int_scalar(PyObject *o)
{
  const char *n = Py_TYPE(o)->tp_name;
  return PyIndex_Check(o) && strncmp(n, "numpy.", 6) == 0 && strcmp(n, "numpy.ndarray") != 0;
}

/* A torch tensor (duck-typed: data_ptr, element_size, numel,
 * is_contiguous): its address and size. */
static int tensor_local(PyObject *o, local_t *l)
{
  PyObject *c = PyObject_CallMethod(o, "is_contiguous", NULL);
  if (c == NULL)
    return -1;
  int contig = PyObject_IsTrue(c);
  Py_DECREF(c);
  if (!contig) {
    raise_status(HIXL_ERR_INVALID, "the tensor is not contiguous (call .contiguous())");
    return -1;
  }
  PyObject *p = PyObject_CallMethod(o, "data_ptr", NULL);
  PyObject *es = p ? PyObject_CallMethod(o, "element_size", NULL) : NULL;
  PyObject *n = es ? PyObject_CallMethod(o, "numel", NULL) : NULL;
  int rc = -1;
  uint64_t addr, esz, cnt;
  if (n && as_u64(p, &addr, "data_ptr()") == 0 && as_u64(es, &esz, "element_size()") == 0 &&
      as_u64(n, &cnt, "numel()") == 0) {
    l->ptr = (void *)(uintptr_t)addr;
    l->len = (size_t)(esz * cnt);
    Py_INCREF(o);
    l->keep = o;
    rc = 0;
  }
  Py_XDECREF(p);
  Py_XDECREF(es);
  Py_XDECREF(n);
  return rc;
}

/* Resolve a local buffer argument: an object with the buffer protocol, a
 * torch tensor, an (address, nbytes) tuple, or an integer address (then
 * nbytes is required).  nbytes (-1: whole) may take a prefix.  writable:
 * the operation writes into it (get). */
static int get_local(PyObject *o, Py_ssize_t nbytes, int writable, local_t *l, const char *what)
{
  memset(l, 0, sizeof(*l));
  if (PyLong_Check(o) || is_numpy_int_scalar(o)) {
    uint64_t a;
    if (as_u64(o, &a, what) < 0)
      return -1;
    if (nbytes < 0) {
      raise_fmt(HIXL_ERR_INVALID, "%s is an address: nbytes= is required", what);
      return -1;
    }
    l->ptr = (void *)(uintptr_t)a;
    l->len = (size_t)nbytes;
    return 0;
  }
  if (PyTuple_Check(o)) {
    uint64_t a, n;
    if (PyTuple_GET_SIZE(o) != 2) {
      raise_fmt(HIXL_ERR_INVALID, "%s: a tuple must be (address, nbytes)", what);
      return -1;
    }
    if (as_u64(PyTuple_GET_ITEM(o, 0), &a, "address") < 0 ||
        as_u64(PyTuple_GET_ITEM(o, 1), &n, "nbytes") < 0)
      return -1;
    if (n > (uint64_t)PY_SSIZE_T_MAX) {
      raise_fmt(HIXL_ERR_INVALID, "%s: nbytes %llu is too large", what, (unsigned long long)n);
      return -1;
    }
    l->ptr = (void *)(uintptr_t)a;
    l->len = (size_t)n;
  } else if (PyObject_CheckBuffer(o)) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, &l->view, flags) < 0) {
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      PyObject *s = v ? PyObject_Str(v) : NULL;
      raise_fmt(HIXL_ERR_INVALID, "%s: %s buffer (%s)", what,
                writable ? "needs a writable C-contiguous" : "needs a C-contiguous",
                s ? PyUnicode_AsUTF8(s) : "?");
      Py_XDECREF(s);
      Py_XDECREF(t);
      Py_XDECREF(v);
      Py_XDECREF(tb);
      return -1;
    }
    l->has_view = 1;
    l->ptr = l->view.buf;
    l->len = (size_t)l->view.len;
  } else if (PyObject_HasAttrString(o, "data_ptr")) {
    if (tensor_local(o, l) < 0)
      return -1;
    if (l->len > (size_t)PY_SSIZE_T_MAX) {
      raise_fmt(HIXL_ERR_INVALID, "%s: the tensor's size is too large", what);
      local_release(l);
      return -1;
    }
  } else {
    raise_fmt(HIXL_ERR_INVALID,
              "%s must be a buffer (bytearray, numpy array, memoryview), a torch tensor, "
              "an (address, nbytes) tuple or an address; got %s",
              what, Py_TYPE(o)->tp_name);
    return -1;
  }
  if (nbytes >= 0) {
    if ((size_t)nbytes > l->len) {
      raise_fmt(HIXL_ERR_INVALID, "%s: nbytes=%zd is more than its %zu bytes", what, nbytes,
                l->len);
      local_release(l);
      return -1;
    }
    l->len = (size_t)nbytes;
  }
  return 0;
}

static int nbytes_arg(PyObject *o, Py_ssize_t *n)
{
  if (o == NULL || o == Py_None) {
    *n = -1;
    return 0;
  }
  uint64_t v;
  if (as_u64(o, &v, "nbytes") < 0)
    return -1;
  if (v > (uint64_t)PY_SSIZE_T_MAX) {
    raise_status(HIXL_ERR_INVALID, "nbytes is too large");
    return -1;
  }
  *n = (Py_ssize_t)v;
  return 0;
}

/* ------------------------------------------------------------ requests */

static void pend_free(pend_t *p, int ctx_alive)
{
  if (ctx_alive && p->req)
    hixl_req_free(p->req);
  if (p->has_view)
    PyBuffer_Release(&p->view);
  Py_XDECREF(p->keep);
  for (size_t i = 0; i < p->nlocals; i++)
    local_release(&p->locals[i]);
  PyMem_Free(p->locals);
  PyMem_Free(p);
}

/* Finish orphans that have completed (all of them once the context is
 * gone).  The list is detached first: releasing a buffer may run user code
 * (__del__) that issues operations and so comes back here. */
static void reap_orphans(CtxObject *c)
{
  pend_t *l = c->orphans, *keep = NULL;
  c->orphans = NULL;
  while (l) {
    pend_t *p = l;
    l = p->next;
    if (c->ctx && hixl_req_test(p->req) == HIXL_INPROGRESS) {
      p->next = keep;
      keep = p;
    } else {
      pend_free(p, c->ctx != NULL);
    }
  }
  while (keep) {
    pend_t *p = keep;
    keep = p->next;
    p->next = c->orphans;
    c->orphans = p;
  }
}

/* An operation left in flight by an interrupted wait or a dropped request:
 * its buffer stays held until it completes -- unless the context is gone
 * already (closed from a signal handler during the wait), then nothing
 * will touch the buffer again. */
static void orphan(CtxObject *c, pend_t *p)
{
  if (c->ctx == NULL) {
    pend_free(p, 0);
    return;
  }
  p->next = c->orphans;
  c->orphans = p;
}

/* Wait for req in slices, GIL released, checking signals and the close of
 * the context (or of peer p) between slices.  Returns the status;
 * WAIT_PYERR when a Python exception is set. */
#define WAIT_PYERR (-1000)
static int wait_sliced(CtxObject *c, PeerObject *p, hixl_req_t *req, int timeout_ms)
{
  int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
  for (;;) {
    int slice = slice_ms(deadline);
    hixl_status_t st;
    c->busy++;
    if (p)
      p->busy++;
    Py_BEGIN_ALLOW_THREADS st = hixl_req_wait(req, slice);
    Py_END_ALLOW_THREADS c->busy--;
    if (p)
      p->busy--;
    if (st != HIXL_ERR_TIMEOUT)
      return st;
    if (deadline >= 0 && now_ms() >= deadline)
      return HIXL_ERR_TIMEOUT;
    if (PyErr_CheckSignals() < 0)
      return WAIT_PYERR;
    if (c->closing || c->ctx == NULL) {
      raise_status(HIXL_ERR_INVALID, "the hixl context was closed during the wait");
      return WAIT_PYERR;
    }
    if (p && p->peer == NULL) {
      raise_status(HIXL_ERR_INVALID, "the peer was closed during the wait");
      return WAIT_PYERR;
    }
  }
}

static PyObject *req_new(CtxObject *c, pend_t *p, int kind)
{
  ReqObject *r = PyObject_New(ReqObject, &ReqType);
  if (r == NULL)
    return NULL;
  Py_INCREF(c);
  r->ctx = c;
  r->p = p;
  r->kind = kind;
  r->status = HIXL_INPROGRESS;
  r->old = 0;
  r->msg = NULL;
  r->busy = 0;
  r->lprev = NULL;
  r->lnext = c->live;
  if (c->live)
    c->live->lprev = r;
  c->live = r;
  return (PyObject *)r;
}

static void req_unlink(ReqObject *r)
{
  if (r->lprev)
    r->lprev->lnext = r->lnext;
  else if (r->ctx->live == r)
    r->ctx->live = r->lnext;
  if (r->lnext)
    r->lnext->lprev = r->lprev;
  r->lprev = r->lnext = NULL;
}

/* The request completed with st: keep the result, release the buffer. */
static void req_finish_msg(ReqObject *r, int st, const char *m)
{
  r->status = st;
  if (st < 0 && r->msg == NULL) { /* before anything can run user code */
    size_t n = strlen(m) + 1;
    r->msg = PyMem_Malloc(n);
    if (r->msg)
      memcpy(r->msg, m, n);
  }
  if (r->p) {
    pend_t *p = r->p;
    r->p = NULL;
    r->old = p->old;
    req_unlink(r);
    pend_free(p, r->ctx->ctx != NULL);
  }
}

static void req_finish(ReqObject *r, int st) { req_finish_msg(r, st, hixl_last_error()); }

static PyObject *req_result(ReqObject *r)
{
  if (r->status < 0)
    return raise_status(r->status, r->msg);
  if (r->kind == REQ_ATOMIC)
    return PyLong_FromUnsignedLongLong(r->old);
  Py_RETURN_NONE;
}

static PyObject *Req_done(ReqObject *r, PyObject *unused)
{
  (void)unused;
  if (r->p == NULL)
    Py_RETURN_TRUE;
  if (!ctx_ok(r->ctx))
    return NULL;
  hixl_status_t st = hixl_req_test(r->p->req);
  if (st == HIXL_INPROGRESS)
    Py_RETURN_FALSE;
  if (r->busy == 0) /* else a waiting thread is inside the library with it */
    req_finish(r, st);
  Py_RETURN_TRUE;
}

static PyObject *Req_wait(ReqObject *r, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"timeout", NULL};
  PyObject *to = Py_None;
  int ms;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:wait", kwl, &to) || timeout_arg(to, &ms) < 0)
    return NULL;
  if (r->p) {
    if (!ctx_ok(r->ctx))
      return NULL;
    r->busy++;
    int st = wait_sliced(r->ctx, NULL, r->p->req, ms);
    r->busy--;
    if (st == WAIT_PYERR)
      return NULL;
    if (st == HIXL_ERR_TIMEOUT)
      return raise_fmt(HIXL_ERR_TIMEOUT, "Request.wait: not complete after %d ms", ms);
    if (r->p && r->busy > 0) {
      /* Another thread still waits inside the library on this request: it
       * finishes it; answer from the live record. */
      if (st < 0)
        return raise_status(st, NULL);
      if (r->kind == REQ_ATOMIC)
        return PyLong_FromUnsignedLongLong(r->p->old);
      Py_RETURN_NONE;
    }
    if (r->p)
      req_finish(r, st);
  }
  return req_result(r);
}

static PyObject *Req_result(ReqObject *r, PyObject *unused)
{
  (void)unused;
  PyObject *d = Req_done(r, NULL);
  if (d == NULL)
    return NULL;
  Py_DECREF(d);
  if (r->p)
    return raise_status(HIXL_ERR_AGAIN,
                        "Request.result: the operation has not completed (use wait())");
  return req_result(r);
}

static PyObject *Req_get_status(ReqObject *r, void *unused)
{
  (void)unused;
  return PyLong_FromLong(r->p ? HIXL_INPROGRESS : r->status);
}

static PyObject *Req_await(ReqObject *r)
{
  if (await_impl == NULL)
    return raise_status(HIXL_ERR_UNSUPPORTED, "hixl._aio is not loaded");
  PyObject *coro = PyObject_CallOneArg(await_impl, (PyObject *)r);
  if (coro == NULL)
    return NULL;
  PyObject *it = PyObject_CallMethod(coro, "__await__", NULL);
  Py_DECREF(coro);
  return it;
}

static void Req_dealloc(ReqObject *r)
{
  if (r->p) {
    CtxObject *c = r->ctx;
    pend_t *p = r->p;
    r->p = NULL;
    req_unlink(r);
    if (c->ctx && hixl_req_test(p->req) == HIXL_INPROGRESS)
      orphan(c, p); /* still in flight: the buffer must outlive the operation */
    else
      pend_free(p, c->ctx != NULL);
  }
  PyMem_Free(r->msg);
  Py_XDECREF(r->ctx);
  PyObject_Free(r);
}

static PyMethodDef Req_methods[] = {
    {"done", (PyCFunction)Req_done, METH_NOARGS,
     "done() -> bool: whether the operation has completed (drives progress)."},
    {"wait", (PyCFunction)(void (*)(void))Req_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None): wait (GIL released) and return the result (atomics: the old value);\n"
     "raise the operation's error, or hixl.TimeoutError (the request stays valid)."},
    {"result", (PyCFunction)Req_result, METH_NOARGS,
     "result(): the result of a completed operation (raises AgainError if not complete)."},
    {NULL}};

static PyGetSetDef Req_getset[] = {
    {"status", (getter)Req_get_status, NULL, "hixl status: 1 (in progress), 0 or an error", NULL},
    {NULL}};

static PyAsyncMethods Req_async = {.am_await = (unaryfunc)Req_await};

/* ------------------------------------------------------------ context */

static PyObject *peer_wrap(CtxObject *c, hixl_peer_t *hp, int owned, int world);

static int Ctx_init(CtxObject *self, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"listen",     "transports", "net_dev", "auth_token", "progress_thread",
                        "timeout_ms", "wait",       "metrics", NULL};
  const char *listen = NULL, *transports = NULL, *net_dev = NULL, *token = NULL, *wait = NULL,
             *metrics = NULL;
  PyObject *pt = Py_None, *to = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzzzOOzz:Context", kwl, &listen, &transports,
                                   &net_dev, &token, &pt, &to, &wait, &metrics))
    return -1;
  if (self->ctx || self->peers) { /* peers: it was initialized once (maybe closed since) */
    raise_status(HIXL_ERR_INVALID, "Context.__init__ called twice");
    return -1;
  }
  hixl_config_t cfg;
  hixl_config_init(&cfg);
  if (listen)
    cfg.listen = listen;
  if (transports)
    cfg.transports = transports;
  if (net_dev)
    cfg.net_dev = net_dev;
  if (token)
    cfg.auth_token = token;
  if (metrics)
    cfg.metrics = metrics;
  if (pt != Py_None) {
    uint64_t u;
    if (as_u64(pt, &u, "progress_thread") < 0)
      return -1;
    if (u > 2) {
      raise_status(HIXL_ERR_INVALID, "progress_thread must be 0, 1 or 2");
      return -1;
    }
    cfg.progress_thread = (int)u;
  }
  if (wait) { /* docs/waiting.md */
    if (strcmp(wait, "adaptive") == 0) {
      cfg.wait = HIXL_WAIT_ADAPTIVE;
    } else if (strcmp(wait, "spin") == 0) {
      cfg.wait = HIXL_WAIT_SPIN;
    } else if (strcmp(wait, "sleep") == 0) {
      cfg.wait = HIXL_WAIT_SLEEP;
    } else {
      raise_status(HIXL_ERR_INVALID, "wait must be 'adaptive', 'spin' or 'sleep'");
      return -1;
    }
  }
  if (to != Py_None) {
    long long v = PyLong_AsLongLong(to);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      v = 0;
    }
    if (v < 1 || v > 2000000000) {
      raise_status(HIXL_ERR_INVALID, "timeout_ms must be in [1, 2e9]");
      return -1;
    }
    cfg.timeout_ms = (int)v;
  }
  hixl_ctx_t *ctx;
  hixl_status_t st;
  Py_BEGIN_ALLOW_THREADS st = hixl_ctx_create(&cfg, &ctx);
  Py_END_ALLOW_THREADS if (st != HIXL_OK)
  {
    raise_status(st, NULL);
    return -1;
  }
  self->peers = PyDict_New();
  if (self->peers == NULL) {
    hixl_ctx_destroy(ctx);
    return -1;
  }
  self->ctx = ctx;
  self->timeout_ms = cfg.timeout_ms;
  return 0;
}

/* Close: refuse while a CPU view of an alloc region exists (the memory
 * would go under it), then wait for other threads, destroy, and mark every
 * object closed. */
static int ctx_close(CtxObject *c, int force)
{
  if (c->ctx == NULL)
    return 0;
  if (!force) {
    for (RegionObject *r = c->regions; r; r = r->next)
      if (r->exports > 0) {
        PyErr_Format(PyExc_BufferError,
                     "Context.close: %zd view(s) of a %zu-byte region at %p still exist; "
                     "delete them first",
                     r->exports, r->len, r->addr);
        return -1;
      }
  }
  c->closing = 1;
  wait_idle(&c->busy);
  hixl_ctx_t *ctx = c->ctx;
  c->ctx = NULL;
  Py_BEGIN_ALLOW_THREADS hixl_ctx_destroy(ctx);
  Py_END_ALLOW_THREADS for (RegionObject *r = c->regions; r; r = r->next) r->mr = NULL;
  /* Requests still unfinished: the library is gone, so is their operation. */
  while (c->live)
    req_finish_msg(c->live, HIXL_ERR_INVALID,
                   "the context was closed before the operation completed");
  reap_orphans(c);        /* ctx NULL: frees every record, buffers released */
  if (!c->scratch_busy) { /* else a batch in conversion still holds it: dealloc frees it */
    PyMem_Free(c->scratch);
    c->scratch = NULL;
    c->scratch_cap = 0;
  }
  return 0;
}

static PyObject *Ctx_close(CtxObject *c, PyObject *unused)
{
  (void)unused;
  if (ctx_close(c, 0) < 0)
    return NULL;
  Py_RETURN_NONE;
}

static void Ctx_dealloc(CtxObject *c)
{
  /* Every region and request holds a reference to us: none is alive, so
   * no view exists either. */
  ctx_close(c, 1);
  PyMem_Free(c->scratch);
  if (c->weakreflist)
    PyObject_ClearWeakRefs((PyObject *)c);
  Py_XDECREF(c->peers);
  Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *Ctx_enter(CtxObject *c, PyObject *unused)
{
  (void)unused;
  if (!ctx_ok(c))
    return NULL;
  Py_INCREF(c);
  return (PyObject *)c;
}

static PyObject *Ctx_exit(CtxObject *c, PyObject *args)
{
  /* Leaving the block by an exception while views of its memory live (the
   * traceback often holds them): do not replace the user's error with a
   * BufferError; the context is destroyed with its last view instead. */
  int raising = PyTuple_GET_SIZE(args) > 0 && PyTuple_GET_ITEM(args, 0) != Py_None;
  if (ctx_close(c, 0) < 0) {
    if (!raising || !PyErr_ExceptionMatches(PyExc_BufferError))
      return NULL;
    PyErr_Clear();
  }
  Py_RETURN_FALSE;
}

static PyObject *Ctx_get_address(CtxObject *c, void *u)
{
  (void)u;
  if (!ctx_ok(c))
    return NULL;
  return PyUnicode_FromString(hixl_ctx_address(c->ctx));
}

static PyObject *Ctx_get_transports(CtxObject *c, void *u)
{
  (void)u;
  if (!ctx_ok(c))
    return NULL;
  PyObject *s = PyUnicode_FromString(hixl_ctx_transports(c->ctx));
  if (s == NULL)
    return NULL;
  PyObject *sep = PyUnicode_FromString(",");
  PyObject *l = sep ? PyUnicode_Split(s, sep, -1) : NULL;
  Py_DECREF(s);
  Py_XDECREF(sep);
  if (l == NULL)
    return NULL;
  PyObject *t = PyList_AsTuple(l);
  Py_DECREF(l);
  return t;
}

static PyObject *Ctx_get_closed(CtxObject *c, void *u)
{
  (void)u;
  return PyBool_FromLong(c->ctx == NULL);
}

static PyObject *Ctx_get_timeout(CtxObject *c, void *u)
{
  (void)u;
  return PyLong_FromLong(c->timeout_ms);
}

/* connect(addr, timeout=None): the context default when None. */
static PyObject *Ctx_connect(CtxObject *c, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"addr", "timeout", NULL};
  const char *addr;
  PyObject *to = Py_None;
  int ms;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:connect", kwl, &addr, &to) ||
      timeout_arg(to, &ms) < 0 || !ctx_ok(c))
    return NULL;
  if (to == Py_None)
    ms = c->timeout_ms;
  hixl_peer_t *p;
  hixl_status_t st;
  hixl_ctx_t *hc = c->ctx;
  c->busy++;
  Py_BEGIN_ALLOW_THREADS st = hixl_connect(hc, addr, ms, &p);
  Py_END_ALLOW_THREADS c->busy--;
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  return peer_wrap(c, p, 1, 0);
}

static RegionObject *region_new(CtxObject *c)
{
  RegionObject *r = (RegionObject *)RegionType.tp_alloc(&RegionType, 0);
  if (r == NULL)
    return NULL;
  Py_INCREF(c);
  r->ctx = c;
  r->device = -1;
  r->next = c->regions;
  if (c->regions)
    c->regions->prev = r;
  c->regions = r;
  return r;
}

static int access_arg(PyObject *o, unsigned *a)
{
  if (o == NULL) {
    *a = HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC;
    return 0;
  }
  long v = PyLong_AsLong(o);
  if (v == -1 && PyErr_Occurred())
    return -1;
  if (v < 0 || v > 7) {
    raise_fmt(HIXL_ERR_INVALID, "access=%ld: use hixl.READ | hixl.WRITE | hixl.ATOMIC", v);
    return -1;
  }
  *a = (unsigned)v;
  return 0;
}

/* register(obj, nbytes=None, *, access=ALL, device=None) */
static PyObject *Ctx_register(CtxObject *c, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"obj", "nbytes", "access", "device", NULL};
  PyObject *obj, *nb = Py_None, *acc = NULL, *dev = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$OO:register", kwl, &obj, &nb, &acc, &dev))
    return NULL;
  unsigned access;
  Py_ssize_t n;
  if (access_arg(acc, &access) < 0 || nbytes_arg(nb, &n) < 0 || !ctx_ok(c))
    return NULL;
  int device = -1;
  if (dev != Py_None) {
    long d = PyLong_AsLong(dev);
    if (d == -1 && PyErr_Occurred())
      return NULL;
    if (d < 0 || d > 1 << 20)
      return raise_fmt(HIXL_ERR_INVALID, "device=%ld is not a device number", d);
    device = (int)d;
  }
  local_t l;
  int writable = (access & (HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC)) != 0;
  if (get_local(obj, n, writable, &l, "register: obj") < 0)
    return NULL;
  hixl_mr_t *mr;
  hixl_status_t st;
  c->busy++;
  Py_BEGIN_ALLOW_THREADS st = device >= 0
                                  ? hixl_mr_reg_device(c->ctx, l.ptr, l.len, device, access, &mr)
                                  : hixl_mr_reg(c->ctx, l.ptr, l.len, access, &mr);
  Py_END_ALLOW_THREADS c->busy--;
  if (st != HIXL_OK) {
    local_release(&l);
    return raise_status(st, NULL);
  }
  RegionObject *r = region_new(c);
  if (r == NULL) {
    hixl_mr_dereg(mr);
    local_release(&l);
    return NULL;
  }
  r->mr = mr;
  r->addr = l.ptr;
  r->len = l.len;
  if (device < 0) {
    hixl_mem_kind_t kind;
    int d = -1;
    if (hixl_mem_query(l.ptr, &kind, &d) == HIXL_OK && kind == HIXL_MEM_DEVICE)
      device = d;
  }
  r->device = device;
  if (l.has_view) {
    r->view = l.view; /* the region holds the export: a bytearray cannot resize */
    r->has_view = 1;
  }
  if (l.keep)
    r->keep = l.keep;
  else if (!PyLong_Check(obj) && !PyTuple_Check(obj)) {
    Py_INCREF(obj);
    r->keep = obj;
  }
  return (PyObject *)r;
}

/* alloc(nbytes, *, device=False, access=ALL) */
static PyObject *Ctx_alloc(CtxObject *c, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"nbytes", "device", "access", NULL};
  Py_ssize_t n;
  int device = 0;
  PyObject *acc = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "n|$pO:alloc", kwl, &n, &device, &acc))
    return NULL;
  unsigned access;
  if (access_arg(acc, &access) < 0 || !ctx_ok(c))
    return NULL;
  if (n <= 0)
    return raise_status(HIXL_ERR_INVALID, "alloc: nbytes must be > 0");
  void *addr;
  hixl_mr_t *mr;
  hixl_status_t st;
  c->busy++;
  Py_BEGIN_ALLOW_THREADS st = hixl_mem_alloc(
      c->ctx, (size_t)n, device ? HIXL_MEM_DEVICE : HIXL_MEM_HOST, access, &addr, &mr);
  Py_END_ALLOW_THREADS c->busy--;
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  RegionObject *r = region_new(c);
  if (r == NULL) {
    hixl_mr_dereg(mr);
    return NULL;
  }
  r->mr = mr;
  r->addr = addr;
  r->len = (size_t)n;
  r->allocated = 1;
  if (device) {
    hixl_mem_kind_t kind;
    int d = 0;
    r->device = hixl_mem_query(addr, &kind, &d) == HIXL_OK ? d : 0;
  }
  return (PyObject *)r;
}

/* fence(peer=None, timeout=None) in slices: a fence covers everything
 * issued before its call, so repeating it after a timed-out slice covers
 * at least the same operations. */
static PyObject *Ctx_fence(CtxObject *c, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"peer", "timeout", NULL};
  PyObject *po = Py_None, *to = Py_None;
  int ms;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:fence", kwl, &po, &to) ||
      timeout_arg(to, &ms) < 0 || !ctx_ok(c))
    return NULL;
  PeerObject *p = NULL;
  if (po != Py_None) {
    if (!PyObject_TypeCheck(po, &PeerType))
      return raise_status(HIXL_ERR_INVALID, "fence: peer must be a hixl.Peer or None");
    p = (PeerObject *)po;
    if (!peer_ok(p))
      return NULL;
  }
  int64_t deadline = ms < 0 ? -1 : now_ms() + ms;
  for (;;) {
    int slice = slice_ms(deadline);
    hixl_status_t st;
    hixl_ctx_t *hc = c->ctx;
    hixl_peer_t *hp = p ? p->peer : NULL; /* checked alive just before */
    c->busy++;
    if (p)
      p->busy++;
    Py_BEGIN_ALLOW_THREADS st = hixl_fence(hc, hp, slice);
    Py_END_ALLOW_THREADS c->busy--;
    if (p)
      p->busy--;
    if (st == HIXL_OK) {
      if (c->orphans)
        reap_orphans(c);
      Py_RETURN_NONE;
    }
    if (st != HIXL_ERR_TIMEOUT || (deadline >= 0 && now_ms() >= deadline))
      return raise_status(st, NULL);
    if (PyErr_CheckSignals() < 0)
      return NULL;
    if (!ctx_ok(c) || (p && !peer_ok(p)))
      return NULL;
  }
}

static PyObject *Ctx_progress(CtxObject *c, PyObject *unused)
{
  (void)unused;
  if (!ctx_ok(c))
    return NULL;
  int n = hixl_progress(c->ctx);
  if (n < 0)
    return raise_status(n, NULL);
  if (c->orphans)
    reap_orphans(c);
  return PyLong_FromLong(n);
}

/* The Peer object of a notification's hixl_peer_t (created on first sight
 * for peers that connected to us). */
static PyObject *peer_lookup(CtxObject *c, hixl_peer_t *hp)
{
  PyObject *key = PyLong_FromVoidPtr(hp);
  if (key == NULL)
    return NULL;
  PyObject *v = PyDict_GetItemWithError(c->peers, key);
  Py_DECREF(key);
  if (v == NULL && PyErr_Occurred())
    return NULL;
  if (v && PyWeakref_Check(v))
    v = PyWeakref_GetObject(v);
  if (v && v != Py_None) {
    Py_INCREF(v);
    return v;
  }
  return peer_wrap(c, hp, 0, 0);
}

/* A notification's peer that has no Peer yet and is closed already: one
 * a close on another thread was releasing while this thread took the
 * notification without the GIL.  Its handle may be freed a grace later,
 * so it gets a Peer that is closed from the start, kept out of the cache
 * (the address may come back as another peer's). */
static PyObject *notif_peer(CtxObject *c, hixl_peer_t *hp)
{
  PyObject *key = PyLong_FromVoidPtr(hp);
  if (key == NULL)
    return NULL;
  int known = PyDict_Contains(c->peers, key);
  Py_DECREF(key);
  if (known < 0)
    return NULL;
  const char *tn = hixl_peer_transport(hp);
  if (known || tn == NULL || strcmp(tn, "closed") != 0)
    return peer_lookup(c, hp);
  PeerObject *p = PyObject_New(PeerObject, &PeerType);
  if (p == NULL)
    return NULL;
  Py_INCREF(c);
  p->ctx = c;
  p->peer = NULL;
  p->owned = 0;
  p->busy = 0;
  p->world = 0;
  p->id = hp;
  p->weakreflist = NULL;
  return (PyObject *)p;
}

static PyObject *notif_new(CtxObject *c, const hixl_notif_t *n)
{
  PyObject *t = PyStructSequence_New(NotifType);
  if (t == NULL)
    return NULL;
  PyObject *p = notif_peer(c, n->peer);
  PyObject *imm = PyLong_FromUnsignedLong(n->imm);
  PyObject *len = PyLong_FromSize_t(n->len);
  if (p == NULL || imm == NULL || len == NULL) {
    Py_XDECREF(p);
    Py_XDECREF(imm);
    Py_XDECREF(len);
    Py_DECREF(t);
    return NULL;
  }
  PyStructSequence_SET_ITEM(t, 0, p);
  PyStructSequence_SET_ITEM(t, 1, imm);
  PyStructSequence_SET_ITEM(t, 2, len);
  return t;
}

static PyObject *Ctx_poll(CtxObject *c, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"max", NULL};
  int max = 64;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|i:poll", kwl, &max) || !ctx_ok(c))
    return NULL;
  if (max < 1 || max > 65536)
    return raise_status(HIXL_ERR_INVALID, "poll: max must be in [1, 65536]");
  hixl_notif_t stackbuf[64], *out = stackbuf;
  if (max > 64 && (out = PyMem_Malloc(sizeof(*out) * (size_t)max)) == NULL)
    return PyErr_NoMemory();
  int n = hixl_notif_poll(c->ctx, out, max);
  PyObject *l = NULL;
  if (n < 0) {
    raise_status(n, NULL);
  } else if ((l = PyList_New(n)) != NULL) {
    for (int i = 0; i < n; i++) {
      PyObject *t = notif_new(c, &out[i]);
      if (t == NULL) {
        Py_CLEAR(l);
        break;
      }
      PyList_SET_ITEM(l, i, t);
    }
  }
  if (out != stackbuf)
    PyMem_Free(out);
  return l;
}

static PyObject *Ctx_wait(CtxObject *c, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"timeout", NULL};
  PyObject *to = Py_None;
  int ms;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:wait", kwl, &to) || timeout_arg(to, &ms) < 0 ||
      !ctx_ok(c))
    return NULL;
  int64_t deadline = ms < 0 ? -1 : now_ms() + ms;
  for (;;) {
    int slice = slice_ms(deadline);
    hixl_notif_t n;
    hixl_status_t st;
    if (slice == 0) {
      st = hixl_notif_wait(c->ctx, &n, 0); /* no GIL dance for a poll */
    } else {
      c->busy++;
      c->notif_waiters++; /* it may take a peer's handle: peer_close frees none meanwhile */
      Py_BEGIN_ALLOW_THREADS st = hixl_notif_wait(c->ctx, &n, slice);
      Py_END_ALLOW_THREADS c->busy--;
    }
    if (st == HIXL_OK) {
      PyObject *r = notif_new(c, &n); /* before a close may free its peer */
      if (slice != 0)
        c->notif_waiters--;
      return r;
    }
    if (slice != 0)
      c->notif_waiters--;
    if (st != HIXL_ERR_TIMEOUT)
      return raise_status(st, NULL);
    if (deadline >= 0 && now_ms() >= deadline)
      return raise_fmt(HIXL_ERR_TIMEOUT, "Context.wait: no notification within %d ms", ms);
    if (PyErr_CheckSignals() < 0 || !ctx_ok(c))
      return NULL;
  }
}

/* hixl_ctx_stats as a dict {name: value}, in the library's order. */
static PyObject *stats_dict(hixl_ctx_t *ctx, hixl_peer_t *peer)
{
  hixl_stat_t st[256];
  size_t n = sizeof(st) / sizeof(st[0]);
  int rc = hixl_ctx_stats(ctx, peer, st, &n);
  if (rc != HIXL_OK)
    return raise_status(rc, hixl_last_error());
  if (n > sizeof(st) / sizeof(st[0]))
    n = sizeof(st) / sizeof(st[0]);
  PyObject *d = PyDict_New();
  for (size_t i = 0; d && i < n; i++) {
    PyObject *v = PyLong_FromUnsignedLongLong(st[i].value);
    if (v == NULL || PyDict_SetItemString(d, st[i].name, v) != 0)
      Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}

static PyObject *Ctx_stats(CtxObject *c, PyObject *u)
{
  (void)u;
  if (!ctx_ok(c))
    return NULL;
  return stats_dict(c->ctx, NULL);
}

static PyMethodDef Ctx_methods[] = {
    {"close", (PyCFunction)Ctx_close, METH_NOARGS,
     "close(): destroy the context (idempotent); BufferError while views of its memory exist."},
    {"__enter__", (PyCFunction)Ctx_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Ctx_exit, METH_VARARGS, NULL},
    {"connect", (PyCFunction)(void (*)(void))Ctx_connect, METH_VARARGS | METH_KEYWORDS,
     "connect(addr, timeout=None) -> Peer"},
    {"register", (PyCFunction)(void (*)(void))Ctx_register, METH_VARARGS | METH_KEYWORDS,
     "register(obj, nbytes=None, *, access=ALL, device=None) -> Region"},
    {"alloc", (PyCFunction)(void (*)(void))Ctx_alloc, METH_VARARGS | METH_KEYWORDS,
     "alloc(nbytes, *, device=False, access=ALL) -> Region (hixl_mem_alloc)"},
    {"fence", (PyCFunction)(void (*)(void))Ctx_fence, METH_VARARGS | METH_KEYWORDS,
     "fence(peer=None, timeout=None): everything issued before has completed"},
    {"progress", (PyCFunction)Ctx_progress, METH_NOARGS, "progress() -> int"},
    {"poll", (PyCFunction)(void (*)(void))Ctx_poll, METH_VARARGS | METH_KEYWORDS,
     "poll(max=64) -> list of Notification"},
    {"wait", (PyCFunction)(void (*)(void))Ctx_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None) -> Notification (raises hixl.TimeoutError)"},
    {"stats", (PyCFunction)Ctx_stats, METH_NOARGS,
     "stats() -> dict: the context's counters by name (hixl_ctx_stats, docs/observability.md)"},
    {NULL}};

static PyGetSetDef Ctx_getset[] = {
    {"address", (getter)Ctx_get_address, NULL, "\"host:port\" that peers connect to", NULL},
    {"transports", (getter)Ctx_get_transports, NULL, "the usable transports, in order", NULL},
    {"closed", (getter)Ctx_get_closed, NULL, "whether close() was called", NULL},
    {"timeout_ms", (getter)Ctx_get_timeout, NULL, "the default timeout (config)", NULL},
    {NULL}};

/* ------------------------------------------------------------ region */

static int region_close(RegionObject *r)
{
  if (r->exports > 0) {
    PyErr_Format(PyExc_BufferError,
                 "Region.close: %zd view(s) of this region still exist; delete them first",
                 r->exports);
    return -1;
  }
  if (r->mr && r->ctx->ctx) {
    hixl_mr_t *mr = r->mr;
    r->mr = NULL;
    hixl_status_t st;
    CtxObject *c = r->ctx;
    c->busy++;
    Py_BEGIN_ALLOW_THREADS st = hixl_mr_dereg(mr);
    Py_END_ALLOW_THREADS c->busy--;
    (void)st;
  }
  r->mr = NULL;
  if (r->has_view) {
    PyBuffer_Release(&r->view);
    r->has_view = 0;
  }
  Py_CLEAR(r->keep);
  return 0;
}

static int region_ok(RegionObject *r)
{
  if (!ctx_ok(r->ctx))
    return 0;
  if (r->mr == NULL) {
    raise_status(HIXL_ERR_INVALID, "the region is closed");
    return 0;
  }
  return 1;
}

static PyObject *Region_close(RegionObject *r, PyObject *u)
{
  (void)u;
  if (region_close(r) < 0)
    return NULL;
  Py_RETURN_NONE;
}

static void Region_dealloc(RegionObject *r)
{
  PyObject_GC_UnTrack(r);
  r->exports = 0;
  region_close(r);
  if (r->prev)
    r->prev->next = r->next;
  else if (r->ctx && r->ctx->regions == r)
    r->ctx->regions = r->next;
  if (r->next)
    r->next->prev = r->prev;
  if (r->weakreflist)
    PyObject_ClearWeakRefs((PyObject *)r);
  Py_CLEAR(r->dict);
  Py_CLEAR(r->ctx);
  Py_TYPE(r)->tp_free((PyObject *)r);
}

static int Region_traverse(RegionObject *r, visitproc visit, void *arg)
{
  Py_VISIT(r->dict);
  Py_VISIT(r->keep);
  Py_VISIT(r->ctx);
  return 0;
}

static int Region_clear(RegionObject *r)
{
  Py_CLEAR(r->dict);
  return 0;
}

static PyObject *Region_pack(RegionObject *r, PyObject *u)
{
  (void)u;
  if (!region_ok(r))
    return NULL;
  uint8_t buf[HIXL_RKEY_MAX];
  size_t len = sizeof(buf);
  hixl_status_t st = hixl_mr_pack(r->mr, buf, &len);
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  return PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
}

static PyObject *Region_publish(RegionObject *r, PyObject *args)
{
  const char *name;
  if (!PyArg_ParseTuple(args, "s:publish", &name) || !region_ok(r))
    return NULL;
  hixl_status_t st = hixl_mr_publish(r->mr, name);
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  Py_RETURN_NONE;
}

static int Region_getbuffer(RegionObject *r, Py_buffer *view, int flags)
{
  if (!region_ok(r))
    return -1;
  if (r->device >= 0) {
    PyErr_SetString(PyExc_BufferError,
                    "a device region has no CPU view; use hixl.mem_copy to move its bytes");
    return -1;
  }
  /* A registration of a read-only buffer (bytes, a read-only array or
   * mmap) gives read-only views. */
  int readonly = r->has_view ? r->view.readonly : 0;
  if (PyBuffer_FillInfo(view, (PyObject *)r, r->addr, (Py_ssize_t)r->len, readonly, flags) < 0)
    return -1;
  r->exports++;
  return 0;
}

static void Region_releasebuffer(RegionObject *r, Py_buffer *view)
{
  (void)view;
  r->exports--;
}

static PyBufferProcs Region_as_buffer = {(getbufferproc)Region_getbuffer,
                                         (releasebufferproc)Region_releasebuffer};

static PyObject *Region_get_address(RegionObject *r, void *u)
{
  (void)u;
  return PyLong_FromVoidPtr(r->addr);
}
static PyObject *Region_get_nbytes(RegionObject *r, void *u)
{
  (void)u;
  return PyLong_FromSize_t(r->len);
}
static PyObject *Region_get_device(RegionObject *r, void *u)
{
  (void)u;
  return PyLong_FromLong(r->device);
}
static PyObject *Region_get_is_device(RegionObject *r, void *u)
{
  (void)u;
  return PyBool_FromLong(r->device >= 0);
}
static PyObject *Region_get_closed(RegionObject *r, void *u)
{
  (void)u;
  return PyBool_FromLong(r->mr == NULL);
}
static PyObject *Region_get_obj(RegionObject *r, void *u)
{
  (void)u;
  PyObject *o = r->keep ? r->keep : Py_None;
  Py_INCREF(o);
  return o;
}

/* numpy(dtype="u1", shape=None): numpy.frombuffer over the region; the
 * array's base holds an export, so close() refuses while it lives. */
static PyObject *Region_numpy(RegionObject *r, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"dtype", "shape", NULL};
  PyObject *dtype = NULL, *shape = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:numpy", kwl, &dtype, &shape) || !region_ok(r))
    return NULL;
  PyObject *np = PyImport_ImportModule("numpy");
  if (np == NULL)
    return NULL;
  PyObject *fb = PyObject_GetAttrString(np, "frombuffer");
  PyObject *dt = dtype ? (Py_INCREF(dtype), dtype) : PyObject_GetAttrString(np, "uint8");
  PyObject *a = NULL;
  if (fb && dt) {
    PyObject *kwd = Py_BuildValue("{s:O}", "dtype", dt);
    PyObject *targs = PyTuple_Pack(1, (PyObject *)r);
    if (kwd && targs)
      a = PyObject_Call(fb, targs, kwd);
    Py_XDECREF(kwd);
    Py_XDECREF(targs);
  }
  Py_XDECREF(fb);
  Py_XDECREF(dt);
  Py_DECREF(np);
  if (a && shape != Py_None) {
    PyObject *b = PyObject_CallMethod(a, "reshape", "(O)", shape);
    Py_DECREF(a);
    a = b;
  }
  return a;
}

/* torch(dtype=torch.uint8, shape=None): torch.from_numpy of the uint8 view,
 * reinterpreted: the tensor keeps the numpy array, which keeps the export. */
static PyObject *Region_torch(RegionObject *r, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"dtype", "shape", NULL};
  PyObject *dtype = Py_None, *shape = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:torch", kwl, &dtype, &shape) || !region_ok(r))
    return NULL;
  PyObject *torch = PyImport_ImportModule("torch");
  if (torch == NULL)
    return NULL;
  PyObject *noargs = PyTuple_New(0);
  PyObject *a = noargs ? Region_numpy(r, noargs, NULL) : NULL, *t = NULL;
  Py_XDECREF(noargs);
  if (a) {
    t = PyObject_CallMethod(torch, "from_numpy", "(O)", a);
    Py_DECREF(a);
  }
  Py_DECREF(torch);
  if (t && dtype != Py_None) {
    PyObject *v = PyObject_CallMethod(t, "view", "(O)", dtype);
    Py_DECREF(t);
    t = v;
  }
  if (t && shape != Py_None) {
    PyObject *v = PyObject_CallMethod(t, "reshape", "(O)", shape);
    Py_DECREF(t);
    t = v;
  }
  return t;
}

static Py_ssize_t Region_len(RegionObject *r) { return (Py_ssize_t)r->len; }

static PySequenceMethods Region_as_sequence = {.sq_length = (lenfunc)Region_len};

static PyMethodDef Region_methods[] = {
    {"close", (PyCFunction)Region_close, METH_NOARGS,
     "close(): deregister (alloc memory is freed); BufferError while views exist."},
    {"pack", (PyCFunction)Region_pack, METH_NOARGS, "pack() -> bytes (the remote key blob)"},
    {"publish", (PyCFunction)Region_publish, METH_VARARGS,
     "publish(name): peers find it with Peer.lookup(name)"},
    {"numpy", (PyCFunction)(void (*)(void))Region_numpy, METH_VARARGS | METH_KEYWORDS,
     "numpy(dtype=numpy.uint8, shape=None): a numpy view (no copy)"},
    {"torch", (PyCFunction)(void (*)(void))Region_torch, METH_VARARGS | METH_KEYWORDS,
     "torch(dtype=torch.uint8, shape=None): a torch view (no copy)"},
    {NULL}};

static PyGetSetDef Region_getset[] = {
    {"address", (getter)Region_get_address, NULL, "address of byte 0", NULL},
    {"nbytes", (getter)Region_get_nbytes, NULL, "length in bytes", NULL},
    {"device", (getter)Region_get_device, NULL, "device number, -1 for host memory", NULL},
    {"is_device", (getter)Region_get_is_device, NULL, "whether it is device memory", NULL},
    {"closed", (getter)Region_get_closed, NULL, "whether it is closed", NULL},
    {"obj", (getter)Region_get_obj, NULL, "the registered object (None for alloc)", NULL},
    {NULL}};

/* ------------------------------------------------------------ peer */

static PyObject *peer_wrap(CtxObject *c, hixl_peer_t *hp, int owned, int world)
{
  PeerObject *p = PyObject_New(PeerObject, &PeerType);
  if (p == NULL) {
    if (owned)
      hixl_disconnect(hp);
    return NULL;
  }
  Py_INCREF(c);
  p->ctx = c;
  p->peer = hp;
  p->owned = owned;
  p->busy = 0;
  p->world = world;
  p->id = hp;
  p->weakreflist = NULL;
  /* The cache holds weak references (no cycle through the context);
   * Peers compare equal by handle, so a re-created one is the same peer. */
  PyObject *key = PyLong_FromVoidPtr(hp);
  PyObject *val = key ? PyWeakref_NewRef((PyObject *)p, NULL) : NULL;
  if (val == NULL || PyDict_SetItem(c->peers, key, val) < 0) {
    Py_XDECREF(key);
    Py_XDECREF(val);
    Py_DECREF(p);
    return NULL;
  }
  Py_DECREF(key);
  Py_DECREF(val);
  return (PyObject *)p;
}

static void peer_close(PeerObject *p)
{
  if (p->peer == NULL)
    return;
  hixl_peer_t *hp = p->peer;
  p->peer = NULL; /* new calls raise from here on */
  wait_idle(&p->busy);
  CtxObject *c = p->ctx;
  int released = 0;
  if (c->ctx && !p->world) {
    /* Freed (hixl_peer_release) when nothing of ours can still name the
     * handle: no Rmr of it (each holds this object, so release refuses),
     * no unfinished request of the context, live or dropped (a request's
     * error names its peer), and no thread in a notification wait that
     * may have taken it without the GIL.  Otherwise only disconnected;
     * the context keeps the handle. */
    if (c->orphans)
      reap_orphans(c);
    int can_free = c->live == NULL && c->orphans == NULL && c->notif_waiters == 0;
    c->busy++;
    Py_BEGIN_ALLOW_THREADS if (can_free) released = hixl_peer_release(hp) == HIXL_OK;
    if (!released)
      hixl_disconnect(hp);
    Py_END_ALLOW_THREADS c->busy--;
  }
  /* A freed handle's address may come back as another peer's. */
  if (c->peers && (p->owned || released)) {
    PyObject *key = PyLong_FromVoidPtr(hp);
    if (key && PyDict_DelItem(c->peers, key) < 0)
      PyErr_Clear();
    Py_XDECREF(key);
  }
}

static PyObject *Peer_close(PeerObject *p, PyObject *u)
{
  (void)u;
  if (p->world && p->peer)
    return raise_status(HIXL_ERR_INVALID,
                        "Peer.close: this peer belongs to a World; close the World");
  peer_close(p);
  Py_RETURN_NONE;
}

static void Peer_dealloc(PeerObject *p)
{
  /* Only our own connections are closed with their object; a peer that
   * connected to us belongs to the context (hixl_disconnect keeps it). */
  if (p->owned && !p->world)
    peer_close(p);
  if (p->weakreflist)
    PyObject_ClearWeakRefs((PyObject *)p);
  Py_XDECREF(p->ctx);
  PyObject_Free(p);
}

static PyObject *Peer_get_transport(PeerObject *p, void *u)
{
  (void)u;
  if (p->peer == NULL || p->ctx->ctx == NULL)
    return PyUnicode_FromString("closed");
  return PyUnicode_FromString(hixl_peer_transport(p->peer));
}

static PyObject *Peer_get_closed(PeerObject *p, void *u)
{
  (void)u;
  return PyBool_FromLong(p->peer == NULL || p->ctx->ctx == NULL);
}

static PyObject *Peer_get_context(PeerObject *p, void *u)
{
  (void)u;
  Py_INCREF(p->ctx);
  return (PyObject *)p->ctx;
}

static PyObject *rmr_wrap(PeerObject *p, hixl_rmr_t *rmr)
{
  RmrObject *r = PyObject_New(RmrObject, &RmrType);
  if (r == NULL) {
    hixl_rmr_release(rmr);
    return NULL;
  }
  Py_INCREF(p);
  r->peer = p;
  r->rmr = rmr;
  r->busy = 0;
  return (PyObject *)r;
}

static PyObject *Peer_lookup(PeerObject *p, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"name", "timeout", NULL};
  const char *name;
  PyObject *to = Py_None;
  int ms;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:lookup", kwl, &name, &to) ||
      timeout_arg(to, &ms) < 0 || !peer_ok(p))
    return NULL;
  if (to == Py_None)
    ms = p->ctx->timeout_ms;
  /* In slices: NOT_REGISTERED only means "not published yet" until the
   * whole timeout has passed. */
  CtxObject *c = p->ctx;
  int64_t deadline = now_ms() + ms;
  for (;;) {
    int slice = slice_ms(deadline);
    hixl_rmr_t *rmr;
    hixl_status_t st;
    hixl_peer_t *hp = p->peer;
    c->busy++;
    p->busy++;
    Py_BEGIN_ALLOW_THREADS st = hixl_rmr_lookup(hp, name, slice, &rmr);
    Py_END_ALLOW_THREADS c->busy--;
    p->busy--;
    if (st == HIXL_OK)
      return rmr_wrap(p, rmr);
    if ((st != HIXL_ERR_NOT_REGISTERED && st != HIXL_ERR_TIMEOUT) || now_ms() >= deadline)
      return raise_status(st, NULL);
    if (PyErr_CheckSignals() < 0 || !peer_ok(p))
      return NULL;
  }
}

static PyObject *Peer_unpack(PeerObject *p, PyObject *args)
{
  Py_buffer b;
  if (!PyArg_ParseTuple(args, "y*:unpack", &b))
    return NULL;
  if (!peer_ok(p)) {
    PyBuffer_Release(&b);
    return NULL;
  }
  hixl_rmr_t *rmr;
  hixl_status_t st;
  CtxObject *c = p->ctx;
  hixl_peer_t *hp = p->peer;
  c->busy++;
  p->busy++;
  Py_BEGIN_ALLOW_THREADS st = hixl_rmr_unpack(hp, b.buf, (size_t)b.len, &rmr);
  Py_END_ALLOW_THREADS c->busy--;
  p->busy--;
  PyBuffer_Release(&b);
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  return rmr_wrap(p, rmr);
}

/* Common tail of every operation, issued with *req.  pend (may be NULL
 * for wait=True non-atomics) holds what must outlive the operation: the
 * local buffer l (moved into it), the atomic's old value.  wait: block
 * (GIL released, in slices) and return the result; a wait interrupted by
 * Ctrl-C leaves the operation running and its record in the orphan list.
 * Else: hand the record to a new Request. */
static PyObject *op_finish(PeerObject *p, hixl_req_t *req, local_t *l, int kind, int wait,
                           pend_t *pend)
{
  CtxObject *c = p->ctx;
  if (wait) {
    hixl_status_t st = hixl_req_test(req);
    if (st == HIXL_INPROGRESS) {
      int w = wait_sliced(c, p, req, -1);
      if (w == WAIT_PYERR) {
        if (pend == NULL && (pend = PyMem_Calloc(1, sizeof(*pend))) == NULL) {
          /* No memory for the record: finish here, uninterruptibly. */
          Py_BEGIN_ALLOW_THREADS hixl_req_wait(req, -1);
          Py_END_ALLOW_THREADS hixl_req_free(req);
          if (l)
            local_release(l);
          return NULL;
        }
        pend->req = req;
        if (l) {
          pend->view = l->view;
          pend->has_view = l->has_view;
          pend->keep = l->keep;
        }
        orphan(c, pend);
        return NULL;
      }
      st = w;
    }
    PyObject *res = NULL;
    if (st != HIXL_OK)
      raise_status(st, NULL);
    else if (kind == REQ_ATOMIC)
      res = PyLong_FromUnsignedLongLong(pend->old);
    else
      res = (Py_INCREF(Py_None), Py_None);
    hixl_req_free(req);
    if (l)
      local_release(l);
    if (pend)
      pend_free(pend, 0);
    return res;
  }
  pend->req = req;
  if (l) {
    pend->view = l->view;
    pend->has_view = l->has_view;
    pend->keep = l->keep;
  }
  hixl_status_t st = hixl_req_test(req);
  PyObject *r = req_new(c, pend, kind);
  if (r == NULL) {
    orphan(c, pend); /* the op is in flight: keep the buffer */
  } else if (st != HIXL_INPROGRESS) {
    req_finish((ReqObject *)r, st); /* done in the call (shm, self): release now */
  }
  return r;
}

/* The remote region argument: its type only.  Whether it is still usable
 * (and of this peer) is checked by rmr_live once every argument has been
 * converted. */
static int rmr_type(PyObject *o, RmrObject **r)
{
  if (!PyObject_TypeCheck(o, &RmrType)) {
    raise_fmt(HIXL_ERR_INVALID, "expected a hixl.RemoteRegion, got %s", Py_TYPE(o)->tp_name);
    return -1;
  }
  *r = (RmrObject *)o;
  return 0;
}

static int rmr_live(RmrObject *r, PeerObject *p)
{
  if (!rmr_ok(r))
    return 0;
  if (r->peer->id != p->id || r->peer->ctx != p->ctx) {
    raise_status(HIXL_ERR_INVALID, "the remote region belongs to another peer");
    return 0;
  }
  return 1;
}

/* Both in one (for the reference loops). */
static int rmr_arg(PyObject *o, PeerObject *p, RmrObject **r)
{
  return rmr_type(o, r) < 0 || !rmr_live(*r, p) ? -1 : 0;
}

enum { OP_PUT, OP_GET, OP_PUT_IMM };

/* Every operation has the same order, which keeps it safe against user
 * code: (1) parse and convert every argument -- buffer exports, __index__,
 * a tensor's data_ptr(): any of it may run Python that closes the context,
 * the peer or the region; (2) only then check the handles are alive and
 * copy them into locals; (3) count this thread in the objects' busy counts
 * and call the library, the GIL released when the call may take long.
 * A concurrent close marks the object closed, then waits for busy. */

/* put / get / put_imm(local, rmr, offset=0, imm=0, *, nbytes=None, ordered=False, wait=True) */
static PyObject *peer_xfer(PeerObject *p, PyObject *args, PyObject *kw, int op)
{
  static char *kwl_rw[] = {"local", "rmr", "offset", "nbytes", "ordered", "wait", NULL};
  static char *kwl_imm[] = {"local", "rmr", "offset", "imm", "nbytes", "ordered", "wait", NULL};
  PyObject *lo, *ro, *offo = NULL, *immo = NULL, *nb = Py_None;
  int ordered = 0, wait = 1;
  if (op == OP_PUT_IMM
          ? !PyArg_ParseTupleAndKeywords(args, kw, "OO|OO$Opp:put_imm", kwl_imm, &lo, &ro, &offo,
                                         &immo, &nb, &ordered, &wait)
          : !PyArg_ParseTupleAndKeywords(args, kw, op == OP_PUT ? "OO|O$Opp:put" : "OO|O$Opp:get",
                                         kwl_rw, &lo, &ro, &offo, &nb, &ordered, &wait))
    return NULL;
  CtxObject *c = p->ctx;
  if (c->orphans && c->ctx)
    reap_orphans(c);
  uint64_t off = 0;
  uint32_t imm = 0;
  Py_ssize_t n;
  RmrObject *r;
  if (rmr_type(ro, &r) < 0 || (offo && as_u64(offo, &off, "offset") < 0) ||
      (immo && as_u32(immo, &imm, "imm") < 0) || nbytes_arg(nb, &n) < 0)
    return NULL;
  local_t l;
  if (get_local(lo, n, op == OP_GET, &l, op == OP_GET ? "get: local" : "put: local") < 0)
    return NULL;
  if (!peer_ok(p) || !rmr_live(r, p)) {
    local_release(&l);
    return NULL;
  }
  pend_t *pend = NULL;
  if (!wait && (pend = PyMem_Calloc(1, sizeof(*pend))) == NULL) {
    local_release(&l);
    return PyErr_NoMemory();
  }
  hixl_peer_t *hp = p->peer;
  hixl_rmr_t *hr = r->rmr;
  unsigned flags = ordered ? HIXL_OP_ORDERED : 0;
  hixl_req_t *req;
  hixl_status_t st;
#define XFER()                                                                                     \
  (op == OP_PUT   ? hixl_put(hp, l.ptr, l.len, hr, off, flags, &req)                               \
   : op == OP_GET ? hixl_get(hp, l.ptr, l.len, hr, off, flags, &req)                               \
                  : hixl_put_imm(hp, l.ptr, l.len, hr, off, imm, flags, &req))
  if (l.len >= NOGIL_BYTES) {
    c->busy++;
    p->busy++;
    r->busy++;
    Py_BEGIN_ALLOW_THREADS st = XFER();
    Py_END_ALLOW_THREADS c->busy--;
    p->busy--;
    r->busy--;
  } else {
    st = XFER();
  }
#undef XFER
  if (st != HIXL_OK) {
    local_release(&l);
    PyMem_Free(pend);
    return raise_status(st, NULL);
  }
  return op_finish(p, req, &l, REQ_PLAIN, wait, pend);
}

static PyObject *Peer_put(PeerObject *p, PyObject *a, PyObject *k)
{
  return peer_xfer(p, a, k, OP_PUT);
}
static PyObject *Peer_get(PeerObject *p, PyObject *a, PyObject *k)
{
  return peer_xfer(p, a, k, OP_GET);
}
static PyObject *Peer_put_imm(PeerObject *p, PyObject *a, PyObject *k)
{
  return peer_xfer(p, a, k, OP_PUT_IMM);
}

static PyObject *Peer_notify(PeerObject *p, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"imm", "ordered", "wait", NULL};
  PyObject *immo;
  int ordered = 0, wait = 1;
  uint32_t imm;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$pp:notify", kwl, &immo, &ordered, &wait) ||
      as_u32(immo, &imm, "notify: imm") < 0 || !peer_ok(p))
    return NULL;
  pend_t *pend = NULL;
  if (!wait && (pend = PyMem_Calloc(1, sizeof(*pend))) == NULL)
    return PyErr_NoMemory();
  hixl_req_t *req;
  hixl_status_t st = hixl_notify(p->peer, imm, ordered ? HIXL_OP_ORDERED : 0, &req);
  if (st != HIXL_OK) {
    PyMem_Free(pend);
    return raise_status(st, NULL);
  }
  return op_finish(p, req, NULL, REQ_PLAIN, wait, pend);
}

static PyObject *peer_atomic(PeerObject *p, PyObject *args, PyObject *kw, int cas)
{
  static char *kwl_cas[] = {"rmr", "offset", "expected", "desired", "ordered", "wait", NULL};
  static char *kwl_faa[] = {"rmr", "offset", "add", "ordered", "wait", NULL};
  PyObject *ro, *offo, *ao, *bo = NULL;
  int ordered = 0, wait = 1;
  if (cas ? !PyArg_ParseTupleAndKeywords(args, kw, "OOOO|$pp:cas", kwl_cas, &ro, &offo, &ao, &bo,
                                         &ordered, &wait)
          : !PyArg_ParseTupleAndKeywords(args, kw, "OOO|$pp:faa", kwl_faa, &ro, &offo, &ao,
                                         &ordered, &wait))
    return NULL;
  RmrObject *r;
  uint64_t off, a, b = 0;
  if (rmr_type(ro, &r) < 0 || as_u64(offo, &off, "offset") < 0 ||
      as_u64(ao, &a, cas ? "expected" : "add") < 0 || (bo && as_u64(bo, &b, "desired") < 0) ||
      !peer_ok(p) || !rmr_live(r, p))
    return NULL;
  /* Always a record: the library writes the old value when the atomic
   * completes, which may be after a Ctrl-C has left this frame. */
  pend_t *pend = PyMem_Calloc(1, sizeof(*pend));
  if (pend == NULL)
    return PyErr_NoMemory();
  unsigned flags = ordered ? HIXL_OP_ORDERED : 0;
  hixl_req_t *req;
  hixl_status_t st = cas ? hixl_atomic_cas(p->peer, r->rmr, off, a, b, &pend->old, flags, &req)
                         : hixl_atomic_faa(p->peer, r->rmr, off, a, &pend->old, flags, &req);
  if (st != HIXL_OK) {
    PyMem_Free(pend);
    return raise_status(st, NULL);
  }
  return op_finish(p, req, NULL, REQ_ATOMIC, wait, pend);
}

static PyObject *Peer_cas(PeerObject *p, PyObject *a, PyObject *k)
{
  return peer_atomic(p, a, k, 1);
}
static PyObject *Peer_faa(PeerObject *p, PyObject *a, PyObject *k)
{
  return peer_atomic(p, a, k, 0);
}

/* A batch's descriptors.  From an (n, 3) array: read in place into the
 * context's scratch array (no user code can run while it is filled).  From
 * a sequence: converted element by element into a private array first
 * (user code may run there), every element's buffer kept in locals[], the
 * remote regions resolved only after all conversions. */
typedef struct {
  hixl_xfer_t *x;
  size_t n;
  int scratch;
  local_t *locals;  /* sequences: n entries */
  RmrObject **rmrs; /* sequences: each element's region */
} batch_t;

static void batch_release(CtxObject *c, batch_t *b)
{
  if (b->locals) {
    for (size_t i = 0; i < b->n; i++)
      local_release(&b->locals[i]);
    PyMem_Free(b->locals);
    b->locals = NULL;
  }
  PyMem_Free(b->rmrs);
  b->rmrs = NULL;
  if (b->scratch)
    c->scratch_busy = 0;
  else
    PyMem_Free(b->x);
  b->x = NULL;
}

static hixl_xfer_t *batch_alloc(CtxObject *c, size_t n, int *scratch)
{
  if (!c->scratch_busy && c->ctx) {
    if (c->scratch_cap < n) {
      size_t cap = n < 256 ? 256 : n;
      hixl_xfer_t *x = PyMem_Realloc(c->scratch, cap * sizeof(*x));
      if (x == NULL)
        return NULL;
      c->scratch = x;
      c->scratch_cap = cap;
    }
    c->scratch_busy = 1;
    *scratch = 1;
    return c->scratch;
  }
  *scratch = 0;
  return n > SIZE_MAX / sizeof(hixl_xfer_t) ? NULL : PyMem_Malloc(n * sizeof(hixl_xfer_t) + 1);
}

static int is_u64_format(const char *f)
{
  if (f == NULL)
    return 0;
  if (*f == '<' || *f == '=' || *f == '@')
    f++;
  return f[0] && f[1] == 0 && strchr("QqLlNn", f[0]) != NULL;
}

static int batch_from_array(CtxObject *c, Py_buffer *v, RmrObject *r, batch_t *b)
{
  if (r == NULL) {
    raise_status(HIXL_ERR_INVALID, "batch: an array of rows needs rmr=");
    return -1;
  }
  if (v->ndim != 2 || v->shape[1] != 3 || v->itemsize != 8 || !is_u64_format(v->format)) {
    raise_fmt(HIXL_ERR_INVALID,
              "batch: the array must have shape (n, 3) of native 64-bit integers (local address, "
              "remote offset, length); got ndim %d, format '%s'",
              v->ndim, v->format ? v->format : "B");
    return -1;
  }
  size_t n = (size_t)v->shape[0];
  if (n == 0) {
    raise_status(HIXL_ERR_INVALID, "batch: empty batch");
    return -1;
  }
  if ((b->x = batch_alloc(c, n, &b->scratch)) == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  const uint64_t *rows = v->buf;
  hixl_rmr_t *rmr = r->rmr;
  for (size_t i = 0; i < n; i++) {
    b->x[i].local = (void *)(uintptr_t)rows[3 * i];
    b->x[i].rmr = rmr;
    b->x[i].off = rows[3 * i + 1];
    b->x[i].len = (size_t)rows[3 * i + 2];
  }
  b->n = n;
  return 0;
}

/* Sequence elements: (local, offset), (local, rmr, offset) or (address,
 * offset, nbytes).  items is a tuple we own (PySequence_Tuple): user code
 * run by a conversion cannot change or free what we walk. */
static int batch_from_seq(PyObject *items, int writable, batch_t *b)
{
  size_t n = (size_t)PyTuple_GET_SIZE(items);
  if (n == 0) {
    raise_status(HIXL_ERR_INVALID, "batch: empty batch");
    return -1;
  }
  if ((b->x =
           n > SIZE_MAX / sizeof(hixl_xfer_t) ? NULL : PyMem_Malloc(n * sizeof(hixl_xfer_t) + 1)) ==
          NULL ||
      (b->locals = PyMem_Calloc(n, sizeof(local_t))) == NULL ||
      (b->rmrs = PyMem_Calloc(n, sizeof(RmrObject *))) == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  b->scratch = 0;
  b->n = n;
  for (size_t i = 0; i < n; i++) {
    PyObject *it = PyTuple_GET_ITEM(items, i);
    char what[48];
    snprintf(what, sizeof(what), "batch[%zu]", i);
    if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) < 2 || PyTuple_GET_SIZE(it) > 3) {
      raise_fmt(HIXL_ERR_INVALID,
                "%s: expected (local, offset), (local, rmr, offset) or (address, offset, nbytes)",
                what);
      return -1;
    }
    PyObject *lo = PyTuple_GET_ITEM(it, 0), *second = PyTuple_GET_ITEM(it, 1), *offo = second;
    Py_ssize_t nb = -1;
    if (PyObject_TypeCheck(second, &RmrType)) {
      if (PyTuple_GET_SIZE(it) != 3) {
        raise_fmt(HIXL_ERR_INVALID, "%s: (local, rmr, offset) needs the offset", what);
        return -1;
      }
      b->rmrs[i] = (RmrObject *)second; /* borrowed: items holds it */
      offo = PyTuple_GET_ITEM(it, 2);
    } else if (PyTuple_GET_SIZE(it) == 3) {
      uint64_t v;
      if (as_u64(PyTuple_GET_ITEM(it, 2), &v, "nbytes") < 0)
        return -1;
      if (v > (uint64_t)PY_SSIZE_T_MAX) {
        raise_fmt(HIXL_ERR_INVALID, "%s: nbytes is too large", what);
        return -1;
      }
      nb = (Py_ssize_t)v;
    }
    uint64_t off;
    if (as_u64(offo, &off, what) < 0 || get_local(lo, nb, writable, &b->locals[i], what) < 0)
      return -1;
    b->x[i].local = b->locals[i].ptr;
    b->x[i].off = off;
    b->x[i].len = b->locals[i].len;
  }
  return 0;
}

/* put_batch / get_batch(descs, rmr=None, *, imm=None, ordered=False, wait=True) */
static PyObject *peer_batch(PeerObject *p, PyObject *args, PyObject *kw, int put)
{
  static char *kwl_put[] = {"descs", "rmr", "imm", "ordered", "wait", NULL};
  static char *kwl_get[] = {"descs", "rmr", "ordered", "wait", NULL};
  PyObject *descs, *ro = Py_None, *immo = Py_None;
  int ordered = 0, wait = 1;
  if (put ? !PyArg_ParseTupleAndKeywords(args, kw, "O|O$Opp:put_batch", kwl_put, &descs, &ro, &immo,
                                         &ordered, &wait)
          : !PyArg_ParseTupleAndKeywords(args, kw, "O|O$pp:get_batch", kwl_get, &descs, &ro,
                                         &ordered, &wait))
    return NULL;
  CtxObject *c = p->ctx;
  if (c->orphans && c->ctx)
    reap_orphans(c);
  RmrObject *r = NULL;
  uint32_t imm = 0;
  if ((ro != Py_None && rmr_type(ro, &r) < 0) ||
      (immo != Py_None && as_u32(immo, &imm, "put_batch: imm") < 0))
    return NULL;
  batch_t b = {0};
  PyObject *items = NULL;
  Py_buffer v;
  int has_v = 0;
  if (PyObject_CheckBuffer(descs) && !PyBytes_Check(descs) && !PyByteArray_Check(descs)) {
    if (PyObject_GetBuffer(descs, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
      PyObject *t, *e, *tb;
      PyErr_Fetch(&t, &e, &tb);
      PyObject *es = e ? PyObject_Str(e) : NULL;
      raise_fmt(HIXL_ERR_INVALID,
                "batch: cannot read the descriptor array (%s): it must be a "
                "C-contiguous (n, 3) array of 64-bit integers (numpy.ascontiguousarray)",
                es && PyUnicode_Check(es) ? PyUnicode_AsUTF8(es) : "?");
      Py_XDECREF(es);
      Py_XDECREF(t);
      Py_XDECREF(e);
      Py_XDECREF(tb);
      return NULL;
    }
    has_v = 1;
    /* Nothing below runs user code until the call. */
    if (!peer_ok(p) || (r && !rmr_live(r, p)) || batch_from_array(c, &v, r, &b) < 0) {
      PyBuffer_Release(&v);
      batch_release(c, &b);
      return NULL;
    }
  } else {
    if ((items = PySequence_Tuple(descs)) == NULL) {
      PyErr_Clear();
      return raise_status(HIXL_ERR_INVALID, "batch: descs must be an (n, 3) array or a sequence "
                                            "of tuples");
    }
    int bad = batch_from_seq(items, !put, &b) < 0 || !peer_ok(p) || (r && !rmr_live(r, p));
    for (size_t i = 0; !bad && i < b.n; i++) {
      RmrObject *er = b.rmrs[i] ? b.rmrs[i] : r;
      if (er == NULL) {
        raise_fmt(HIXL_ERR_INVALID, "batch[%zu]: no remote region (give rmr=)", i);
        bad = 1;
      } else if (!rmr_live(er, p)) {
        bad = 1;
      } else {
        b.x[i].rmr = er->rmr;
      }
    }
    if (bad) {
      batch_release(c, &b);
      Py_DECREF(items);
      return NULL;
    }
  }
  size_t total = 0;
  for (size_t i = 0; i < b.n; i++)
    total += b.x[i].len;
  pend_t *pend = NULL;
  if ((!wait || b.locals) && (pend = PyMem_Calloc(1, sizeof(*pend))) == NULL) {
    batch_release(c, &b);
    if (has_v)
      PyBuffer_Release(&v);
    Py_XDECREF(items);
    return PyErr_NoMemory();
  }
  hixl_peer_t *hp = p->peer;
  unsigned flags = ordered ? HIXL_OP_ORDERED : 0;
  hixl_req_t *req;
  hixl_status_t st;
  /* Every region in b.x is counted busy while the GIL is released (a
   * concurrent release waits); items keeps the objects alive. */
  if (total >= NOGIL_BYTES) {
    c->busy++;
    p->busy++;
    if (r)
      r->busy++;
    for (size_t i = 0; b.rmrs && i < b.n; i++)
      if (b.rmrs[i])
        b.rmrs[i]->busy++;
    Py_BEGIN_ALLOW_THREADS st =
        put ? hixl_put_batch(hp, b.x, b.n, immo != Py_None ? &imm : NULL, flags, &req)
            : hixl_get_batch(hp, b.x, b.n, flags, &req);
    Py_END_ALLOW_THREADS c->busy--;
    p->busy--;
    if (r)
      r->busy--;
    for (size_t i = 0; b.rmrs && i < b.n; i++)
      if (b.rmrs[i])
        b.rmrs[i]->busy--;
  } else {
    st = put ? hixl_put_batch(hp, b.x, b.n, immo != Py_None ? &imm : NULL, flags, &req)
             : hixl_get_batch(hp, b.x, b.n, flags, &req);
  }
  if (has_v)
    PyBuffer_Release(&v);
  Py_XDECREF(items);
  /* The library has consumed the descriptors; a sequence's buffers stay
   * exported by the record until the batch completes. */
  if (st == HIXL_OK && b.locals) {
    pend->locals = b.locals;
    pend->nlocals = b.n;
    b.locals = NULL;
  }
  batch_release(c, &b);
  if (st != HIXL_OK) {
    if (pend)
      pend_free(pend, 0);
    return raise_status(st, NULL);
  }
  return op_finish(p, req, NULL, REQ_PLAIN, wait, pend);
}

static PyObject *Peer_put_batch(PeerObject *p, PyObject *a, PyObject *k)
{
  return peer_batch(p, a, k, 1);
}
static PyObject *Peer_get_batch(PeerObject *p, PyObject *a, PyObject *k)
{
  return peer_batch(p, a, k, 0);
}

static Py_hash_t Peer_hash(PeerObject *p) { return _Py_HashPointer(p->id); }

static PyObject *Peer_richcompare(PyObject *a, PyObject *b, int op)
{
  if (!PyObject_TypeCheck(b, &PeerType) || (op != Py_EQ && op != Py_NE))
    Py_RETURN_NOTIMPLEMENTED;
  int eq = ((PeerObject *)a)->id == ((PeerObject *)b)->id &&
           ((PeerObject *)a)->ctx == ((PeerObject *)b)->ctx;
  return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyObject *Peer_repr(PeerObject *p)
{
  PyObject *t = Peer_get_transport(p, NULL);
  PyObject *r = t ? PyUnicode_FromFormat("<hixl.Peer %s %p>", PyUnicode_AsUTF8(t), p->peer) : NULL;
  Py_XDECREF(t);
  return r;
}

static PyObject *Peer_stats(PeerObject *p, PyObject *u)
{
  (void)u;
  if (!peer_ok(p))
    return NULL;
  return stats_dict(NULL, p->peer);
}

static PyObject *Peer_remote_stats(PeerObject *p, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"timeout", NULL};
  PyObject *to = Py_None;
  int ms;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:remote_stats", kwl, &to) ||
      timeout_arg(to, &ms) < 0 || !peer_ok(p))
    return NULL;
  if (to == Py_None)
    ms = p->ctx->timeout_ms;
  hixl_stat_t st[256];
  size_t n = sizeof(st) / sizeof(st[0]);
  hixl_status_t rc;
  hixl_peer_t *hp = p->peer;
  p->ctx->busy++;
  p->busy++;
  Py_BEGIN_ALLOW_THREADS rc = hixl_peer_remote_stats(hp, st, &n, ms);
  Py_END_ALLOW_THREADS p->ctx->busy--;
  p->busy--;
  if (rc != HIXL_OK)
    return raise_status(rc, NULL);
  if (n > sizeof(st) / sizeof(st[0]))
    n = sizeof(st) / sizeof(st[0]);
  PyObject *d = PyDict_New();
  for (size_t i = 0; d && i < n; i++) {
    PyObject *v = PyLong_FromUnsignedLongLong(st[i].value);
    if (v == NULL || PyDict_SetItemString(d, st[i].name, v) != 0)
      Py_CLEAR(d);
    Py_XDECREF(v);
  }
  return d;
}

static PyMethodDef Peer_methods[] = {
    {"stats", (PyCFunction)Peer_stats, METH_NOARGS,
     "stats() -> dict: this peer's counters by name (hixl_ctx_stats)"},
    {"remote_stats", (PyCFunction)(void (*)(void))Peer_remote_stats, METH_VARARGS | METH_KEYWORDS,
     "remote_stats(timeout=None) -> dict: the other end's context counters "
     "(hixl_peer_remote_stats)"},
    {"close", (PyCFunction)Peer_close, METH_NOARGS, "close(): hixl_disconnect"},
    {"lookup", (PyCFunction)(void (*)(void))Peer_lookup, METH_VARARGS | METH_KEYWORDS,
     "lookup(name, timeout=None) -> RemoteRegion"},
    {"unpack", (PyCFunction)Peer_unpack, METH_VARARGS, "unpack(blob) -> RemoteRegion"},
    {"put", (PyCFunction)(void (*)(void))Peer_put, METH_VARARGS | METH_KEYWORDS,
     "put(local, rmr, offset=0, *, nbytes=None, ordered=False, wait=True)"},
    {"get", (PyCFunction)(void (*)(void))Peer_get, METH_VARARGS | METH_KEYWORDS,
     "get(local, rmr, offset=0, *, nbytes=None, ordered=False, wait=True)"},
    {"put_imm", (PyCFunction)(void (*)(void))Peer_put_imm, METH_VARARGS | METH_KEYWORDS,
     "put_imm(local, rmr, offset=0, imm=0, *, nbytes=None, ordered=False, wait=True)"},
    {"notify", (PyCFunction)(void (*)(void))Peer_notify, METH_VARARGS | METH_KEYWORDS,
     "notify(imm, *, ordered=False, wait=True)"},
    {"cas", (PyCFunction)(void (*)(void))Peer_cas, METH_VARARGS | METH_KEYWORDS,
     "cas(rmr, offset, expected, desired, *, ordered=False, wait=True) -> old value"},
    {"faa", (PyCFunction)(void (*)(void))Peer_faa, METH_VARARGS | METH_KEYWORDS,
     "faa(rmr, offset, add, *, ordered=False, wait=True) -> old value"},
    {"put_batch", (PyCFunction)(void (*)(void))Peer_put_batch, METH_VARARGS | METH_KEYWORDS,
     "put_batch(descs, rmr=None, *, imm=None, ordered=False, wait=True)"},
    {"get_batch", (PyCFunction)(void (*)(void))Peer_get_batch, METH_VARARGS | METH_KEYWORDS,
     "get_batch(descs, rmr=None, *, ordered=False, wait=True)"},
    {NULL}};

static PyGetSetDef Peer_getset[] = {
    {"transport", (getter)Peer_get_transport, NULL, "\"self\", \"shm\", \"verbs\", \"fabric\"",
     NULL},
    {"closed", (getter)Peer_get_closed, NULL, "whether it is closed", NULL},
    {"context", (getter)Peer_get_context, NULL, "its Context", NULL},
    {NULL}};

/* ------------------------------------------------------------ remote region */

static void rmr_release(RmrObject *r)
{
  if (r->rmr == NULL)
    return;
  hixl_rmr_t *rmr = r->rmr;
  r->rmr = NULL;
  wait_idle(&r->busy);
  if (r->peer->ctx->ctx)
    hixl_rmr_release(rmr);
}

static PyObject *Rmr_release(RmrObject *r, PyObject *u)
{
  (void)u;
  rmr_release(r);
  Py_RETURN_NONE;
}

static void Rmr_dealloc(RmrObject *r)
{
  rmr_release(r);
  Py_XDECREF(r->peer);
  PyObject_Free(r);
}

static PyObject *Rmr_get_peer(RmrObject *r, void *u)
{
  (void)u;
  Py_INCREF(r->peer);
  return (PyObject *)r->peer;
}

static PyObject *Rmr_get_released(RmrObject *r, void *u)
{
  (void)u;
  return PyBool_FromLong(r->rmr == NULL);
}

static PyMethodDef Rmr_methods[] = {
    {"release", (PyCFunction)Rmr_release, METH_NOARGS, "release(): hixl_rmr_release"},
    {"close", (PyCFunction)Rmr_release, METH_NOARGS, "the same as release()"},
    {NULL}};

static PyGetSetDef Rmr_getset[] = {
    {"peer", (getter)Rmr_get_peer, NULL, "the Peer it is reached through", NULL},
    {"released", (getter)Rmr_get_released, NULL, "whether release() was called", NULL},
    {NULL}};

/* ------------------------------------------------------------ world */

static int World_init(WorldObject *w, PyObject *args, PyObject *kw)
{
  /* World(rank=None, size=None, rendezvous=None, *, ctx=None), or
   * World(ctx, rank, size, rendezvous) as in C.  Without a context the
   * World makes one (HIXL_* defaults) and closes it with itself. */
  static char *kwl_c[] = {"ctx", "rank", "size", "rendezvous", NULL};
  static char *kwl[] = {"rank", "size", "rendezvous", "ctx", NULL};
  PyObject *co = Py_None, *ro = Py_None, *so = Py_None;
  const char *rdv = NULL;
  if (PyTuple_GET_SIZE(args) > 0 && PyObject_TypeCheck(PyTuple_GET_ITEM(args, 0), &CtxType)) {
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|OOz:World", kwl_c, &CtxType, &co, &ro, &so,
                                     &rdv))
      return -1;
  } else if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOz$O:World", kwl, &ro, &so, &rdv, &co)) {
    return -1;
  }
  if (w->w || w->ctx) {
    raise_status(HIXL_ERR_INVALID, "World.__init__ called twice");
    return -1;
  }
  if (co != Py_None && !PyObject_TypeCheck(co, &CtxType)) {
    raise_status(HIXL_ERR_INVALID, "World: ctx must be a hixl.Context");
    return -1;
  }
  long long rank = -1, size = -1;
  if ((ro != Py_None && (rank = PyLong_AsLongLong(ro)) == -1 && PyErr_Occurred()) ||
      (so != Py_None && (size = PyLong_AsLongLong(so)) == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    raise_status(HIXL_ERR_INVALID, "World: rank and size must be integers");
    return -1;
  }
  if (ro != Py_None && (rank < 0 || rank >= (1 << 20))) {
    raise_fmt(HIXL_ERR_INVALID, "World: rank %lld is not in [0, 2**20)", rank);
    return -1;
  }
  if (so != Py_None && (size < 1 || size > (1 << 20))) {
    raise_fmt(HIXL_ERR_INVALID, "World: size %lld is not in [1, 2**20]", size);
    return -1;
  }
  int owns = co == Py_None;
  CtxObject *c = owns ? (CtxObject *)PyObject_CallNoArgs((PyObject *)&CtxType)
                      : (CtxObject *)(Py_INCREF(co), co);
  if (c == NULL)
    return -1;
  if (!ctx_ok(c)) {
    Py_DECREF(c);
    return -1;
  }
  hixl_world_t *hw;
  hixl_status_t st;
  c->busy++;
  Py_BEGIN_ALLOW_THREADS st = hixl_world_create(c->ctx, (int)rank, (int)size, rdv, &hw);
  Py_END_ALLOW_THREADS c->busy--;
  if (st != HIXL_OK) {
    raise_status(st, NULL);
    if (owns) {
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      ctx_close(c, 1);
      PyErr_Restore(t, v, tb);
    }
    Py_DECREF(c);
    return -1;
  }
  int n = hixl_world_size(hw);
  PyObject *peers = PyList_New(n);
  if (peers == NULL) {
    hixl_world_destroy(hw);
    Py_DECREF(c);
    return -1;
  }
  w->ctx = c; /* the reference taken above */
  w->owns_ctx = owns;
  w->w = hw;
  w->peers = peers;
  for (int i = 0; i < n; i++) {
    /* A notification taken on another thread while the world was made
     * may have made the Peer already: the same one, so that no other
     * Peer names a handle World.close releases. */
    PyObject *p = peer_lookup(c, hixl_world_peer(hw, i));
    if (p == NULL)
      return -1;
    ((PeerObject *)p)->world = 1;
    PyList_SET_ITEM(peers, i, p);
  }
  return 0;
}

static int world_ok(WorldObject *w)
{
  if (w->ctx == NULL) {
    raise_status(HIXL_ERR_INVALID, "the World is not initialized");
    return 0;
  }
  if (!ctx_ok(w->ctx))
    return 0;
  if (w->w == NULL) {
    raise_status(HIXL_ERR_INVALID, "the world is closed");
    return 0;
  }
  return 1;
}

/* The Peer objects of a world go with it: their handles are disconnected
 * by hixl_world_destroy, and released after it (world_close).  Each
 * handle forgotten is appended to out (room for every entry of list). */
static void world_forget_peers(WorldObject *w, PyObject *list, hixl_peer_t **out, size_t *n_out)
{
  Py_ssize_t n = list ? PyList_GET_SIZE(list) : 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PeerObject *p = (PeerObject *)PyList_GET_ITEM(list, i);
    if (p && p->peer) { /* NULL: World() failed before making it */
      hixl_peer_t *hp = p->peer;
      if (out)
        out[(*n_out)++] = hp;
      p->peer = NULL;
      wait_idle(&p->busy);
      PyObject *key = PyLong_FromVoidPtr(hp);
      if (key && PyDict_DelItem(w->ctx->peers, key) < 0)
        PyErr_Clear();
      Py_XDECREF(key);
    }
  }
}

/* A rank that came back has a new hixl peer: its Peer replaces the old
 * one in w->peers.  The old handle is no longer the world's
 * (hixl_world_wait_rank let go of it): its Peer becomes an ordinary one,
 * still valid and lost, released when the application drops it or closes
 * it, so that a rank that comes back again and again leaves nothing. */
static int world_sync(WorldObject *w)
{
  Py_ssize_t n = PyList_GET_SIZE(w->peers);
  for (Py_ssize_t i = 0; i < n; i++) {
    PeerObject *old = (PeerObject *)PyList_GET_ITEM(w->peers, i);
    hixl_peer_t *hp = hixl_world_peer(w->w, (int)i);
    if (old == NULL || hp == NULL || hp == old->peer) /* old NULL: World() failed */
      continue;
    PeerObject *p = (PeerObject *)peer_lookup(w->ctx, hp); /* a notification may have made it */
    if (p == NULL)
      return -1;
    p->world = 1;
    old->world = 0;
    old->owned = 1;
    PyList_SetItem(w->peers, i, (PyObject *)p); /* steals p, drops the list's old reference */
  }
  return 0;
}

static void world_close(WorldObject *w)
{
  if (w->w == NULL)
    return;
  if (w->ctx->ctx && world_sync(w) < 0) /* every current peer has its Peer: all forgotten below */
    PyErr_Clear();
  hixl_world_t *hw = w->w;
  w->w = NULL;
  size_t cap = (size_t)PyList_GET_SIZE(w->peers);
  hixl_peer_t **hps = PyMem_Malloc(cap ? cap * sizeof(*hps) : 1); /* NULL: none released */
  size_t n_hps = 0;
  world_forget_peers(w, w->peers, hps, &n_hps);
  wait_idle(&w->busy); /* barrier / exchange of other threads */
  if (w->ctx->ctx) {
    CtxObject *c = w->ctx;
    c->busy++; /* a concurrent Context.close waits for this */
    Py_BEGIN_ALLOW_THREADS hixl_world_destroy(hw);
    Py_END_ALLOW_THREADS c->busy--;
    /* The handles are the application's now, disconnected: no
     * notification of theirs can be taken from here on.  Released when
     * nothing of ours can name one (as in peer_close): not if a Peer was
     * made for it meanwhile (a notification taken before the
     * disconnect), not while a request or a notification wait may hold
     * one; an Rmr of one makes the release refuse it. */
    if (c->orphans)
      reap_orphans(c);
    if (c->ctx && c->peers && c->live == NULL && c->orphans == NULL && c->notif_waiters == 0) {
      size_t k = 0;
      for (size_t i = 0; i < n_hps; i++) {
        PyObject *key = PyLong_FromVoidPtr(hps[i]);
        int cached = key ? PyDict_Contains(c->peers, key) : -1;
        Py_XDECREF(key);
        if (cached == 0)
          hps[k++] = hps[i];
        else if (cached < 0)
          PyErr_Clear();
      }
      c->busy++;
      Py_BEGIN_ALLOW_THREADS for (size_t i = 0; i < k; i++)(void) hixl_peer_release(hps[i]);
      Py_END_ALLOW_THREADS c->busy--;
    }
  }
  PyMem_Free(hps);
  if (w->owns_ctx && ctx_close(w->ctx, 0) < 0)
    PyErr_Clear(); /* views of its memory live: it goes with the last of them */
}

static PyObject *World_close(WorldObject *w, PyObject *u)
{
  (void)u;
  world_close(w);
  Py_RETURN_NONE;
}

static int World_traverse(WorldObject *w, visitproc visit, void *arg)
{
  Py_VISIT(w->peers);
  return 0;
}

static int World_clear(WorldObject *w)
{
  world_close(w);
  Py_CLEAR(w->peers);
  return 0;
}

static void World_dealloc(WorldObject *w)
{
  PyObject_GC_UnTrack(w);
  World_clear(w);
  Py_CLEAR(w->ctx);
  Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyObject *World_peer(WorldObject *w, PyObject *args)
{
  int r;
  if (!PyArg_ParseTuple(args, "i:peer", &r) || !world_ok(w))
    return NULL;
  if (r < 0 || r >= PyList_GET_SIZE(w->peers))
    return raise_fmt(HIXL_ERR_INVALID, "World.peer: rank %d not in [0, %zd)", r,
                     PyList_GET_SIZE(w->peers));
  if (world_sync(w) < 0)
    return NULL;
  PyObject *p = PyList_GET_ITEM(w->peers, r);
  Py_INCREF(p);
  return p;
}

static PyObject *World_wait_rank(WorldObject *w, PyObject *args, PyObject *kw)
{
  static char *kwl[] = {"rank", "timeout_ms", NULL};
  int r, timeout_ms = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "i|i:wait_rank", kwl, &r, &timeout_ms) || !world_ok(w))
    return NULL;
  if (r < 0 || r >= PyList_GET_SIZE(w->peers))
    return raise_fmt(HIXL_ERR_INVALID, "World.wait_rank: rank %d not in [0, %zd)", r,
                     PyList_GET_SIZE(w->peers));
  hixl_status_t st;
  hixl_world_t *hw = w->w;
  hixl_peer_t *hp;
  w->ctx->busy++;
  w->busy++;
  Py_BEGIN_ALLOW_THREADS st = hixl_world_wait_rank(hw, r, timeout_ms, &hp);
  Py_END_ALLOW_THREADS w->ctx->busy--;
  w->busy--;
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  if (world_sync(w) < 0)
    return NULL;
  PyObject *p = PyList_GET_ITEM(w->peers, r);
  Py_INCREF(p);
  return p;
}

static PyObject *World_barrier(WorldObject *w, PyObject *u)
{
  (void)u;
  if (!world_ok(w))
    return NULL;
  hixl_status_t st;
  hixl_world_t *hw = w->w;
  w->ctx->busy++;
  w->busy++;
  Py_BEGIN_ALLOW_THREADS st = hixl_world_barrier(hw);
  Py_END_ALLOW_THREADS w->ctx->busy--;
  w->busy--;
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  Py_RETURN_NONE;
}

static PyObject *World_exchange(WorldObject *w, PyObject *args)
{
  PyObject *ro;
  if (!PyArg_ParseTuple(args, "O!:exchange", &RegionType, &ro) || !world_ok(w))
    return NULL;
  RegionObject *reg = (RegionObject *)ro;
  if (!region_ok(reg))
    return NULL;
  if (reg->ctx != w->ctx)
    return raise_status(HIXL_ERR_INVALID, "World.exchange: the region is of another context");
  int n = (int)PyList_GET_SIZE(w->peers);
  hixl_rmr_t **rmrs = PyMem_Calloc((size_t)n, sizeof(*rmrs));
  if (rmrs == NULL)
    return PyErr_NoMemory();
  hixl_status_t st;
  hixl_world_t *hw = w->w;
  hixl_mr_t *mr = reg->mr;
  w->ctx->busy++;
  w->busy++;
  Py_BEGIN_ALLOW_THREADS st = hixl_world_exchange(hw, mr, rmrs);
  Py_END_ALLOW_THREADS w->ctx->busy--;
  w->busy--;
  if (st != HIXL_OK) {
    PyMem_Free(rmrs);
    return raise_status(st, NULL);
  }
  if (world_sync(w) < 0) { /* rmrs[i] belongs to rank i's current peer */
    for (int i = 0; i < n; i++)
      hixl_rmr_release(rmrs[i]);
    PyMem_Free(rmrs);
    return NULL;
  }
  PyObject *l = PyList_New(n);
  for (int i = 0; i < n; i++) {
    PyObject *r = l ? rmr_wrap((PeerObject *)PyList_GET_ITEM(w->peers, i), rmrs[i]) : NULL;
    if (r == NULL) {
      if (!l)
        hixl_rmr_release(rmrs[i]);
      continue;
    }
    PyList_SET_ITEM(l, i, r);
  }
  PyMem_Free(rmrs);
  return l;
}

static PyObject *World_get_rank(WorldObject *w, void *u)
{
  (void)u;
  if (!world_ok(w))
    return NULL;
  return PyLong_FromLong(hixl_world_rank(w->w));
}

static PyObject *World_get_size(WorldObject *w, void *u)
{
  (void)u;
  if (!world_ok(w))
    return NULL;
  return PyLong_FromLong(hixl_world_size(w->w));
}

static PyObject *World_get_context(WorldObject *w, void *u)
{
  (void)u;
  if (w->ctx == NULL)
    return raise_status(HIXL_ERR_INVALID, "the world was not created");
  Py_INCREF(w->ctx);
  return (PyObject *)w->ctx;
}

static PyObject *World_get_peers(WorldObject *w, void *u)
{
  (void)u;
  if (!world_ok(w) || world_sync(w) < 0)
    return NULL;
  return PyList_AsTuple(w->peers);
}

static PyMethodDef World_methods[] = {
    {"peer", (PyCFunction)World_peer, METH_VARARGS,
     "peer(rank) -> Peer (own rank: self; a rank that came back: its new Peer)"},
    {"wait_rank", (PyCFunction)(void (*)(void))World_wait_rank, METH_VARARGS | METH_KEYWORDS,
     "wait_rank(rank, timeout_ms=-1) -> Peer: wait until rank is up (back, if it was lost)"},
    {"barrier", (PyCFunction)World_barrier, METH_NOARGS, "barrier(): every rank entered"},
    {"exchange", (PyCFunction)World_exchange, METH_VARARGS,
     "exchange(region) -> list of RemoteRegion, index = rank (collective)"},
    {"close", (PyCFunction)World_close, METH_NOARGS, "close(): hixl_world_destroy"},
    {NULL}};

static PyGetSetDef World_getset[] = {
    {"rank", (getter)World_get_rank, NULL, "this process's rank", NULL},
    {"size", (getter)World_get_size, NULL, "number of ranks", NULL},
    {"peers", (getter)World_get_peers, NULL, "tuple of Peer, index = rank", NULL},
    {"context", (getter)World_get_context, NULL, "its Context", NULL},
    {NULL}};

/* ------------------------------------------------------------ module functions */

/* put_addr(peer, rmr, local_address, nbytes, offset, is_get): the seed's
 * hixl.put / hixl.get -- raw pointers, no request (hixl.fence waits). */
static PyObject *mod_xfer_addr(PyObject *m, PyObject *const *a, Py_ssize_t n)
{
  (void)m;
  if (n != 6 || !PyObject_TypeCheck(a[0], &PeerType)) {
    PyErr_SetString(PyExc_TypeError, "_xfer_addr(peer, rmr, address, nbytes, offset, is_get)");
    return NULL;
  }
  PeerObject *p = (PeerObject *)a[0];
  RmrObject *r;
  uint64_t addr, len, off;
  if (rmr_type(a[1], &r) < 0 || as_u64(a[2], &addr, "local address") < 0 ||
      as_u64(a[3], &len, "size") < 0 || as_u64(a[4], &off, "remote offset") < 0)
    return NULL;
  int is_get = PyObject_IsTrue(a[5]);
  if (is_get < 0 || !peer_ok(p) || !rmr_live(r, p))
    return NULL;
  CtxObject *c = p->ctx;
  hixl_peer_t *hp = p->peer;
  hixl_rmr_t *hr = r->rmr;
  hixl_status_t st;
#define XA()                                                                                       \
  (is_get ? hixl_get(hp, (void *)(uintptr_t)addr, len, hr, off, 0, NULL)                           \
          : hixl_put(hp, (const void *)(uintptr_t)addr, len, hr, off, 0, NULL))
  if (len >= NOGIL_BYTES) {
    c->busy++;
    p->busy++;
    r->busy++;
    Py_BEGIN_ALLOW_THREADS st = XA();
    Py_END_ALLOW_THREADS c->busy--;
    p->busy--;
    r->busy--;
  } else {
    st = XA();
  }
#undef XA
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  Py_RETURN_NONE;
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
  (void)m;
  long long v = PyLong_AsLongLong(arg);
  if (v == -1 && PyErr_Occurred())
    return NULL;
  if (v < -1000 || v > 1000)
    return raise_fmt(HIXL_ERR_INVALID, "strerror: %lld is not a hixl status", v);
  return PyUnicode_FromString(hixl_strerror((hixl_status_t)v));
}

static PyObject *mod_last_error(PyObject *m, PyObject *u)
{
  (void)m;
  (void)u;
  return PyUnicode_FromString(hixl_last_error());
}

static PyObject *mod_device_backend(PyObject *m, PyObject *u)
{
  (void)m;
  (void)u;
  return PyUnicode_FromString(hixl_device_backend());
}

/* mem_copy(dst, src, nbytes): any two buffers / addresses, host or device. */
static PyObject *mod_mem_copy(PyObject *m, PyObject *args)
{
  (void)m;
  PyObject *d, *s;
  Py_ssize_t n;
  if (!PyArg_ParseTuple(args, "OOn:mem_copy", &d, &s, &n))
    return NULL;
  if (n < 0)
    return raise_status(HIXL_ERR_INVALID, "mem_copy: nbytes must be >= 0");
  local_t ld, ls;
  if (get_local(d, n, 1, &ld, "mem_copy: dst") < 0)
    return NULL;
  if (get_local(s, n, 0, &ls, "mem_copy: src") < 0) {
    local_release(&ld);
    return NULL;
  }
  hixl_status_t st;
  Py_BEGIN_ALLOW_THREADS st = hixl_mem_copy(ld.ptr, ls.ptr, (size_t)n);
  Py_END_ALLOW_THREADS local_release(&ld);
  local_release(&ls);
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  Py_RETURN_NONE;
}

static PyObject *mod_mem_query(PyObject *m, PyObject *arg)
{
  (void)m;
  uint64_t a;
  if (as_u64(arg, &a, "address") < 0)
    return NULL;
  hixl_mem_kind_t kind;
  int dev = -1;
  hixl_status_t st = hixl_mem_query((const void *)(uintptr_t)a, &kind, &dev);
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  return Py_BuildValue("(si)", kind == HIXL_MEM_DEVICE ? "device" : "host", dev);
}

static PyObject *mod_set_await(PyObject *m, PyObject *fn)
{
  (void)m;
  Py_XDECREF(await_impl);
  Py_INCREF(fn);
  await_impl = fn;
  Py_RETURN_NONE;
}

/* C-side reference loops for bench/python_overhead.py: the same calls from
 * C in the same process, so Python's cost is measured beside C's. */
static PyObject *mod_bench_put_c(PyObject *m, PyObject *args)
{
  (void)m;
  PyObject *po, *ro, *lo;
  unsigned long long off;
  Py_ssize_t iters;
  if (!PyArg_ParseTuple(args, "OOOKn:_bench_put_c", &po, &lo, &ro, &off, &iters))
    return NULL;
  if (!PyObject_TypeCheck(po, &PeerType))
    return raise_status(HIXL_ERR_INVALID, "peer expected");
  PeerObject *p = (PeerObject *)po;
  RmrObject *r;
  local_t l;
  if (!peer_ok(p) || rmr_arg(ro, p, &r) < 0 || get_local(lo, -1, 0, &l, "local") < 0)
    return NULL;
  hixl_status_t st = HIXL_OK;
  int64_t t0, t1;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  t0 = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  for (Py_ssize_t i = 0; i < iters && st == HIXL_OK; i++) {
    hixl_req_t *req;
    st = hixl_put(p->peer, l.ptr, l.len, r->rmr, off, 0, &req);
    if (st == HIXL_OK) {
      st = hixl_req_wait(req, -1);
      hixl_req_free(req);
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &ts);
  t1 = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  local_release(&l);
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  return PyFloat_FromDouble((double)(t1 - t0) / (double)iters);
}

static PyObject *mod_bench_batch_c(PyObject *m, PyObject *args)
{
  (void)m;
  PyObject *po, *ro, *ao;
  Py_ssize_t iters;
  if (!PyArg_ParseTuple(args, "OOOn:_bench_batch_c", &po, &ao, &ro, &iters))
    return NULL;
  if (!PyObject_TypeCheck(po, &PeerType))
    return raise_status(HIXL_ERR_INVALID, "peer expected");
  PeerObject *p = (PeerObject *)po;
  RmrObject *r;
  if (!peer_ok(p) || rmr_arg(ro, p, &r) < 0)
    return NULL;
  Py_buffer v;
  if (PyObject_GetBuffer(ao, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
    return NULL;
  if (v.ndim != 2 || v.shape[1] != 3 || v.itemsize != 8) {
    PyBuffer_Release(&v);
    return raise_status(HIXL_ERR_INVALID, "(n, 3) uint64 expected");
  }
  size_t n = (size_t)v.shape[0];
  /* What a C program does: its descriptor array exists already. */
  hixl_xfer_t *x = PyMem_Malloc(n * sizeof(*x) + 1);
  const uint64_t *rows = v.buf;
  for (size_t i = 0; i < n; i++)
    x[i] = (hixl_xfer_t){(void *)(uintptr_t)rows[3 * i], r->rmr, rows[3 * i + 1],
                         (size_t)rows[3 * i + 2]};
  PyBuffer_Release(&v);
  hixl_status_t st = HIXL_OK;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t t0 = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  for (Py_ssize_t i = 0; i < iters && st == HIXL_OK; i++) {
    hixl_req_t *req;
    st = hixl_put_batch(p->peer, x, n, NULL, 0, &req);
    if (st == HIXL_OK) {
      st = hixl_req_wait(req, -1);
      hixl_req_free(req);
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t t1 = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  PyMem_Free(x);
  if (st != HIXL_OK)
    return raise_status(st, NULL);
  return PyFloat_FromDouble((double)(t1 - t0) / (double)iters);
}

static PyMethodDef mod_methods[] = {
    {"_xfer_addr", (PyCFunction)(void (*)(void))mod_xfer_addr, METH_FASTCALL,
     "_xfer_addr(peer, rmr, address, nbytes, offset, is_get): no request (fence waits)"},
    {"strerror", mod_strerror, METH_O, "strerror(status) -> name"},
    {"last_error", mod_last_error, METH_NOARGS, "last_error() -> this thread's last message"},
    {"device_backend", mod_device_backend, METH_NOARGS,
     "device_backend() -> \"cuda\", \"ascend\", \"emulated\" or \"none\""},
    {"mem_copy", mod_mem_copy, METH_VARARGS, "mem_copy(dst, src, nbytes): host or device"},
    {"mem_query", mod_mem_query, METH_O, "mem_query(address) -> (\"host\"|\"device\", device)"},
    {"_set_await", mod_set_await, METH_O, NULL},
    {"_bench_put_c", mod_bench_put_c, METH_VARARGS, NULL},
    {"_bench_batch_c", mod_bench_batch_c, METH_VARARGS, NULL},
    {NULL}};

/* ------------------------------------------------------------ types */

static PyTypeObject CtxType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hixl.Context",
    .tp_basicsize = sizeof(CtxObject),
    .tp_dealloc = (destructor)Ctx_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Context(listen=None, transports=None, net_dev=None, auth_token=None,\n"
              "        progress_thread=None, timeout_ms=None, wait=None): a hixl context "
              "(docs/python.md)",
    .tp_methods = Ctx_methods,
    .tp_getset = Ctx_getset,
    .tp_init = (initproc)Ctx_init,
    .tp_new = PyType_GenericNew,
    .tp_weaklistoffset = offsetof(CtxObject, weakreflist),
};

static PyTypeObject PeerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hixl.Peer",
    .tp_basicsize = sizeof(PeerObject),
    .tp_dealloc = (destructor)Peer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A connection to another context (Context.connect, World.peer, notifications)",
    .tp_methods = Peer_methods,
    .tp_getset = Peer_getset,
    .tp_weaklistoffset = offsetof(PeerObject, weakreflist),
    .tp_hash = (hashfunc)Peer_hash,
    .tp_richcompare = Peer_richcompare,
    .tp_repr = (reprfunc)Peer_repr,
};

static PyTypeObject RegionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hixl.Region",
    .tp_basicsize = sizeof(RegionObject),
    .tp_dealloc = (destructor)Region_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A local registered region (Context.register / Context.alloc)",
    .tp_traverse = (traverseproc)Region_traverse,
    .tp_clear = (inquiry)Region_clear,
    .tp_methods = Region_methods,
    .tp_getset = Region_getset,
    .tp_as_buffer = &Region_as_buffer,
    .tp_as_sequence = &Region_as_sequence,
    .tp_dictoffset = offsetof(RegionObject, dict),
    .tp_weaklistoffset = offsetof(RegionObject, weakreflist),
};

static PyTypeObject RmrType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hixl.RemoteRegion",
    .tp_basicsize = sizeof(RmrObject),
    .tp_dealloc = (destructor)Rmr_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A peer's region (Peer.lookup / Peer.unpack / World.exchange)",
    .tp_methods = Rmr_methods,
    .tp_getset = Rmr_getset,
};

static PyTypeObject ReqType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hixl.Request",
    .tp_basicsize = sizeof(ReqObject),
    .tp_dealloc = (destructor)Req_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An outstanding operation (wait=False): done(), wait(timeout), await",
    .tp_methods = Req_methods,
    .tp_getset = Req_getset,
    .tp_as_async = &Req_async,
};

static PyTypeObject WorldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hixl.World",
    .tp_basicsize = sizeof(WorldObject),
    .tp_dealloc = (destructor)World_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "World(rank=None, size=None, rendezvous=None, *, ctx=None) or\n"
              "World(ctx, rank=None, size=None, rendezvous=None): a fixed group of ranks",
    .tp_traverse = (traverseproc)World_traverse,
    .tp_clear = (inquiry)World_clear,
    .tp_methods = World_methods,
    .tp_getset = World_getset,
    .tp_init = (initproc)World_init,
    .tp_new = PyType_GenericNew,
};

static PyStructSequence_Field notif_fields[] = {
    {"peer", "the Peer that sent it"},
    {"imm", "the 32-bit immediate"},
    {"nbytes", "bytes of the put it followed (0 for notify)"},
    {NULL}};
static PyStructSequence_Desc notif_desc = {"hixl.Notification",
                                           "A notification: (peer, imm, nbytes)", notif_fields, 3};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "hixl._hixl",
                                    "The C binding of libhixl (see docs/python.md).", -1,
                                    mod_methods};

PyMODINIT_FUNC PyInit__hixl(void);
PyMODINIT_FUNC PyInit__hixl(void)
{
  PyObject *m = PyModule_Create(&moddef);
  if (m == NULL)
    return NULL;
  PyTypeObject *types[] = {&CtxType, &PeerType, &RegionType, &RmrType, &ReqType, &WorldType};
  const char *names[] = {"Context", "Peer", "Region", "RemoteRegion", "Request", "World"};
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
    if (PyType_Ready(types[i]) < 0)
      goto fail;
    Py_INCREF(types[i]);
    if (PyModule_AddObject(m, names[i], (PyObject *)types[i]) < 0)
      goto fail;
  }
  NotifType = PyStructSequence_NewType(&notif_desc);
  if (NotifType == NULL || PyModule_AddObject(m, "Notification", (PyObject *)NotifType) < 0)
    goto fail;
  Py_INCREF(NotifType);
  Error = PyErr_NewExceptionWithDoc(
      "hixl.Error", "Base of every hixl error; .status is the hixl_status_t", NULL, NULL);
  if (Error == NULL || PyModule_AddObject(m, "Error", Error) < 0)
    goto fail;
  Py_INCREF(Error);
  for (size_t i = 0; i < sizeof(exc_table) / sizeof(exc_table[0]); i++) {
    char qual[64];
    snprintf(qual, sizeof(qual), "hixl.%s", exc_table[i].name);
    PyObject *bases = PyTuple_Pack(2, Error, builtin_for(exc_table[i].status));
    PyObject *cls = bases ? PyErr_NewExceptionWithDoc(qual, exc_table[i].doc, bases, NULL) : NULL;
    Py_XDECREF(bases);
    if (cls == NULL)
      goto fail;
    status_exc[-exc_table[i].status] = cls;
    Py_INCREF(cls);
    if (PyModule_AddObject(m, exc_table[i].name, cls) < 0)
      goto fail;
  }
  if (PyModule_AddIntConstant(m, "READ", HIXL_ACCESS_READ) < 0 ||
      PyModule_AddIntConstant(m, "WRITE", HIXL_ACCESS_WRITE) < 0 ||
      PyModule_AddIntConstant(m, "ATOMIC", HIXL_ACCESS_ATOMIC) < 0 ||
      PyModule_AddIntConstant(m, "ALL", HIXL_ACCESS_READ | HIXL_ACCESS_WRITE | HIXL_ACCESS_ATOMIC) <
          0 ||
      PyModule_AddIntConstant(m, "RKEY_MAX", HIXL_RKEY_MAX) < 0 ||
      PyModule_AddIntConstant(m, "OK", HIXL_OK) < 0 ||
      PyModule_AddIntConstant(m, "INPROGRESS", HIXL_INPROGRESS) < 0)
    goto fail;
  for (size_t i = 0; i < sizeof(exc_table) / sizeof(exc_table[0]); i++) {
    char name[40];
    const char *s = hixl_strerror((hixl_status_t)exc_table[i].status);
    /* "HIXL_ERR_ACCESS: ..." -> ERR_ACCESS */
    size_t k = 0;
    for (const char *q = s + 5; *q && *q != ':' && k + 1 < sizeof(name); q++)
      name[k++] = *q;
    name[k] = 0;
    if (PyModule_AddIntConstant(m, name, exc_table[i].status) < 0)
      goto fail;
  }
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
