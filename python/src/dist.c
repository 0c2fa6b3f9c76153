/*
 * python/src/dist.c — tessera.distributed's C part: ProcessGroup (a ts_process_group joined from the launcher's
 * environment, as `tessera train` joins it), its collectives on torch tensors and NumPy arrays in place (their
 * memory through tspy_tensor_from_object, never a copy), Work (an asynchronous collective, what the DDP hook
 * waits on) and the index lists of the distributed sampler (ts_dist_sampler: torch's DistributedSampler).
 *
 * Waiting. Every collective is submitted asynchronously and waited for with the GIL released, 0.1 s at a time
 * (ts_work_wait_for: a wait that only waits); between two waits the thread takes the GIL back and runs
 * PyErr_CheckSignals, so Ctrl-C interrupts a collective whose peers never come: the group is aborted
 * ("interrupted (KeyboardInterrupt)"), which the peers see at once as this rank gone, and the exception
 * propagates. The group's own timeout and heartbeats still bound every collective (the backend enforces them).
 */
#include "tspy.h"

#include <math.h>
#include <string.h>

#define WAIT_SLICE_S 0.1 /* how often a waiting collective looks for Ctrl-C */

static PyObject *ArgumentError, *DistributedError; /* the module's (_tessera.c adds them before this part) */

/* ---- errors with the Python argument's name --------------------------------------------------------------- */

/* Re-raises the pending exception with "what: " before its message (same type). Returns -1. */
static int prefix_error(const char *what) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    if (s) PyErr_Format(type, "%s: %U", what, s);
    else PyErr_Restore(Py_NewRef(type), Py_XNewRef(value), Py_XNewRef(tb));
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return -1;
}

/* The tensor argument `name` of collective `op` as a ts_tensor (its memory). */
static int tensor_arg(PyObject *x, const char *op, const char *name, ts_tensor **out) {
    if (tspy_tensor_from_object(x, out) == 0) return 0;
    char what[96];
    snprintf(what, sizeof what, "tessera.distributed.%s: %s", op, name);
    return prefix_error(what);
}

static int parse_op(const char *s, const char *op, ts_reduce_op *out) {
    static const struct { const char *name; ts_reduce_op op; } ops[] = {
        {"sum", TS_REDUCE_SUM}, {"avg", TS_REDUCE_AVG}, {"mean", TS_REDUCE_AVG}, {"max", TS_REDUCE_MAX},
        {"min", TS_REDUCE_MIN}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(s, ops[i].name) == 0) {
            *out = ops[i].op;
            return 0;
        }
    PyErr_Format(ArgumentError, "tessera.distributed.%s: unknown op '%s' (sum, avg, max or min)", op, s);
    return -1;
}

/* ---- ProcessGroup ------------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    ts_process_group *pg;
} ProcessGroup;

typedef struct {
    PyObject_HEAD
    ts_work *w;
    PyObject *group;   /* the ProcessGroup (kept alive while the work is) */
    PyObject *tensors; /* the Python tensors it writes and reads, alive until it completes */
} Work;

static PyTypeObject *ProcessGroupType, *WorkType;

static int closed(ProcessGroup *self) {
    if (self->pg) return 0;
    PyErr_SetString(DistributedError, "tessera.distributed: the process group is closed");
    return -1;
}

/* ProcessGroup(backend=None, init_method=None, timeout=None, heartbeat_timeout=None, rank=-1, world_size=-1,
 * group_name=None): joins the job (blocks until every rank has arrived, or the timeout). */
static int pg_init(PyObject *o, PyObject *args, PyObject *kw) {
    ProcessGroup *self = (ProcessGroup *)o;
    static char *names[] = {"backend", "init_method", "timeout", "heartbeat_timeout", "rank", "world_size",
                            "group_name", NULL};
    const char *backend = NULL, *init_method = NULL, *group_name = NULL;
    PyObject *timeout = Py_None, *hb = Py_None;
    int rank = -1, world = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzOOiiz", names, &backend, &init_method, &timeout, &hb, &rank,
                                     &world, &group_name))
        return -1;
    if (self->pg) {
        PyErr_SetString(PyExc_RuntimeError, "tessera.distributed.ProcessGroup: already initialized");
        return -1;
    }
    ts_pg_options po = TS_PG_OPTIONS_INIT;
    po.backend = backend;
    po.init_method = init_method;
    po.group_name = group_name;
    po.rank = rank;
    po.world_size = world;
    if (timeout != Py_None && (po.timeout_s = PyFloat_AsDouble(timeout)) == -1.0 && PyErr_Occurred()) return -1;
    if (hb != Py_None) {
        if ((po.heartbeat_timeout_s = PyFloat_AsDouble(hb)) == -1.0 && PyErr_Occurred()) return -1;
        if (po.heartbeat_timeout_s == 0) po.heartbeat_timeout_s = -1; /* 0 here: no heartbeats */
    }
    ts_process_group *pg = NULL;
    ts_status st;
    Py_BEGIN_ALLOW_THREADS st = ts_pg_new(&po, &pg); /* the rendezvous: waits for every rank */
    Py_END_ALLOW_THREADS
    if (st != TS_OK) {
        tspy_raise(st);
        return -1;
    }
    self->pg = pg;
    return 0;
}

static void pg_free_nogil(ProcessGroup *self) {
    ts_process_group *pg = self->pg;
    self->pg = NULL;
    if (!pg) return;
    Py_BEGIN_ALLOW_THREADS ts_pg_free(pg); /* joins its threads: pending work finishes or fails */
    Py_END_ALLOW_THREADS
}

static void pg_dealloc(PyObject *o) {
    PyTypeObject *tp = Py_TYPE(o);
    pg_free_nogil((ProcessGroup *)o);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(o);
    Py_DECREF(tp);
}

/* Waits for w (owned: freed here) with the GIL released, looking for signals every WAIT_SLICE_S. A signal
 * handler's exception (KeyboardInterrupt) aborts the group so the peers fail fast, and propagates. */
static int wait_work(ts_process_group *pg, ts_work *w) {
    for (;;) {
        bool done;
        Py_BEGIN_ALLOW_THREADS done = ts_work_wait_for(w, WAIT_SLICE_S);
        Py_END_ALLOW_THREADS
        if (done) break;
        if (PyErr_CheckSignals() < 0) {
            char reason[160];
            PyObject *type = PyErr_Occurred(), *tn = type ? PyType_GetName((PyTypeObject *)type) : NULL;
            const char *n = tn ? PyUnicode_AsUTF8AndSize(tn, NULL) : NULL;
            snprintf(reason, sizeof reason, "interrupted (%s)", n ? n : "a signal");
            Py_XDECREF(tn);
            PyObject *et, *ev, *etb;
            PyErr_Fetch(&et, &ev, &etb); /* keep the interrupt; nothing below may see it pending */
            Py_BEGIN_ALLOW_THREADS
            if (pg) ts_pg_abort(pg, reason);
            ts_work_free(w); /* aborted: fails promptly */
            Py_END_ALLOW_THREADS
            PyErr_Restore(et, ev, etb);
            return -1;
        }
    }
    ts_status st = ts_work_wait(w, 0); /* completed: its status */
    ts_work_free(w);
    if (st != TS_OK) {
        tspy_raise(st);
        return -1;
    }
    return 0;
}

/* After a submit: st failed (nothing queued), or a Work object (async_op), or waited for here. */
static PyObject *finish(ProcessGroup *self, ts_status st, ts_work *w, bool async_op, PyObject *tensors) {
    if (st != TS_OK) return tspy_raise(st);
    if (!async_op) {
        if (wait_work(self->pg, w) < 0) return NULL;
        Py_RETURN_NONE;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(WorkType, Py_tp_alloc);
    Work *wk = (Work *)alloc(WorkType, 0);
    if (!wk) {
        Py_BEGIN_ALLOW_THREADS ts_work_free(w);
        Py_END_ALLOW_THREADS
        return NULL;
    }
    wk->w = w;
    wk->group = Py_NewRef((PyObject *)self);
    wk->tensors = Py_XNewRef(tensors);
    return (PyObject *)wk;
}

/* all_reduce(tensor, op="sum", async_op=False) */
static PyObject *pg_all_reduce(PyObject *o, PyObject *args, PyObject *kw) {
    ProcessGroup *self = (ProcessGroup *)o;
    static char *names[] = {"tensor", "op", "async_op", NULL};
    PyObject *x;
    const char *ops = "sum";
    int async_op = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|s$p", names, &x, &ops, &async_op) || closed(self) < 0) return NULL;
    ts_reduce_op op;
    ts_tensor *t;
    if (parse_op(ops, "all_reduce", &op) < 0 || tensor_arg(x, "all_reduce", "tensor", &t) < 0) return NULL;
    ts_work *w = NULL;
    ts_status st = ts_all_reduce(self->pg, t, op, &w); /* checks, then queues: does not block */
    ts_tensor_release(t);                              /* the work holds its own reference */
    return finish(self, st, w, async_op, x);
}

/* broadcast(tensor, src=0, async_op=False) */
static PyObject *pg_broadcast(PyObject *o, PyObject *args, PyObject *kw) {
    ProcessGroup *self = (ProcessGroup *)o;
    static char *names[] = {"tensor", "src", "async_op", NULL};
    PyObject *x;
    int src = 0, async_op = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i$p", names, &x, &src, &async_op) || closed(self) < 0) return NULL;
    ts_tensor *t;
    if (tensor_arg(x, "broadcast", "tensor", &t) < 0) return NULL;
    ts_work *w = NULL;
    ts_status st = ts_broadcast(self->pg, t, src, &w);
    ts_tensor_release(t);
    return finish(self, st, w, async_op, x);
}

/* The two tensors of all_gather / reduce_scatter. */
static int two_tensors(PyObject *out, PyObject *in, const char *op, ts_tensor **to, ts_tensor **ti) {
    if (tensor_arg(out, op, "output", to) < 0) return -1;
    if (tensor_arg(in, op, "input", ti) < 0) {
        ts_tensor_release(*to);
        return -1;
    }
    return 0;
}

/* all_gather(output, input, async_op=False): output holds world_size x input, rank r's at r * numel(input). */
static PyObject *pg_all_gather(PyObject *o, PyObject *args, PyObject *kw) {
    ProcessGroup *self = (ProcessGroup *)o;
    static char *names[] = {"output", "input", "async_op", NULL};
    PyObject *out, *in;
    int async_op = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$p", names, &out, &in, &async_op) || closed(self) < 0) return NULL;
    ts_tensor *to, *ti;
    if (two_tensors(out, in, "all_gather", &to, &ti) < 0) return NULL;
    ts_work *w = NULL;
    ts_status st = ts_all_gather(self->pg, to, ti, &w);
    ts_tensor_release(to);
    ts_tensor_release(ti);
    PyObject *both = PyTuple_Pack(2, out, in);
    PyObject *r = both ? finish(self, st, w, async_op, both) : NULL;
    Py_XDECREF(both);
    return r;
}

/* reduce_scatter(output, input, op="sum", async_op=False): rank r gets the reduction of input's block r. */
static PyObject *pg_reduce_scatter(PyObject *o, PyObject *args, PyObject *kw) {
    ProcessGroup *self = (ProcessGroup *)o;
    static char *names[] = {"output", "input", "op", "async_op", NULL};
    PyObject *out, *in;
    const char *ops = "sum";
    int async_op = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|s$p", names, &out, &in, &ops, &async_op) || closed(self) < 0)
        return NULL;
    ts_reduce_op op;
    ts_tensor *to, *ti;
    if (parse_op(ops, "reduce_scatter", &op) < 0 || two_tensors(out, in, "reduce_scatter", &to, &ti) < 0) return NULL;
    ts_work *w = NULL;
    ts_status st = ts_reduce_scatter(self->pg, to, ti, op, &w);
    ts_tensor_release(to);
    ts_tensor_release(ti);
    PyObject *both = PyTuple_Pack(2, out, in);
    PyObject *r = both ? finish(self, st, w, async_op, both) : NULL;
    Py_XDECREF(both);
    return r;
}

/* barrier(async_op=False) */
static PyObject *pg_barrier(PyObject *o, PyObject *args, PyObject *kw) {
    ProcessGroup *self = (ProcessGroup *)o;
    static char *names[] = {"async_op", NULL};
    int async_op = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$p", names, &async_op) || closed(self) < 0) return NULL;
    ts_work *w = NULL;
    ts_status st = ts_barrier(self->pg, &w);
    return finish(self, st, w, async_op, NULL);
}

/* abort(reason="aborted from Python"): every pending and later call fails; the peers see this rank gone. */
static PyObject *pg_abort(PyObject *o, PyObject *args) {
    ProcessGroup *self = (ProcessGroup *)o;
    const char *reason = "aborted from Python";
    if (!PyArg_ParseTuple(args, "|s", &reason) || closed(self) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS ts_pg_abort(self->pg, reason);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *pg_close(PyObject *o, PyObject *unused) {
    (void)unused;
    pg_free_nogil((ProcessGroup *)o);
    Py_RETURN_NONE;
}

static PyObject *pg_rank(PyObject *o, void *c) {
    (void)c;
    return closed((ProcessGroup *)o) < 0 ? NULL : PyLong_FromLong(ts_pg_rank(((ProcessGroup *)o)->pg));
}
static PyObject *pg_size(PyObject *o, void *c) {
    (void)c;
    return closed((ProcessGroup *)o) < 0 ? NULL : PyLong_FromLong(ts_pg_size(((ProcessGroup *)o)->pg));
}
static PyObject *pg_local_rank(PyObject *o, void *c) {
    (void)c;
    return closed((ProcessGroup *)o) < 0 ? NULL : PyLong_FromLong(ts_pg_local_rank(((ProcessGroup *)o)->pg));
}
static PyObject *pg_backend(PyObject *o, void *c) {
    (void)c;
    return closed((ProcessGroup *)o) < 0 ? NULL : PyUnicode_FromString(ts_pg_backend_name(((ProcessGroup *)o)->pg));
}
static PyObject *pg_timeout(PyObject *o, void *c) {
    (void)c;
    return closed((ProcessGroup *)o) < 0 ? NULL : PyFloat_FromDouble(ts_pg_timeout(((ProcessGroup *)o)->pg));
}
static PyObject *pg_hb_timeout(PyObject *o, void *c) {
    (void)c;
    return closed((ProcessGroup *)o) < 0 ? NULL
                                         : PyFloat_FromDouble(ts_pg_heartbeat_timeout(((ProcessGroup *)o)->pg));
}
static PyObject *pg_links(PyObject *o, void *c) {
    (void)c;
    if (closed((ProcessGroup *)o) < 0) return NULL;
    char buf[512];
    ts_pg_describe_links(((ProcessGroup *)o)->pg, buf, sizeof buf);
    return PyUnicode_FromString(buf);
}
static PyObject *pg_closed(PyObject *o, void *c) {
    (void)c;
    return PyBool_FromLong(((ProcessGroup *)o)->pg == NULL);
}

static PyObject *pg_repr(PyObject *o) {
    ts_process_group *pg = ((ProcessGroup *)o)->pg;
    if (!pg) return PyUnicode_FromString("tessera.distributed.ProcessGroup(closed)");
    return PyUnicode_FromFormat("tessera.distributed.ProcessGroup(rank=%d, world_size=%d, backend='%s')",
                                ts_pg_rank(pg), ts_pg_size(pg), ts_pg_backend_name(pg));
}

static PyGetSetDef pg_getset[] = {
    {"rank", pg_rank, NULL, "This process's rank.", NULL},
    {"world_size", pg_size, NULL, "The number of ranks.", NULL},
    {"local_rank", pg_local_rank, NULL, "The rank among this host's ranks.", NULL},
    {"backend", pg_backend, NULL, "The backend's name: 'builtin', 'mpi' or 'nccl'.", NULL},
    {"timeout", pg_timeout, NULL, "The collective timeout in seconds.", NULL},
    {"heartbeat_timeout", pg_hb_timeout, NULL, "Seconds of silence after which a peer is failed; 0: none.", NULL},
    {"links", pg_links, NULL, "How this rank reaches its peers ('shared memory with ranks 1', ...).", NULL},
    {"closed", pg_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef pg_methods[] = {
    {"all_reduce", TSPY_KW(pg_all_reduce),
     "all_reduce(tensor, op='sum', *, async_op=False): reduces tensor over the ranks in place ('sum', 'avg', 'max', "
     "'min'; float32, bfloat16 on the builtin backend). async_op=True returns a Work."},
    {"broadcast", TSPY_KW(pg_broadcast), "broadcast(tensor, src=0, *, async_op=False): rank src's tensor to every rank."},
    {"all_gather", TSPY_KW(pg_all_gather),
     "all_gather(output, input, *, async_op=False): output (world_size x input's elements) gets every rank's input, "
     "rank r's at offset r * input.numel()."},
    {"reduce_scatter", TSPY_KW(pg_reduce_scatter),
     "reduce_scatter(output, input, op='sum', *, async_op=False): rank r's output is the reduction of block r of "
     "the ranks' inputs (input: world_size x output's elements)."},
    {"barrier", TSPY_KW(pg_barrier), "barrier(*, async_op=False): waits until every rank has called it."},
    {"abort", pg_abort, METH_VARARGS,
     "abort(reason='aborted from Python'): every pending and later call fails; the peers fail fast naming this rank."},
    {"close", pg_close, METH_NOARGS, "Leaves the group: pending work finishes or fails, connections close."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot pg_slots[] = {
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, pg_init},
    {Py_tp_dealloc, pg_dealloc},
    {Py_tp_repr, pg_repr},
    {Py_tp_getset, pg_getset},
    {Py_tp_methods, pg_methods},
    {Py_tp_doc, "ProcessGroup(backend=None, init_method=None, timeout=None, heartbeat_timeout=None, rank=-1, "
                "world_size=-1, group_name=None): joins the job its launcher started (tessera run, torchrun, "
                "mpirun, srun; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT by hand). Collectives on torch tensors "
                "and NumPy arrays in place; Ctrl-C interrupts them."},
    {0, NULL},
};
static PyType_Spec pg_spec = {"tessera.distributed.ProcessGroup", sizeof(ProcessGroup), 0, Py_TPFLAGS_DEFAULT,
                              pg_slots};

/* ---- Work ------------------------------------------------------------------------------------------------ */

static void work_dealloc(PyObject *o) {
    Work *self = (Work *)o;
    PyTypeObject *tp = Py_TYPE(o);
    if (self->w) {
        ts_work *w = self->w;
        self->w = NULL;
        Py_BEGIN_ALLOW_THREADS ts_work_free(w); /* waits first if still running */
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(self->tensors);
    Py_XDECREF(self->group);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(o);
    Py_DECREF(tp);
}

/* wait(): blocks until the collective completed (Ctrl-C interrupts it); raises its error. Again: returns at once. */
static PyObject *work_wait(PyObject *o, PyObject *unused) {
    (void)unused;
    Work *self = (Work *)o;
    if (self->w) {
        ts_work *w = self->w;
        self->w = NULL;
        ProcessGroup *g = (ProcessGroup *)self->group;
        int r = wait_work(g->pg, w);
        Py_CLEAR(self->tensors);
        if (r < 0) return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *work_is_completed(PyObject *o, PyObject *unused) {
    (void)unused;
    Work *self = (Work *)o;
    return PyBool_FromLong(!self->w || ts_work_is_completed(self->w));
}

static PyMethodDef work_methods[] = {
    {"wait", work_wait, METH_NOARGS,
     "Waits until the collective completed (Ctrl-C interrupts it and aborts the group); raises its error."},
    {"is_completed", work_is_completed, METH_NOARGS, "Whether the collective has completed (or failed)."},
    {NULL, NULL, 0, NULL},
};
static PyType_Slot work_slots[] = {
    {Py_tp_dealloc, work_dealloc},
    {Py_tp_methods, work_methods},
    {Py_tp_doc, "An asynchronous collective (async_op=True): wait(), is_completed()."},
    {0, NULL},
};
static PyType_Spec work_spec = {"tessera.distributed.Work", sizeof(Work), 0, Py_TPFLAGS_DEFAULT, work_slots};

/* ---- the sampler ------------------------------------------------------------------------------------------ */

/* _sampler_indices(n, num_replicas, rank, shuffle, seed, drop_last, epoch) -> Tensor (int64): this rank's
 * indices for the epoch, as torch.utils.data.DistributedSampler gives them (ts_dist_sampler). */
static PyObject *sampler_indices(PyObject *mod, PyObject *args) {
    (void)mod;
    long long n, replicas, rank, epoch;
    unsigned long long seed;
    int shuffle, drop_last;
    if (!PyArg_ParseTuple(args, "LLLpKpL", &n, &replicas, &rank, &shuffle, &seed, &drop_last, &epoch)) return NULL;
    ts_dist_sampler s;
    ts_status st = ts_dist_sampler_init(&s, n, replicas, rank, shuffle, seed, drop_last);
    if (st != TS_OK) return tspy_raise(st);
    ts_dist_sampler_set_epoch(&s, epoch);
    int64_t len = ts_dist_sampler_len(&s);
    ts_tensor *t = NULL;
    st = ts_tensor_empty(ts_device_cpu(), TS_I64, 1, &len, &t);
    if (st == TS_OK) {
        Py_BEGIN_ALLOW_THREADS st = ts_dist_sampler_indices(&s, ts_tensor_data(t));
        Py_END_ALLOW_THREADS
    }
    if (st != TS_OK) {
        ts_tensor_release(t);
        return tspy_raise(st);
    }
    return tspy_tensor_wrap(t);
}

static PyObject *sampler_len(PyObject *mod, PyObject *args) {
    (void)mod;
    long long n, replicas, rank;
    int drop_last;
    if (!PyArg_ParseTuple(args, "LLLp", &n, &replicas, &rank, &drop_last)) return NULL;
    ts_dist_sampler s;
    ts_status st = ts_dist_sampler_init(&s, n, replicas, rank, false, 0, drop_last);
    if (st != TS_OK) return tspy_raise(st);
    return PyLong_FromLongLong(ts_dist_sampler_len(&s));
}

static PyMethodDef dist_functions[] = {
    {"_sampler_indices", sampler_indices, METH_VARARGS,
     "_sampler_indices(n, num_replicas, rank, shuffle, seed, drop_last, epoch) -> Tensor(int64): "
     "torch's DistributedSampler indices of this rank for the epoch."},
    {"_sampler_len", sampler_len, METH_VARARGS, "_sampler_len(n, num_replicas, rank, drop_last) -> samples per rank."},
    {NULL, NULL, 0, NULL},
};

int tspy_add_dist(PyObject *m) {
    ArgumentError = PyObject_GetAttrString(m, "ArgumentError");
    DistributedError = PyObject_GetAttrString(m, "DistributedError");
    if (!ArgumentError || !DistributedError) return -1;
    ProcessGroupType = (PyTypeObject *)PyType_FromSpec(&pg_spec);
    WorkType = (PyTypeObject *)PyType_FromSpec(&work_spec);
    if (!ProcessGroupType || !WorkType) return -1;
    if (PyModule_AddObject(m, "ProcessGroup", Py_NewRef((PyObject *)ProcessGroupType)) < 0 ||
        PyModule_AddObject(m, "Work", Py_NewRef((PyObject *)WorkType)) < 0)
        return -1;
    return PyModule_AddFunctions(m, dist_functions);
}
