/*
 * python/src/modules.c — ts_module handles for tessera.nn (python/tessera/nn.py): a module written in Python
 * is a real ts_module (ts_nn_module_new) whose C forward calls the Python object's forward, so the trainer,
 * the strategies, DDP and checkpoints use it as any module; the built-in layers are nn.h's.
 *
 * A handle is a capsule ("tessera.module") on a ts_module. A module made here is owned by its handle (freed
 * with it) until it is added to a parent (ts_module_add_child, ts_nn_sequential_add), which owns it from then
 * on: the handle's destructor is removed and the Python child keeps its parent alive (nn.py). Handles of
 * children and of the module a forward runs on (a replica under DataParallel, the module itself otherwise)
 * are borrowed.
 *
 * A Python module's C forward (py_forward) takes the GIL (PyGILState_Ensure: the trainer calls it with the
 * GIL released, maybe on another thread), calls obj._tessera_forward(handle of self, x) and returns its
 * tensor. An exception there is fetched and kept (pending_*) while the library unwinds with a ts_status;
 * the Python entry point that made the library call (a module's forward or call here, tessera.train)
 * restores it (tspy_module_error_restore), so the caller gets the forward's own exception.
 */
#include "tspy.h"

#include <stdlib.h>
#include <string.h>

#define CAPSULE "tessera.module"

/* ---- the forward's exception, kept while the library unwinds --------------------------------------------------- */

static PyObject *pending_type, *pending_value, *pending_tb; /* under the GIL */

static void pending_clear(void) {
    Py_CLEAR(pending_type);
    Py_CLEAR(pending_value);
    Py_CLEAR(pending_tb);
}

int tspy_module_error_restore(void) {
    if (!pending_type) return 0;
    PyErr_Restore(pending_type, pending_value, pending_tb);
    pending_type = pending_value = pending_tb = NULL;
    return 1;
}

void tspy_module_error_clear(void) { pending_clear(); }

/* st's exception: the forward's own when one is pending, else the library's. Returns NULL. */
static PyObject *raise_status(ts_status st) {
    if (tspy_module_error_restore()) return NULL;
    return tspy_raise(st);
}

/* ---- handles ------------------------------------------------------------------------------------------------- */

static void capsule_free(PyObject *cap) {
    ts_module *m = PyCapsule_GetPointer(cap, CAPSULE);
    ts_module_free(m); /* a Python module's free_ctx takes the GIL again: reentrant */
}

static PyObject *handle_owned(ts_module *m) {
    PyObject *h = PyCapsule_New(m, CAPSULE, capsule_free);
    if (!h) ts_module_free(m);
    return h;
}

static PyObject *handle_borrowed(ts_module *m) { return PyCapsule_New(m, CAPSULE, NULL); }

static ts_module *handle_get(PyObject *h) {
    ts_module *m = PyCapsule_IsValid(h, CAPSULE) ? PyCapsule_GetPointer(h, CAPSULE) : NULL;
    if (!m) PyErr_SetString(PyExc_TypeError, "expected a tessera module handle");
    return m;
}

ts_module *tspy_module_handle_get(PyObject *h) { return handle_get(h); }

/* The result of a constructor: an owned handle, or the library's error. */
static PyObject *new_result(ts_status st, ts_module *m) {
    if (st != TS_OK) {
        ts_module_free(m);
        return tspy_raise(st);
    }
    return handle_owned(m);
}

PyObject *tspy_module_handle_new(ts_status st, ts_module *m) { return new_result(st, m); }

ts_module *tspy_module_get(PyObject *obj) {
    PyObject *h = PyObject_GetAttrString(obj, "_h");
    if (!h) return NULL;
    ts_module *m = PyCapsule_IsValid(h, CAPSULE) ? PyCapsule_GetPointer(h, CAPSULE) : NULL;
    Py_DECREF(h);
    if (!m) PyErr_SetString(PyExc_TypeError, "model: a tessera.nn.Module whose handle is gone");
    return m;
}

/* ---- modules written in Python --------------------------------------------------------------------------------- */

typedef struct pymod_ctx {
    PyObject *weak; /* a weak reference to the Python module (it owns the handle, not the other way round) */
} pymod_ctx;

static void pymod_free(void *p) {
    pymod_ctx *c = p;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(c->weak);
    PyGILState_Release(g);
    free(c);
}

/* The Python object's exception, kept for the entry point; a status naming it for the library. */
static ts_status forward_failed(const ts_module *self) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    PyObject *s = v ? PyObject_Str(v) : NULL;
    const char *msg = s ? PyUnicode_AsUTF8AndSize(s, NULL) : NULL;
    PyObject *tn = t ? PyType_GetName((PyTypeObject *)t) : NULL;
    const char *tname = tn ? PyUnicode_AsUTF8AndSize(tn, NULL) : NULL;
    ts_status st = ts_error(TS_ERR_STATE, "%s.forward (Python) raised %s: %s", ts_module_type_name(self),
                            tname ? tname : "an exception", msg ? msg : "");
    PyErr_Clear();
    Py_XDECREF(s);
    Py_XDECREF(tn);
    if (!pending_type) { /* the first one wins: what the innermost forward raised */
        pending_type = t, pending_value = v, pending_tb = tb;
    } else {
        Py_XDECREF(t);
        Py_XDECREF(v);
        Py_XDECREF(tb);
    }
    return st;
}

static ts_status py_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    pymod_ctx *c = ts_module_ctx(self);
    PyGILState_STATE g = PyGILState_Ensure();
    ts_status st = TS_OK;
    PyObject *obj = NULL, *h = NULL, *xt = NULL, *r = NULL;
    obj = PyWeakref_GetObject(c->weak); /* borrowed (3.11's stable ABI has no PyWeakref_GetRef) */
    Py_XINCREF(obj);
    if (!obj || obj == Py_None) {
        PyErr_Clear();
        st = ts_error(TS_ERR_STATE, "%s.forward: its Python object is gone", ts_module_type_name(self));
        goto done;
    }
    h = handle_borrowed(self);
    xt = h ? tspy_tensor_wrap(ts_tensor_retain((ts_tensor *)x)) : NULL;
    r = xt ? PyObject_CallMethod(obj, "_tessera_forward", "OO", h, xt) : NULL;
    if (r && tspy_tensor_from_object(r, out) < 0) {
        PyObject *tn = PyType_GetName(Py_TYPE(r));
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s.forward returned %U, not a tensor", ts_module_type_name(self), tn);
        Py_XDECREF(tn);
    }
    if (PyErr_Occurred()) st = forward_failed(self);
done:
    Py_XDECREF(r);
    Py_XDECREF(xt);
    Py_XDECREF(h);
    Py_XDECREF(obj);
    PyGILState_Release(g);
    return st;
}

/* _module_new(obj, type_name) -> handle: a module whose forward is obj._tessera_forward(handle, x). */
static PyObject *module_new(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *obj;
    const char *type_name;
    if (!PyArg_ParseTuple(args, "Os", &obj, &type_name)) return NULL;
    pymod_ctx *c = calloc(1, sizeof *c);
    if (!c) return PyErr_NoMemory();
    c->weak = PyWeakref_NewRef(obj, NULL);
    if (!c->weak) {
        free(c);
        return NULL;
    }
    ts_module *m = NULL;
    ts_status st = ts_nn_module_new(type_name, py_forward, c, pymod_free, &m); /* frees c on failure */
    return new_result(st, m);
}

/* ---- built-in layers ------------------------------------------------------------------------------------------- */

static int pair(PyObject *o, int v[2]) {
    if (PyLong_Check(o)) {
        v[0] = v[1] = (int)PyLong_AsLong(o);
    } else if (!PyArg_ParseTuple(o, "ii", &v[0], &v[1])) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "expected an int or a pair of ints");
        return -1;
    }
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *nn_linear(PyObject *mod, PyObject *args) {
    (void)mod;
    long long in, out;
    int bias;
    if (!PyArg_ParseTuple(args, "LLp", &in, &out, &bias)) return NULL;
    ts_module *m = NULL;
    ts_status st = ts_nn_linear_new(in, out, bias, NULL, &m);
    return new_result(st, m);
}

/* _nn_conv2d(in, out, kernel, stride, padding, dilation, groups, bias) */
static PyObject *nn_conv2d(PyObject *mod, PyObject *args) {
    (void)mod;
    long long in, out;
    PyObject *k, *s, *p, *d;
    int bias, kk[2];
    ts_conv2d_params cp = TS_CONV2D_DEFAULT;
    if (!PyArg_ParseTuple(args, "LLOOOOip", &in, &out, &k, &s, &p, &d, &cp.groups, &bias) || pair(k, kk) < 0 ||
        pair(s, cp.stride) < 0 || pair(p, cp.padding) < 0 || pair(d, cp.dilation) < 0)
        return NULL;
    ts_module *m = NULL;
    ts_status st = ts_nn_conv2d_new(in, out, kk[0], kk[1], cp, bias, NULL, &m);
    return new_result(st, m);
}

/* _nn_batchnorm(ndim 1|2, num_features, eps, momentum (None: cumulative), affine, track) */
static PyObject *nn_batchnorm(PyObject *mod, PyObject *args) {
    (void)mod;
    int nd, affine, track;
    long long n;
    float eps;
    PyObject *mom;
    if (!PyArg_ParseTuple(args, "iLfOpp", &nd, &n, &eps, &mom, &affine, &track)) return NULL;
    float momentum = mom == Py_None ? -1.0f : (float)PyFloat_AsDouble(mom);
    if (PyErr_Occurred()) return NULL;
    ts_module *m = NULL;
    ts_status st = nd == 1 ? ts_nn_batchnorm1d_new(n, eps, momentum, affine, track, &m)
                           : ts_nn_batchnorm2d_new(n, eps, momentum, affine, track, &m);
    return new_result(st, m);
}

static PyObject *nn_layernorm(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *shape;
    float eps;
    int affine;
    if (!PyArg_ParseTuple(args, "Ofp", &shape, &eps, &affine)) return NULL;
    PyObject *seq = PySequence_Fast(shape, "LayerNorm: normalized_shape must be a sequence of ints");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Size(seq);
    int64_t s[TS_MAX_DIMS];
    for (Py_ssize_t i = 0; i < n && i < TS_MAX_DIMS && !PyErr_Occurred(); i++) {
        PyObject *it = PySequence_GetItem(seq, i);
        s[i] = it ? PyLong_AsLongLong(it) : -1;
        Py_XDECREF(it);
    }
    Py_DECREF(seq);
    if (PyErr_Occurred()) return NULL;
    ts_module *m = NULL;
    ts_status st = ts_nn_layernorm_new((int)n, s, eps, affine, &m);
    return new_result(st, m);
}

static PyObject *nn_groupnorm(PyObject *mod, PyObject *args) {
    (void)mod;
    int groups, affine;
    long long ch;
    float eps;
    if (!PyArg_ParseTuple(args, "iLfp", &groups, &ch, &eps, &affine)) return NULL;
    ts_module *m = NULL;
    ts_status st = ts_nn_groupnorm_new(groups, ch, eps, affine, &m);
    return new_result(st, m);
}

/* _nn_pool2d(max: bool, kernel, stride (None: kernel), padding, dilation, ceil_mode, count_include_pad) */
static PyObject *nn_pool2d(PyObject *mod, PyObject *args) {
    (void)mod;
    int is_max, ceil, include;
    PyObject *k, *s, *p, *d;
    if (!PyArg_ParseTuple(args, "pOOOOpp", &is_max, &k, &s, &p, &d, &ceil, &include)) return NULL;
    ts_pool2d_params pp;
    memset(&pp, 0, sizeof pp);
    if (pair(k, pp.kernel) < 0 || (s != Py_None && pair(s, pp.stride) < 0) || pair(p, pp.padding) < 0 ||
        pair(d, pp.dilation) < 0)
        return NULL;
    pp.ceil_mode = ceil;
    pp.exclude_pad = !include;
    ts_module *m = NULL;
    ts_status st = is_max ? ts_nn_maxpool2d_new(pp, &m) : ts_nn_avgpool2d_new(pp, &m);
    return new_result(st, m);
}

/* _nn_simple(kind): "relu", "flatten", "global_avg_pool2d", "sequential" */
static PyObject *nn_simple(PyObject *mod, PyObject *arg) {
    (void)mod;
    const char *k = PyUnicode_AsUTF8AndSize(arg, NULL);
    if (!k) return NULL;
    ts_module *m = NULL;
    ts_status st;
    if (strcmp(k, "relu") == 0) st = ts_nn_relu_new(&m);
    else if (strcmp(k, "flatten") == 0) st = ts_nn_flatten_new(&m);
    else if (strcmp(k, "global_avg_pool2d") == 0) st = ts_nn_global_avgpool2d_new(&m);
    else if (strcmp(k, "sequential") == 0) st = ts_nn_sequential_new(&m);
    else return PyErr_Format(PyExc_ValueError, "_nn_simple: unknown kind '%s'", k);
    return new_result(st, m);
}

static PyObject *nn_dropout(PyObject *mod, PyObject *args) {
    (void)mod;
    float p;
    if (!PyArg_ParseTuple(args, "f", &p)) return NULL;
    ts_module *m = NULL;
    ts_status st = ts_nn_dropout_new(p, NULL, &m);
    return new_result(st, m);
}

static PyObject *nn_embedding(PyObject *mod, PyObject *args) {
    (void)mod;
    long long n, d;
    if (!PyArg_ParseTuple(args, "LL", &n, &d)) return NULL;
    ts_module *m = NULL;
    ts_status st = ts_nn_embedding_new(n, d, NULL, &m);
    return new_result(st, m);
}

/* _model_new(name, num_classes) -> handle: the zoo's model (its initialisation from the default generator) */
static PyObject *model_new(PyObject *mod, PyObject *args) {
    (void)mod;
    const char *name;
    long long classes;
    if (!PyArg_ParseTuple(args, "sL", &name, &classes)) return NULL;
    ts_module *m = NULL;
    ts_status st = ts_model_new(name, classes, NULL, &m);
    return new_result(st, m);
}

/* ---- registering ------------------------------------------------------------------------------------------------- */

/* _module_add(h, what: 0 parameter | 1 buffer, name, tensor or None) */
static PyObject *module_add_tensor(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h, *o;
    int what;
    const char *name;
    if (!PyArg_ParseTuple(args, "OisO", &h, &what, &name, &o)) return NULL;
    ts_module *m = handle_get(h);
    ts_tensor *t = NULL;
    if (!m || (o != Py_None && tspy_tensor_from_object(o, &t) < 0)) return NULL;
    if (what == 0 && t && !ts_tensor_is_leaf(t)) {
        ts_tensor_release(t);
        return PyErr_Format(tspy_error_class(TS_ERR_INVALID_ARG), "%s: parameter '%s' is the result of an op (not "
                            "a leaf): register a leaf (tessera.nn.Parameter(t.detach()))", ts_module_type_name(m), name);
    }
    ts_status st = what == 0 ? ts_module_add_parameter(m, name, t) : ts_module_add_buffer(m, name, t); /* takes t */
    if (st != TS_OK) return tspy_raise(st);
    Py_RETURN_NONE;
}

/* _module_add_child(h, name, child handle): the parent owns the child from now on (a Sequential appends it). */
static PyObject *module_add_child(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h, *ch;
    const char *name;
    if (!PyArg_ParseTuple(args, "OsO", &h, &name, &ch)) return NULL;
    ts_module *m = handle_get(h), *c = m ? handle_get(ch) : NULL;
    if (!c) return NULL;
    if (PyCapsule_GetDestructor(ch) != capsule_free)
        return PyErr_Format(tspy_error_class(TS_ERR_INVALID_ARG), "%s: '%s' (a %s) is already the child of another "
                            "module", ts_module_type_name(m), name, ts_module_type_name(c));
    /* both calls take the child, also on failure: it is no longer the handle's */
    PyCapsule_SetDestructor(ch, NULL);
    ts_status st = ts_module_kind(m) == TS_MODULE_SEQUENTIAL ? ts_nn_sequential_add(m, name, c)
                                                             : ts_module_add_child(m, name, c);
    if (st != TS_OK) {
        PyCapsule_SetName(ch, "tessera.module.freed"); /* the child is gone: its handle is refused from now on */
        return tspy_raise(st);
    }
    Py_RETURN_NONE;
}

/* ---- running --------------------------------------------------------------------------------------------------- */

/* _module_forward(h, x) -> Tensor: ts_module_forward (the forward's own exception when a Python forward raised) */
static PyObject *module_forward(PyObject *mod, PyObject *const *args, Py_ssize_t n) {
    (void)mod;
    if (n != 2) return PyErr_Format(PyExc_TypeError, "_module_forward(h, x)");
    ts_module *m = handle_get(args[0]);
    ts_tensor *x = NULL, *out = NULL;
    if (!m || tspy_tensor_from_object(args[1], &x) < 0) return NULL;
    ts_status st = ts_module_forward(m, x, &out);
    ts_tensor_release(x);
    if (st != TS_OK) {
        ts_tensor_release(out);
        return raise_status(st);
    }
    return tspy_tensor_wrap(out);
}

static PyObject *module_child(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h;
    const char *path;
    if (!PyArg_ParseTuple(args, "Os", &h, &path)) return NULL;
    ts_module *m = handle_get(h);
    if (!m) return NULL;
    ts_module *c = ts_module_child(m, path);
    if (!c) return PyErr_Format(PyExc_AttributeError, "%s has no child '%s'", ts_module_type_name(m), path);
    return handle_borrowed(c);
}

/* _module_same(h1, h2) -> bool: the same ts_module */
static PyObject *module_same(PyObject *mod, PyObject *const *args, Py_ssize_t n) {
    (void)mod;
    if (n != 2) return PyErr_Format(PyExc_TypeError, "_module_same(h1, h2)");
    ts_module *a = handle_get(args[0]), *b = a ? handle_get(args[1]) : NULL;
    if (!b) return NULL;
    return PyBool_FromLong(a == b);
}

/* _module_tensor(h, what: 0 parameter | 1 buffer, name) -> Tensor or None */
static PyObject *module_tensor(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h;
    int what;
    const char *name;
    if (!PyArg_ParseTuple(args, "Ois", &h, &what, &name)) return NULL;
    ts_module *m = handle_get(h);
    if (!m) return NULL;
    ts_tensor *t = what == 0 ? ts_module_param(m, name) : ts_module_buffer(m, name);
    return t ? tspy_tensor_wrap(ts_tensor_retain(t)) : Py_NewRef(Py_None);
}

/* _module_tensors(h, what: 0 parameters | 1 buffers | 2 state dict) -> [(dotted name, Tensor)] */
static PyObject *module_tensors(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h;
    int what;
    if (!PyArg_ParseTuple(args, "Oi", &h, &what)) return NULL;
    ts_module *m = handle_get(h);
    if (!m) return NULL;
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_status st = what == 0 ? ts_module_parameters(m, &l) : what == 1 ? ts_module_buffers(m, &l)
                                                                       : ts_module_state_dict(m, &l);
    if (st != TS_OK) {
        ts_tensor_list_clear(&l);
        return tspy_raise(st);
    }
    PyObject *r = PyList_New(0);
    for (int i = 0; r && i < l.n; i++) {
        PyObject *t = tspy_tensor_wrap(ts_tensor_retain(l.tensors[i]));
        PyObject *pair_ = t ? Py_BuildValue("(sO)", l.names[i], t) : NULL;
        if (!pair_ || PyList_Append(r, pair_) < 0) Py_CLEAR(r);
        Py_XDECREF(pair_);
        Py_XDECREF(t);
    }
    ts_tensor_list_clear(&l);
    return r;
}

/* _module_load_state_dict(h, {name: tensor}, strict, gpt=False): gpt: ts_gpt_load_state_dict (Hugging Face's
 * GPT-2 files as they are: lm_head.weight, GPT2Model's names, the old attention-mask buffers) */
static PyObject *module_load_state_dict(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h, *d;
    int strict, gpt = 0;
    if (!PyArg_ParseTuple(args, "OO!p|p", &h, &PyDict_Type, &d, &strict, &gpt)) return NULL;
    ts_module *m = handle_get(h);
    if (!m) return NULL;
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    ts_status st = TS_OK;
    while (st == TS_OK && PyDict_Next(d, &pos, &key, &value)) {
        const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, NULL) : NULL;
        ts_tensor *t = NULL;
        if (!name || tspy_tensor_from_object(value, &t) < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "load_state_dict: names must be strings");
            ts_tensor_list_clear(&l);
            return NULL;
        }
        st = ts_tensor_list_append(&l, name, t);
        ts_tensor_release(t);
    }
    if (st == TS_OK) st = gpt ? ts_gpt_load_state_dict(m, &l) : ts_module_load_state_dict(m, &l, strict);
    ts_tensor_list_clear(&l);
    if (st != TS_OK) return tspy_raise(st);
    Py_RETURN_NONE;
}

/* _module_train(h, mode or None) -> bool: sets the mode (None: only reads it) */
static PyObject *module_train(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h, *mode;
    if (!PyArg_ParseTuple(args, "OO", &h, &mode)) return NULL;
    ts_module *m = handle_get(h);
    if (!m) return NULL;
    if (mode != Py_None) ts_module_train(m, PyObject_IsTrue(mode));
    return PyBool_FromLong(ts_module_is_training(m));
}

static PyObject *module_to(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h;
    const char *device;
    if (!PyArg_ParseTuple(args, "Os", &h, &device)) return NULL;
    ts_module *m = handle_get(h);
    ts_device *dev = NULL;
    if (!m) return NULL;
    ts_status st = ts_device_get(device, &dev);
    if (st == TS_OK) st = ts_module_to(m, dev);
    if (st != TS_OK) return tspy_raise(st);
    Py_RETURN_NONE;
}

static PyObject *module_zero_grad(PyObject *mod, PyObject *h) {
    (void)mod;
    ts_module *m = handle_get(h);
    if (!m) return NULL;
    ts_module_zero_grad(m);
    Py_RETURN_NONE;
}

static PyObject *module_type_name(PyObject *mod, PyObject *h) {
    (void)mod;
    ts_module *m = handle_get(h);
    return m ? PyUnicode_FromString(ts_module_type_name(m)) : NULL;
}

#define FAST(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL
static PyMethodDef module_methods[] = {
    {"_module_new", module_new, METH_VARARGS, "_module_new(obj, type_name) -> handle (a module written in Python)"},
    {"_nn_linear", nn_linear, METH_VARARGS, NULL},
    {"_nn_conv2d", nn_conv2d, METH_VARARGS, NULL},
    {"_nn_batchnorm", nn_batchnorm, METH_VARARGS, NULL},
    {"_nn_layernorm", nn_layernorm, METH_VARARGS, NULL},
    {"_nn_groupnorm", nn_groupnorm, METH_VARARGS, NULL},
    {"_nn_pool2d", nn_pool2d, METH_VARARGS, NULL},
    {"_nn_simple", nn_simple, METH_O, NULL},
    {"_nn_dropout", nn_dropout, METH_VARARGS, NULL},
    {"_nn_embedding", nn_embedding, METH_VARARGS, NULL},
    {"_model_new", model_new, METH_VARARGS, "_model_new(name, num_classes) -> handle (the zoo's model)"},
    {"_module_add", module_add_tensor, METH_VARARGS, NULL},
    {"_module_add_child", module_add_child, METH_VARARGS, NULL},
    {"_module_forward", FAST(module_forward), NULL},
    {"_module_child", module_child, METH_VARARGS, NULL},
    {"_module_same", FAST(module_same), NULL},
    {"_module_tensor", module_tensor, METH_VARARGS, NULL},
    {"_module_tensors", module_tensors, METH_VARARGS, NULL},
    {"_module_load_state_dict", module_load_state_dict, METH_VARARGS, NULL},
    {"_module_train", module_train, METH_VARARGS, NULL},
    {"_module_to", module_to, METH_VARARGS, NULL},
    {"_module_zero_grad", module_zero_grad, METH_O, NULL},
    {"_module_type_name", module_type_name, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

int tspy_add_modules(PyObject *m) { return PyModule_AddFunctions(m, module_methods); }
