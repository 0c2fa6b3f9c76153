/*
 * python/src/_tessera.c — the CPython extension under `import tessera` (C, the stable ABI of Python 3.11+):
 * a thin front end over the C library. This part: the library's errors as Python exceptions, and
 * tessera.Tensor, a handle on a ts_tensor that shares its memory with PyTorch and NumPy without a copy —
 * DLPack both ways (__dlpack__ / __dlpack_device__, tessera.from_dlpack) and the buffer protocol
 * (np.asarray(t), memoryview(t)) for host tensors — and checkpoints read as {name: Tensor}.
 */
#include "tspy.h"

#include <string.h>

/* ---- errors ------------------------------------------------------------------------------------------- */

static PyObject *Error, *ArgumentError, *ShapeError, *DtypeError, *DeviceError, *FileError, *FormatError,
    *OutOfMemoryError, *DistributedError, *TimeoutError_, *UnsupportedError;

PyObject *tspy_error_class(ts_status st) {
    switch (st) {
    case TS_ERR_INVALID_ARG: return ArgumentError;
    case TS_ERR_SHAPE: return ShapeError;
    case TS_ERR_DTYPE: return DtypeError;
    case TS_ERR_DEVICE: return DeviceError;
    case TS_ERR_IO: return FileError;
    case TS_ERR_FORMAT: return FormatError;
    case TS_ERR_NOMEM: return OutOfMemoryError;
    case TS_ERR_REMOTE: return DistributedError;
    case TS_ERR_TIMEOUT: return TimeoutError_;
    case TS_ERR_UNSUPPORTED: return UnsupportedError;
    default: return Error;
    }
}

PyObject *tspy_raise(ts_status st) {
    const char *msg = ts_last_error();
    PyErr_SetString(tspy_error_class(st), msg && *msg ? msg : ts_status_str(st));
    return NULL;
}

static int add_error(PyObject *m, PyObject **slot, const char *name, PyObject *bases, const char *doc) {
    char full[64];
    snprintf(full, sizeof full, "tessera.%s", name);
    *slot = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
    if (!*slot) return -1;
    Py_INCREF(*slot);
    return PyModule_AddObject(m, name, *slot);
}

static int add_errors(PyObject *m) {
    if (add_error(m, &Error, "Error", NULL, "A failure reported by the Tessera library (its message says what).") < 0)
        return -1;
#define SUB(slot, name, builtin, doc)                                                                              \
    do {                                                                                                           \
        PyObject *b = builtin ? PyTuple_Pack(2, Error, builtin) : PyTuple_Pack(1, Error);                          \
        int r = b ? add_error(m, &slot, name, b, doc) : -1;                                                        \
        Py_XDECREF(b);                                                                                             \
        if (r < 0) return -1;                                                                                      \
    } while (0)
    SUB(ArgumentError, "ArgumentError", PyExc_ValueError, "A bad argument (a value out of range, a missing item).");
    SUB(ShapeError, "ShapeError", PyExc_ValueError, "Shapes that do not fit together.");
    SUB(DtypeError, "DtypeError", PyExc_TypeError, "A dtype the operation does not take.");
    SUB(DeviceError, "DeviceError", NULL, "A device that is missing, or tensors on different devices.");
    SUB(FileError, "FileError", PyExc_OSError, "A file that cannot be read or written.");
    SUB(FormatError, "FormatError", PyExc_ValueError, "Malformed data in a file or message.");
    SUB(OutOfMemoryError, "OutOfMemoryError", PyExc_MemoryError, "Memory ran out.");
    SUB(DistributedError, "DistributedError", NULL, "Another rank of the job failed.");
    SUB(TimeoutError_, "TimeoutError", PyExc_TimeoutError, "A wait ran past its timeout.");
    SUB(UnsupportedError, "UnsupportedError", NULL, "Something this build or version does not do.");
#undef SUB
    return 0;
}

/* ---- argument converters (tspy.h) ---------------------------------------------------------------------- */

int tspy_path_or_none(PyObject *o, void *addr) {
    if (o == Py_None) {
        *(PyObject **)addr = NULL;
        return 1;
    }
    return PyUnicode_FSConverter(o, addr);
}

int tspy_int64_list(PyObject *o, const char *what, int64_t *v, int *n) {
    if (PyLong_Check(o)) {
        v[0] = PyLong_AsLongLong(o);
        *n = 1;
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *seq = PySequence_Check(o) && !PyUnicode_Check(o) ? PySequence_Tuple(o) : NULL;
    if (!seq) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a sequence of ints", what);
        return -1;
    }
    Py_ssize_t k = PyTuple_Size(seq);
    if (k > TS_MAX_DIMS) {
        Py_DECREF(seq);
        PyErr_Format(tspy_error_class(TS_ERR_INVALID_ARG), "%s: %zd entries; at most %d", what, k, TS_MAX_DIMS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) v[i] = PyLong_AsLongLong(PyTuple_GetItem(seq, i));
    Py_DECREF(seq);
    *n = (int)k;
    return PyErr_Occurred() ? -1 : 0;
}

/* ---- Tensor ------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    ts_tensor *t;
    Py_ssize_t shape[TS_MAX_DIMS], strides[TS_MAX_DIMS]; /* the buffer protocol's (strides in bytes) */
} Tensor;

static PyTypeObject *TensorType;

PyObject *tspy_tensor_wrap(ts_tensor *t) { /* takes the reference */
    allocfunc alloc = (allocfunc)PyType_GetSlot(TensorType, Py_tp_alloc);
    Tensor *self = (Tensor *)alloc(TensorType, 0);
    if (!self) {
        ts_tensor_release(t);
        return NULL;
    }
    self->t = t;
    return (PyObject *)self;
}

static void tensor_dealloc(PyObject *o) {
    Tensor *self = (Tensor *)o;
    PyTypeObject *tp = Py_TYPE(o);
    ts_tensor_release(self->t);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(o);
    Py_DECREF(tp);
}

static PyObject *int_tuple(const int64_t *v, int n) {
    PyObject *tup = PyTuple_New(n);
    for (int i = 0; tup && i < n; i++) PyTuple_SetItem(tup, i, PyLong_FromLongLong(v[i]));
    return tup;
}

static PyObject *tensor_shape(PyObject *o, void *closure) {
    (void)closure;
    ts_tensor *t = ((Tensor *)o)->t;
    return int_tuple(ts_tensor_shape(t), ts_tensor_ndim(t));
}

static PyObject *tensor_strides(PyObject *o, void *closure) {
    (void)closure;
    ts_tensor *t = ((Tensor *)o)->t;
    return int_tuple(ts_tensor_strides(t), ts_tensor_ndim(t));
}

static PyObject *tensor_dtype(PyObject *o, void *closure) {
    (void)closure;
    return PyUnicode_FromString(ts_dtype_name(ts_tensor_dtype(((Tensor *)o)->t)));
}

static PyObject *tensor_device(PyObject *o, void *closure) {
    (void)closure;
    return PyUnicode_FromString(ts_device_name(ts_tensor_device(((Tensor *)o)->t)));
}

static PyObject *tensor_ndim(PyObject *o, void *closure) {
    (void)closure;
    return PyLong_FromLong(ts_tensor_ndim(((Tensor *)o)->t));
}

static PyObject *tensor_data_ptr(PyObject *o, PyObject *unused) {
    (void)unused;
    return PyLong_FromVoidPtr(ts_tensor_address(((Tensor *)o)->t));
}

static PyObject *tensor_repr(PyObject *o) {
    ts_tensor *t = ((Tensor *)o)->t;
    char shape[256];
    ts_shape_str(ts_tensor_ndim(t), ts_tensor_shape(t), shape, sizeof shape);
    return PyUnicode_FromFormat("tessera.Tensor(shape=%s, dtype=%s, device=%s)", shape,
                                ts_dtype_name(ts_tensor_dtype(t)), ts_device_name(ts_tensor_device(t)));
}

/* DLPack capsules: a capsule nobody consumed still owns its struct and calls its deleter. */
static void capsule_versioned(PyObject *cap) {
    if (!PyCapsule_IsValid(cap, "dltensor_versioned")) return; /* renamed "used_...": the consumer owns it */
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
    if (m && m->deleter) m->deleter(m);
}

static void capsule_unversioned(PyObject *cap) {
    if (!PyCapsule_IsValid(cap, "dltensor")) return;
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter) m->deleter(m);
}

static PyObject *tensor_dlpack(PyObject *o, PyObject *args, PyObject *kw) {
    static char *names[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO", names, &stream, &max_version, &dl_device, &copy))
        return NULL;
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "tessera.Tensor.__dlpack__: copy=True is not supported: it shares its "
                        "memory only (copy the result instead)");
        return NULL;
    }
    ts_tensor *t = ((Tensor *)o)->t;
    long major = 0;
    if (max_version != Py_None) {
        PyObject *v0 = PySequence_GetItem(max_version, 0);
        if (!v0) return NULL;
        major = PyLong_AsLong(v0);
        Py_DECREF(v0);
        if (major == -1 && PyErr_Occurred()) return NULL;
    }
    ts_status st;
    if (major >= 1) {
        DLManagedTensorVersioned *m = NULL;
        Py_BEGIN_ALLOW_THREADS st = ts_tensor_to_dlpack(t, &m); /* may synchronise a GPU */
        Py_END_ALLOW_THREADS if (st != TS_OK) return tspy_raise(st);
        PyObject *cap = PyCapsule_New(m, "dltensor_versioned", capsule_versioned);
        if (!cap) m->deleter(m);
        return cap;
    }
    DLManagedTensor *m = NULL;
    Py_BEGIN_ALLOW_THREADS st = ts_tensor_to_dlpack_unversioned(t, &m);
    Py_END_ALLOW_THREADS if (st != TS_OK) return tspy_raise(st);
    PyObject *cap = PyCapsule_New(m, "dltensor", capsule_unversioned);
    if (!cap) m->deleter(m);
    return cap;
}

static PyObject *tensor_dlpack_device(PyObject *o, PyObject *unused) {
    (void)unused;
    ts_device *d = ts_tensor_device(((Tensor *)o)->t);
    if (ts_device_type_of(d) == TS_DEVICE_CUDA) return Py_BuildValue("(ii)", 2, ts_device_index(d)); /* kDLCUDA */
    return Py_BuildValue("(ii)", 1, 0); /* kDLCPU */
}

/* The buffer protocol: host tensors, in place, with their strides; bfloat16 has no struct format. */
static int tensor_getbuffer(PyObject *o, Py_buffer *view, int flags) {
    Tensor *self = (Tensor *)o;
    ts_tensor *t = self->t;
    void *p = ts_tensor_data(t);
    if (!p) {
        PyErr_Format(PyExc_BufferError, "tessera.Tensor on %s: the buffer protocol shares host memory only (use "
                     "DLPack: torch.from_dlpack(t))", ts_device_name(ts_tensor_device(t)));
        return -1;
    }
    const char *fmt = NULL;
    switch (ts_tensor_dtype(t)) {
    case TS_F32: fmt = "f"; break;
    case TS_F16: fmt = "e"; break;
    case TS_I64: fmt = "q"; break;
    case TS_I32: fmt = "i"; break;
    case TS_U8: fmt = "B"; break;
    default:
        PyErr_SetString(PyExc_BufferError, "tessera.Tensor of bfloat16: the buffer protocol has no bfloat16 format "
                        "(use DLPack: torch.from_dlpack(t))");
        return -1;
    }
    int nd = ts_tensor_ndim(t);
    Py_ssize_t es = (Py_ssize_t)ts_dtype_size(ts_tensor_dtype(t));
    for (int i = 0; i < nd; i++) {
        self->shape[i] = (Py_ssize_t)ts_tensor_shape(t)[i];
        self->strides[i] = (Py_ssize_t)ts_tensor_strides(t)[i] * es;
    }
    if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES && !ts_tensor_is_contiguous(t)) {
        PyErr_SetString(PyExc_BufferError, "tessera.Tensor: not contiguous, and the consumer takes no strides");
        return -1;
    }
    view->buf = p;
    view->obj = Py_NewRef(o);
    view->len = (Py_ssize_t)ts_tensor_numel(t) * es;
    view->itemsize = es;
    view->readonly = 0;
    view->format = (flags & PyBUF_FORMAT) ? (char *)fmt : NULL;
    view->ndim = nd;
    view->shape = (flags & PyBUF_ND) ? self->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static void tensor_releasebuffer(PyObject *o, Py_buffer *view) {
    (void)o;
    (void)view; /* the tensor stays alive through view->obj until the consumer is done */
}

static PyGetSetDef tensor_getset[] = {
    {"shape", tensor_shape, NULL, "The sizes of the dimensions.", NULL},
    {"strides", tensor_strides, NULL, "The strides, in elements (torch.Tensor.stride()'s unit).", NULL},
    {"dtype", tensor_dtype, NULL, "'float32', 'float16', 'bfloat16', 'int64', 'int32' or 'uint8'.", NULL},
    {"device", tensor_device, NULL, "'cpu', 'cpu:1', 'cuda:0', ...", NULL},
    {"ndim", tensor_ndim, NULL, "The number of dimensions.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef tensor_methods[] = {
    {"__dlpack__", TSPY_KW(tensor_dlpack),
     "A DLPack capsule sharing this tensor's memory (versioned when max_version >= (1, 0))."},
    {"__dlpack_device__", tensor_dlpack_device, METH_NOARGS, "(device type, index) as DLPack numbers them."},
    {"data_ptr", tensor_data_ptr, METH_NOARGS, "The address of element 0 (as torch.Tensor.data_ptr())."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot tensor_slots[] = {
    {Py_tp_dealloc, tensor_dealloc},
    {Py_tp_repr, tensor_repr},
    {Py_tp_getset, tensor_getset},
    {Py_tp_methods, tensor_methods},
    {Py_bf_getbuffer, tensor_getbuffer},
    {Py_bf_releasebuffer, tensor_releasebuffer},
    {Py_tp_doc, "A tensor of the Tessera library. Shares its memory: torch.from_dlpack(t), np.asarray(t)."},
    {0, NULL},
};

static PyType_Spec tensor_spec = {"tessera.Tensor", sizeof(Tensor), 0, Py_TPFLAGS_DEFAULT, tensor_slots};

/* ---- for the other parts (ops.c adds Tensor's operators and autograd through these) ------------------ */
ts_tensor *tspy_tensor_get(PyObject *o) { return PyObject_TypeCheck(o, TensorType) ? ((Tensor *)o)->t : NULL; }
PyTypeObject *tspy_tensor_type(void) { return TensorType; }

/* ---- module functions --------------------------------------------------------------------------------- */

/* x's memory as a ts_tensor (a new reference in *out): a tessera.Tensor, anything with __dlpack__, or a capsule.
 * -1 with a Python exception set on failure. */
int tspy_tensor_from_object(PyObject *x, ts_tensor **out) {
    *out = NULL;
    if (PyObject_TypeCheck(x, TensorType)) {
        *out = ts_tensor_retain(((Tensor *)x)->t);
        return 0;
    }
    PyObject *cap = NULL;
    if (PyCapsule_IsValid(x, "dltensor_versioned") || PyCapsule_IsValid(x, "dltensor")) {
        cap = Py_NewRef(x);
    } else {
        PyObject *meth = PyObject_GetAttrString(x, "__dlpack__");
        if (!meth) {
            PyErr_Clear();
            PyObject *tn = PyType_GetName(Py_TYPE(x));
            PyErr_Format(PyExc_TypeError, "tessera.from_dlpack: %U objects have no __dlpack__ (pass a torch tensor, "
                         "a NumPy array or a DLPack capsule)", tn);
            Py_XDECREF(tn);
            return -1;
        }
        PyObject *args = PyTuple_New(0), *kw = Py_BuildValue("{s(ii)}", "max_version", 1, 1);
        cap = args && kw ? PyObject_Call(meth, args, kw) : NULL;
        if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) { /* a producer of DLPack < 1.0 */
            PyErr_Clear();
            cap = PyObject_CallNoArgs(meth);
        }
        Py_XDECREF(args);
        Py_XDECREF(kw);
        Py_DECREF(meth);
        if (!cap) return -1;
    }
    ts_tensor *t = NULL;
    ts_status st;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        st = ts_tensor_from_dlpack(PyCapsule_GetPointer(cap, "dltensor_versioned"), &t);
        if (st == TS_OK) PyCapsule_SetName(cap, "used_dltensor_versioned");
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        st = ts_tensor_from_dlpack_unversioned(PyCapsule_GetPointer(cap, "dltensor"), &t);
        if (st == TS_OK) PyCapsule_SetName(cap, "used_dltensor");
    } else {
        Py_DECREF(cap);
        PyErr_SetString(PyExc_TypeError, "tessera.from_dlpack: __dlpack__ did not return an unused DLPack capsule");
        return -1;
    }
    Py_DECREF(cap);
    if (st != TS_OK) {
        tspy_raise(st);
        return -1;
    }
    *out = t;
    return 0;
}

/* tessera.from_dlpack(x): x's memory as a tessera.Tensor (x: anything with __dlpack__, or a capsule). */
static PyObject *from_dlpack(PyObject *mod, PyObject *x) {
    (void)mod;
    if (PyObject_TypeCheck(x, TensorType)) return Py_NewRef(x);
    ts_tensor *t;
    if (tspy_tensor_from_object(x, &t) < 0) return NULL;
    return tspy_tensor_wrap(t);
}

/* tessera.zeros(shape, dtype="float32", device="cpu") */
static PyObject *zeros(PyObject *mod, PyObject *args, PyObject *kw) {
    (void)mod;
    static char *names[] = {"shape", "dtype", "device", NULL};
    PyObject *shape_obj;
    const char *dtype = "float32", *device = "cpu";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ss", names, &shape_obj, &dtype, &device)) return NULL;
    int64_t shape[TS_MAX_DIMS];
    int nd = 0;
    if (tspy_int64_list(shape_obj, "tessera.zeros: shape", shape, &nd) < 0) return NULL;
    ts_dtype dt;
    ts_device *dev = NULL;
    ts_status st = ts_dtype_parse(dtype, &dt);
    if (st == TS_OK) st = ts_device_get(device, &dev);
    ts_tensor *t = NULL;
    if (st == TS_OK) st = ts_tensor_zeros(dev, dt, nd, shape, &t);
    if (st != TS_OK) return tspy_raise(st);
    return tspy_tensor_wrap(t);
}

/* tessera.load_checkpoint(path, prefix="model.") -> {name: Tensor}: the tensors of a Tessera checkpoint whose
 * names start with prefix, the prefix stripped (the model's: PyTorch's parameter and buffer names). */
static PyObject *load_checkpoint(PyObject *mod, PyObject *args, PyObject *kw) {
    (void)mod;
    static char *names[] = {"path", "prefix", NULL};
    PyObject *path = NULL;
    const char *prefix = "model.";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|s", names, PyUnicode_FSConverter, &path, &prefix)) return NULL;
    const char *p = PyBytes_AsString(path);
    ts_ckpt *ck = NULL;
    ts_status st = TS_ERR_INVALID_ARG;
    if (p) {
        Py_BEGIN_ALLOW_THREADS st = ts_ckpt_load(p, &ck); /* reads and checks the whole file */
        Py_END_ALLOW_THREADS
    }
    Py_DECREF(path);
    if (!p) return NULL;
    if (st != TS_OK) return tspy_raise(st);
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    st = ts_ckpt_get_tensors(ck, prefix, &l); /* the list's references outlive ck */
    ts_ckpt_free(ck);
    if (st != TS_OK) return tspy_raise(st);
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < l.n; i++) {
        PyObject *k = PyUnicode_DecodeUTF8(l.names[i], (Py_ssize_t)strlen(l.names[i]), "surrogateescape");
        PyObject *v = k ? tspy_tensor_wrap(ts_tensor_retain(l.tensors[i])) : NULL;
        if (!v || PyDict_SetItem(d, k, v) < 0) Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    ts_tensor_list_clear(&l);
    return d;
}

static PyMethodDef module_methods[] = {
    {"load_checkpoint", TSPY_KW(load_checkpoint),
     "load_checkpoint(path, prefix='model.') -> {name: Tensor}: a Tessera checkpoint's tensors whose names start "
     "with prefix, without it (PyTorch's names for the model's; prefix='' for every tensor)."},
    {"from_dlpack", from_dlpack, METH_O,
     "from_dlpack(x) -> Tensor: x's memory (a torch tensor, a NumPy array, any DLPack producer), not a copy."},
    {"zeros", TSPY_KW(zeros),
     "zeros(shape, dtype='float32', device='cpu') -> Tensor"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tessera._tessera",
                                        "The C extension under `import tessera`.", -1, module_methods,
                                        NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__tessera(void); /* the one exported symbol */

PyMODINIT_FUNC PyInit__tessera(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    TensorType = (PyTypeObject *)PyType_FromSpec(&tensor_spec);
    if (!TensorType || add_errors(m) < 0 || PyModule_AddObject(m, "Tensor", Py_NewRef((PyObject *)TensorType)) < 0 ||
        tspy_add_pipeline(m) < 0 || tspy_add_dist(m) < 0 || tspy_add_train(m) < 0 || tspy_add_ops(m) < 0 ||
        tspy_add_text(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
