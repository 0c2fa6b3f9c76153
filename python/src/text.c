/*
 * python/src/text.c — language models and text from Python: tessera.nn.GPT (python/tessera/nn.py) over
 * ts_model_gpt — its construction from a preset and sizes, from a training checkpoint
 * (ts_checkpoint_model_load, as `tessera generate --checkpoint`), its safetensors files in and out, and
 * generation with the key/value cache (ts_gpt_generate, the GIL released) — and tessera.data's tokenizers
 * (ts_tokenizer_bytes / ts_tokenizer_gpt2: encode, decode), `tessera data tokenize` (ts_tokenize_files, the GIL
 * released) and `tessera data info` (ts_token_shard_open).
 *
 * A GPT is a module handle (modules.c: tspy_module_handle_*). A tokenizer handle is a capsule
 * ("tessera.tokenizer") on a tok_handle that owns its ts_tokenizer. The library's tokenizer is for one thread
 * at a time: every use holds the GIL except tokenize, which marks the handle busy while it runs without it,
 * and a use from another thread meanwhile is refused (tessera.Error) instead of racing.
 */
#include "tspy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- GPT ---------------------------------------------------------------------------------------------------- */

/* *v = o unless o is None; -1 with an exception set on failure */
static int opt_i64(PyObject *o, int64_t *v) {
    if (o == Py_None) return 0;
    long long x = PyLong_AsLongLong(o);
    if (x == -1 && PyErr_Occurred()) return -1;
    *v = x;
    return 0;
}

static int opt_f32(PyObject *o, float *v) {
    if (o == Py_None) return 0;
    double x = PyFloat_AsDouble(o);
    if (x == -1.0 && PyErr_Occurred()) return -1;
    *v = (float)x;
    return 0;
}

/* _gpt_new(preset or None, n_layer, n_head, n_embd, seq_len, vocab_size, dropout, layer_norm_eps, init_std,
 * seed) -> handle: the preset (None: GPT-2 small, TS_GPT_CONFIG_INIT) with the sizes that are not None;
 * weights from a generator seeded with seed, or the default generator (tessera.manual_seed) for None */
static PyObject *gpt_new(PyObject *mod, PyObject *args) {
    (void)mod;
    const char *preset;
    PyObject *o[9];
    if (!PyArg_ParseTuple(args, "zOOOOOOOOO", &preset, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8]))
        return NULL;
    ts_gpt_config c = TS_GPT_CONFIG_INIT;
    if (preset && ts_gpt_preset(preset, &c) != TS_OK) return tspy_raise(TS_ERR_INVALID_ARG);
    int64_t seed = 0;
    if (opt_i64(o[0], &c.n_layer) < 0 || opt_i64(o[1], &c.n_head) < 0 || opt_i64(o[2], &c.n_embd) < 0 ||
        opt_i64(o[3], &c.seq_len) < 0 || opt_i64(o[4], &c.vocab_size) < 0 || opt_f32(o[5], &c.dropout) < 0 ||
        opt_f32(o[6], &c.layer_norm_eps) < 0 || opt_f32(o[7], &c.init_std) < 0 || opt_i64(o[8], &seed) < 0)
        return NULL;
    ts_rng rng;
    ts_rng_seed(&rng, (uint64_t)seed);
    ts_module *m = NULL;
    ts_status st = ts_model_gpt(&c, o[8] == Py_None ? NULL : &rng, &m);
    return tspy_module_handle_new(st, m);
}

/* _gpt_presets() -> [name]: ts_gpt_preset's names */
static PyObject *gpt_presets(PyObject *mod, PyObject *unused) {
    (void)mod, (void)unused;
    PyObject *r = PyList_New(0);
    for (int i = 0; r && ts_gpt_preset_name_at(i); i++) {
        PyObject *s = PyUnicode_FromString(ts_gpt_preset_name_at(i));
        if (!s || PyList_Append(r, s) < 0) Py_CLEAR(r);
        Py_XDECREF(s);
    }
    return r;
}

/* _gpt_from_checkpoint(path) -> handle: the GPT a training checkpoint records (its sizes and weights) */
static PyObject *gpt_from_checkpoint(PyObject *mod, PyObject *arg) {
    (void)mod;
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(arg, &path)) return NULL;
    const char *p = PyBytes_AsString(path);
    ts_module *m = NULL;
    ts_gpt_config c;
    ts_status st;
    Py_BEGIN_ALLOW_THREADS st = ts_checkpoint_model_load(p, NULL, &m, NULL); /* reads and checks the whole file */
    Py_END_ALLOW_THREADS
    if (st == TS_OK && ts_gpt_get_config(m, &c) != TS_OK)
        st = ts_error(TS_ERR_INVALID_ARG, "%s holds a %s, not a GPT", p, ts_module_model_name(m));
    Py_DECREF(path);
    return tspy_module_handle_new(st, m);
}

/* v as the shortest decimal that reads back as the same float (1e-05, not 9.999999747378752e-06) */
static double f32_short(float v) {
    char s[32];
    for (int p = 6; p < 9; p++) {
        snprintf(s, sizeof s, "%.*g", p, (double)v);
        if (strtof(s, NULL) == v) return strtod(s, NULL);
    }
    return (double)v;
}

/* _gpt_config(h) -> {n_layer, n_head, n_embd, seq_len, vocab_size, dropout, layer_norm_eps, init_std} */
static PyObject *gpt_config(PyObject *mod, PyObject *h) {
    (void)mod;
    ts_module *m = tspy_module_handle_get(h);
    ts_gpt_config c;
    if (!m) return NULL;
    ts_status st = ts_gpt_get_config(m, &c);
    if (st != TS_OK) return tspy_raise(st);
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L,s:d,s:d,s:d}", "n_layer", (long long)c.n_layer, "n_head",
                         (long long)c.n_head, "n_embd", (long long)c.n_embd, "seq_len", (long long)c.seq_len,
                         "vocab_size", (long long)c.vocab_size, "dropout", f32_short(c.dropout), "layer_norm_eps",
                         f32_short(c.layer_norm_eps), "init_std", f32_short(c.init_std));
}

/* _gpt_safetensors(h, path, save: bool): ts_gpt_save_safetensors or ts_gpt_load_safetensors */
static PyObject *gpt_safetensors(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h, *path = NULL;
    int save;
    if (!PyArg_ParseTuple(args, "OO&p", &h, PyUnicode_FSConverter, &path, &save)) return NULL;
    ts_module *m = tspy_module_handle_get(h);
    const char *p = PyBytes_AsString(path);
    ts_status st = TS_OK;
    if (m) {
        Py_BEGIN_ALLOW_THREADS st = save ? ts_gpt_save_safetensors(m, p) : ts_gpt_load_safetensors(m, p);
        Py_END_ALLOW_THREADS
    }
    Py_DECREF(path);
    if (!m) return NULL;
    if (st != TS_OK) return tspy_raise(st);
    Py_RETURN_NONE;
}

/* The token ids of o into a malloc'd array (*n of them): a sequence of ints, or a tensor (tessera, torch, NumPy)
 * of int64 ids of shape (T) or (1, T). -1 with an exception set on failure. */
static int token_ids(PyObject *o, const char *what, int64_t **ids, Py_ssize_t *n) {
    *ids = NULL;
    if (tspy_tensor_get(o) || (!PyList_Check(o) && !PyTuple_Check(o) && PyObject_HasAttrString(o, "__dlpack__"))) {
        ts_tensor *t = NULL;
        if (tspy_tensor_from_object(o, &t) < 0) return -1;
        char s[96];
        ts_shape_str(ts_tensor_ndim(t), ts_tensor_shape(t), s, sizeof s);
        ts_status st = TS_OK;
        if (ts_tensor_dtype(t) != TS_I64)
            st = ts_error(TS_ERR_DTYPE, "%s: a tensor %s of dtype %s: token ids are int64", what, s,
                          ts_dtype_name(ts_tensor_dtype(t)));
        else if (ts_tensor_ndim(t) != 1 && !(ts_tensor_ndim(t) == 2 && ts_tensor_dim(t, 0) == 1))
            st = ts_error(TS_ERR_SHAPE, "%s: a tensor %s: expected one sequence of token ids, (T) or (1, T)", what, s);
        *n = (Py_ssize_t)ts_tensor_numel(t);
        if (st == TS_OK && !(*ids = malloc(sizeof(int64_t) * (size_t)(*n ? *n : 1))))
            st = ts_error(TS_ERR_NOMEM, "%s: out of memory", what);
        if (st == TS_OK) st = ts_tensor_to_host(t, *ids, sizeof(int64_t) * (size_t)*n);
        ts_tensor_release(t);
        if (st == TS_OK) return 0;
        free(*ids);
        *ids = NULL;
        tspy_raise(st);
        return -1;
    }
    PyObject *seq = PySequence_Check(o) && !PyUnicode_Check(o) && !PyBytes_Check(o) ? PySequence_Tuple(o) : NULL;
    if (!seq) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a list of token ids (ints) or an int64 tensor", what);
        return -1;
    }
    *n = PyTuple_Size(seq);
    *ids = malloc(sizeof(int64_t) * (size_t)(*n ? *n : 1));
    if (!*ids) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *v = PyTuple_GetItem(seq, i);
        if (!PyLong_Check(v)) {
            PyObject *tn = PyType_GetName(Py_TYPE(v));
            PyErr_Format(PyExc_TypeError, "%s: item %zd is a %U, not a token id (int)", what, i, tn);
            Py_XDECREF(tn);
            break;
        }
        (*ids)[i] = PyLong_AsLongLong(v);
        if (PyErr_Occurred()) break;
    }
    Py_DECREF(seq);
    if (!PyErr_Occurred()) return 0;
    free(*ids);
    *ids = NULL;
    return -1;
}

static PyObject *id_list(const int64_t *ids, int64_t n) {
    PyObject *r = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; r && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(ids[i]);
        if (!v) Py_CLEAR(r);
        else PyList_SetItem(r, (Py_ssize_t)i, v); /* steals v */
    }
    return r;
}

/* _gpt_generate(h, prompt_ids, max_new_tokens, temperature, top_k, seed) -> [new token ids] */
static PyObject *gpt_generate(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *h, *prompt;
    long long max_new, top_k;
    unsigned long long seed;
    double temperature;
    if (!PyArg_ParseTuple(args, "OOLdLK", &h, &prompt, &max_new, &temperature, &top_k, &seed)) return NULL;
    ts_module *m = tspy_module_handle_get(h);
    int64_t *ids = NULL, *out = NULL, n_out = 0;
    Py_ssize_t n = 0;
    if (!m || token_ids(prompt, "generate: prompt_ids", &ids, &n) < 0) return NULL;
    ts_gpt_sample_config sc = TS_GPT_SAMPLE_CONFIG_INIT;
    sc.max_new_tokens = max_new;
    sc.temperature = (float)temperature;
    sc.top_k = top_k;
    sc.seed = seed;
    /* room for max_new_tokens (at least one: a negative count reaches the library, which names it) */
    if (max_new <= 0) out = malloc(sizeof(int64_t));
    else if ((unsigned long long)max_new <= SIZE_MAX / sizeof(int64_t)) out = malloc(sizeof(int64_t) * (size_t)max_new);
    ts_status st;
    if (!out) {
        st = ts_error(TS_ERR_NOMEM, "generate: out of memory for max_new_tokens %lld", max_new);
    } else {
        Py_BEGIN_ALLOW_THREADS st = ts_gpt_generate(m, ids, (int64_t)n, &sc, out, &n_out);
        Py_END_ALLOW_THREADS
    }
    free(ids);
    PyObject *r = st == TS_OK ? id_list(out, n_out) : tspy_raise(st);
    free(out);
    return r;
}

/* ---- tokenizers --------------------------------------------------------------------------------------------- */

#define TOK_CAPSULE "tessera.tokenizer"

typedef struct tok_handle {
    ts_tokenizer *t;
    int busy; /* tokenize runs on it without the GIL */
} tok_handle;

static void tok_free(PyObject *cap) {
    tok_handle *h = PyCapsule_GetPointer(cap, TOK_CAPSULE);
    if (!h) return;
    ts_tokenizer_free(h->t);
    free(h);
}

static tok_handle *tok_get(PyObject *cap) {
    tok_handle *h = PyCapsule_IsValid(cap, TOK_CAPSULE) ? PyCapsule_GetPointer(cap, TOK_CAPSULE) : NULL;
    if (!h) PyErr_SetString(PyExc_TypeError, "expected a tessera tokenizer handle");
    else if (h->busy) {
        PyErr_SetString(tspy_error_class(TS_ERR_STATE), "Tokenizer: in use by tessera.data.tokenize in another "
                        "thread (a tokenizer is for one thread at a time: make one per thread)");
        h = NULL;
    }
    return h;
}

/* _tokenizer_new(kind: "bytes" | "gpt2", vocab_json or None, merges_txt or None) -> handle */
static PyObject *tokenizer_new(PyObject *mod, PyObject *args) {
    (void)mod;
    const char *kind;
    PyObject *vocab = NULL, *merges = NULL;
    if (!PyArg_ParseTuple(args, "sO&O&", &kind, tspy_path_or_none, &vocab, tspy_path_or_none, &merges)) {
        Py_XDECREF(vocab);
        return NULL;
    }
    ts_tokenizer_kind k;
    ts_tokenizer *t = NULL;
    ts_status st = ts_tokenizer_kind_parse(kind, &k);
    if (st == TS_OK) {
        const char *v = vocab ? PyBytes_AsString(vocab) : NULL, *mg = merges ? PyBytes_AsString(merges) : NULL;
        Py_BEGIN_ALLOW_THREADS st = ts_tokenizer_new(k, v, mg, &t); /* reads both files */
        Py_END_ALLOW_THREADS
    }
    Py_XDECREF(vocab);
    Py_XDECREF(merges);
    if (st != TS_OK) return tspy_raise(st);
    tok_handle *h = calloc(1, sizeof *h);
    if (!h) {
        ts_tokenizer_free(t);
        return PyErr_NoMemory();
    }
    h->t = t;
    PyObject *cap = PyCapsule_New(h, TOK_CAPSULE, tok_free);
    if (!cap) {
        ts_tokenizer_free(t);
        free(h);
    }
    return cap;
}

/* _tokenizer_info(h) -> (vocab_size, eot: -1 when none) */
static PyObject *tokenizer_info(PyObject *mod, PyObject *cap) {
    (void)mod;
    tok_handle *h = tok_get(cap);
    if (!h) return NULL;
    return Py_BuildValue("(LL)", (long long)ts_tokenizer_vocab_size(h->t), (long long)ts_tokenizer_eot(h->t));
}

/* _tokenizer_encode(h, text: str (UTF-8) or bytes, special: bool) -> [ids] */
static PyObject *tokenizer_encode(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *cap, *text;
    int special;
    if (!PyArg_ParseTuple(args, "OOp", &cap, &text, &special)) return NULL;
    tok_handle *h = tok_get(cap);
    if (!h) return NULL;
    const char *s;
    Py_ssize_t len;
    if (PyUnicode_Check(text)) {
        if (!(s = PyUnicode_AsUTF8AndSize(text, &len))) return NULL;
    } else if (PyBytes_Check(text)) {
        s = PyBytes_AsString(text);
        len = PyBytes_Size(text);
    } else {
        PyObject *tn = PyType_GetName(Py_TYPE(text));
        PyErr_Format(PyExc_TypeError, "Tokenizer.encode: expected str or bytes, not %U", tn);
        Py_XDECREF(tn);
        return NULL;
    }
    ts_token_list l = {0};
    ts_status st = ts_tokenizer_encode(h->t, s, (size_t)len, special, &l);
    PyObject *r = st == TS_OK ? PyList_New((Py_ssize_t)l.n) : tspy_raise(st);
    for (int64_t i = 0; r && i < l.n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(l.ids[i]);
        if (!v) Py_CLEAR(r);
        else PyList_SetItem(r, (Py_ssize_t)i, v);
    }
    free(l.ids);
    return r;
}

/* _tokenizer_decode(h, ids) -> bytes: the C decode's bytes, as they are */
static PyObject *tokenizer_decode(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *cap, *ids_obj;
    if (!PyArg_ParseTuple(args, "OO", &cap, &ids_obj)) return NULL;
    tok_handle *h = tok_get(cap);
    int64_t *ids = NULL;
    Py_ssize_t n = 0;
    if (!h || token_ids(ids_obj, "Tokenizer.decode: ids", &ids, &n) < 0) return NULL;
    uint32_t *u = malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
    ts_status st = u ? TS_OK : ts_error(TS_ERR_NOMEM, "Tokenizer.decode: out of memory");
    for (Py_ssize_t i = 0; st == TS_OK && i < n; i++) {
        if (ids[i] < 0 || ids[i] >= ts_tokenizer_vocab_size(h->t)) /* the library's check, for ids past uint32 too */
            st = ts_error(TS_ERR_INVALID_ARG, "ts_tokenizer_decode: id %lld at position %zd is outside the "
                          "vocabulary of %lld", (long long)ids[i], i, (long long)ts_tokenizer_vocab_size(h->t));
        else u[i] = (uint32_t)ids[i];
    }
    char *text = NULL;
    size_t len = 0;
    if (st == TS_OK) st = ts_tokenizer_decode(h->t, u, (int64_t)n, &text, &len);
    free(ids);
    free(u);
    PyObject *r = st == TS_OK ? PyBytes_FromStringAndSize(text, (Py_ssize_t)len) : tspy_raise(st);
    free(text);
    return r;
}

/* ---- token shards -------------------------------------------------------------------------------------------- */

/* _tokenize(files, out_dir, h, name, val_fraction, val_tokens, shard_tokens, special) -> {result} */
static PyObject *tokenize(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *files, *out = NULL, *cap;
    const char *name;
    double val_fraction;
    long long val_tokens, shard_tokens;
    int special;
    if (!PyArg_ParseTuple(args, "OO&OsdLLp", &files, PyUnicode_FSConverter, &out, &cap, &name, &val_fraction,
                          &val_tokens, &shard_tokens, &special))
        return NULL;
    PyObject *paths = PyList_New(0); /* the files as bytes objects, kept while the library reads them */
    PyObject *seq = paths ? PySequence_Tuple(files) : NULL;
    Py_ssize_t nf = seq ? PyTuple_Size(seq) : 0;
    const char **inputs = seq ? malloc(sizeof(char *) * (size_t)(nf ? nf : 1)) : NULL;
    tok_handle *h = inputs ? tok_get(cap) : NULL;
    PyObject *r = NULL;
    if (seq && !inputs) PyErr_NoMemory();
    for (Py_ssize_t i = 0; h && i < nf; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PyTuple_GetItem(seq, i), &b) || PyList_Append(paths, b) < 0) h = NULL;
        else inputs[i] = PyBytes_AsString(b);
        Py_XDECREF(b);
    }
    if (h) {
        ts_tokenize_opts o = TS_TOKENIZE_OPTS_INIT;
        o.inputs = inputs, o.num_inputs = (int)nf, o.out_dir = PyBytes_AsString(out), o.name = name, o.tok = h->t;
        o.val_fraction = val_fraction, o.val_tokens = val_tokens, o.shard_tokens = shard_tokens;
        o.special = special;
        ts_tokenize_result res;
        ts_status st;
        h->busy = 1;
        Py_BEGIN_ALLOW_THREADS st = ts_tokenize_files(&o, &res);
        Py_END_ALLOW_THREADS
        h->busy = 0;
        r = st != TS_OK ? tspy_raise(st)
                        : Py_BuildValue("{s:L,s:L,s:L,s:L,s:i,s:i,s:L,s:d,s:d,s:d}", "bytes", (long long)res.bytes,
                                        "tokens", (long long)res.tokens, "val_tokens", (long long)res.val_tokens,
                                        "train_tokens", (long long)res.train_tokens, "val_shards", res.val_shards,
                                        "train_shards", res.train_shards, "vocab_size", (long long)res.vocab_size,
                                        "entropy_bits", res.entropy_bits, "entropy_nats", res.entropy_nats,
                                        "seconds", res.seconds);
    }
    free(inputs);
    Py_XDECREF(seq);
    Py_XDECREF(paths);
    Py_DECREF(out);
    return r;
}

/* _token_shard_info(path, vocab_size) -> {tokens, max_id, entropy_bits}: the shard checked whole (vocab_size >
 * 0: every token below it too) */
static PyObject *token_shard_info(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *path = NULL;
    long long vocab;
    if (!PyArg_ParseTuple(args, "O&L", PyUnicode_FSConverter, &path, &vocab)) return NULL;
    const char *p = PyBytes_AsString(path);
    ts_token_shard *s = NULL;
    int64_t n = 0, most = -1;
    double bits = 0;
    ts_status st;
    Py_BEGIN_ALLOW_THREADS st = ts_token_shard_open(p, vocab, &s);
    if (st == TS_OK) {
        const uint16_t *t = ts_token_shard_tokens(s, &n);
        most = ts_token_shard_max_id(s);
        bits = ts_tokens_entropy_bits(t, n);
    }
    Py_END_ALLOW_THREADS
    ts_token_shard_free(s);
    Py_DECREF(path);
    if (st != TS_OK) return tspy_raise(st);
    return Py_BuildValue("{s:L,s:L,s:d}", "tokens", (long long)n, "max_id", (long long)most, "entropy_bits", bits);
}

static PyMethodDef text_methods[] = {
    {"_gpt_new", gpt_new, METH_VARARGS, NULL},
    {"_gpt_presets", gpt_presets, METH_NOARGS, NULL},
    {"_gpt_from_checkpoint", gpt_from_checkpoint, METH_O, NULL},
    {"_gpt_config", gpt_config, METH_O, NULL},
    {"_gpt_safetensors", gpt_safetensors, METH_VARARGS, NULL},
    {"_gpt_generate", gpt_generate, METH_VARARGS, NULL},
    {"_tokenizer_new", tokenizer_new, METH_VARARGS, NULL},
    {"_tokenizer_info", tokenizer_info, METH_O, NULL},
    {"_tokenizer_encode", tokenizer_encode, METH_VARARGS, NULL},
    {"_tokenizer_decode", tokenizer_decode, METH_VARARGS, NULL},
    {"_tokenize", tokenize, METH_VARARGS, NULL},
    {"_token_shard_info", token_shard_info, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

int tspy_add_text(PyObject *m) { return PyModule_AddFunctions(m, text_methods); }
