/*
 * python/src/tspy.h — what the parts of the extension (the C files of python/src, one module
 * `tessera._tessera`) share: the library's errors as Python exceptions, tessera.Tensor, and the hooks each
 * part adds its names through.
 * Every part is C on the stable ABI of Python 3.11 (Py_LIMITED_API) and calls the library only through its
 * public header; a call that can block releases the GIL (Py_BEGIN_ALLOW_THREADS).
 */
#ifndef TSPY_H
#define TSPY_H

#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "tessera.h"

/* The tessera exception class for st (borrowed): tessera.ArgumentError for TS_ERR_INVALID_ARG, ...,
 * tessera.Error for the others. */
PyObject *tspy_error_class(ts_status st);

/* Raises the tessera exception for st (tessera.ArgumentError for TS_ERR_INVALID_ARG, ...) with the library's
 * last error message; returns NULL. */
PyObject *tspy_raise(ts_status st);

/* A tessera.Tensor over t; takes the reference (released on failure). */
PyObject *tspy_tensor_wrap(ts_tensor *t);

/* x's memory as a ts_tensor, not a copy (a new reference in *out): a tessera.Tensor, a torch tensor, a NumPy
 * array, anything with __dlpack__, or a DLPack capsule. -1 with a Python exception set on failure. */
int tspy_tensor_from_object(PyObject *x, ts_tensor **out);

/* The ts_tensor of a tessera.Tensor (borrowed), or NULL when o is not a tessera.Tensor; the type itself
 * (borrowed), for parts that add methods to it (ops.c). */
ts_tensor *tspy_tensor_get(PyObject *o);
PyTypeObject *tspy_tensor_type(void);

/* modules.c: the ts_module of a tessera.nn.Module (borrowed: the Python object owns it), or NULL with an
 * exception set. When a library call that ran a Python module's forward fails, the forward's exception is
 * kept: tspy_module_error_restore() raises it (1) or returns 0 when there is none; _clear drops a stale one. */
ts_module *tspy_module_get(PyObject *obj);
/* The ts_module of a module handle (a capsule from tessera.nn's _h; borrowed), or NULL with TypeError; a new
 * handle that owns m (freed with it), or the library's error for st (m freed) when st is not TS_OK. */
ts_module *tspy_module_handle_get(PyObject *h);
PyObject *tspy_module_handle_new(ts_status st, ts_module *m);
int tspy_module_error_restore(void);
void tspy_module_error_clear(void);

/* A method table entry's function and flags for a function taking (self, args, kwargs). */
#define TSPY_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS

/* "O&" converters. tspy_path_or_none: a path (str, bytes, os.PathLike) as a bytes object in
 * *(PyObject **)addr, or NULL for None. */
int tspy_path_or_none(PyObject *o, void *addr);

/* A sequence of ints (or one int) into v (at most TS_MAX_DIMS); *n its length. -1 with TypeError or
 * tessera.ArgumentError naming `what` on failure. */
int tspy_int64_list(PyObject *o, const char *what, int64_t *v, int *n);

/* Each part adds its functions and types to the module: 0, or -1 with an exception set. */
int tspy_add_pipeline(PyObject *m); /* pipeline.c: tessera.data's ImagePipeline */
int tspy_add_dist(PyObject *m);     /* dist.c: tessera.distributed's process group and collectives */
int tspy_add_train(PyObject *m);    /* train.c: tessera.train, exports */
int tspy_add_ops(PyObject *m);      /* ops.c: ops with autograd on tessera.Tensor, modules written in Python */
int tspy_add_modules(PyObject *m);  /* modules.c (called by ops.c's hook): ts_module handles for tessera.nn */
int tspy_add_text(PyObject *m);     /* text.c: tessera.nn.GPT's generation and files, tessera.data's tokenizers */

#endif
