/*
 * train/checkpoint.c — a checkpoint's model (tessera/train.h): the one reader
 * of the model a training checkpoint holds (its zoo name, class count and
 * names, input shape and weights) behind `tessera eval`, `predict`, `export`
 * and `train --resume`, its writer for `tessera ckpt import`, and the export
 * of its state dict as safetensors. The keys are train/ckpt_keys.h's.
 */
#include "train/strategy.h"
#include "train/ckpt_keys.h"

#include <stdio.h>

/* ---- class names: data.classes, one per line ---------------------------------------------------------- */
void ts_checkpoint_model_info_clear(ts_checkpoint_model_info *info) {
    if (!info) return;
    for (int64_t k = 0; k < info->num_class_names; k++) free(info->class_names[k]);
    free(info->class_names);
    memset(info, 0, sizeof *info);
}

const char *ts_checkpoint_class_name(const ts_checkpoint_model_info *info, int64_t k, char *buf, size_t n) {
    if (info && k >= 0 && k < info->num_class_names) return info->class_names[k];
    snprintf(buf, n, "class %lld", (long long)k);
    return buf;
}

static ts_status read_class_names(const ts_ckpt *ck, ts_checkpoint_model_info *info) {
    const void *b = NULL;
    size_t n = 0;
    if (ts_ckpt_get_bytes(ck, CK_DATA_NAMES, &b, &n) != TS_OK || n == 0) return TS_OK;
    const char *p = b, *end = p + n;
    int64_t lines = 0;
    for (const char *q = p; q < end; q++) lines += *q == '\n';
    if (end[-1] != '\n') lines++;
    if (!(info->class_names = ts__calloc((size_t)lines, sizeof *info->class_names))) return TS_ERR_NOMEM;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl ? nl : end) - p);
        char *name = ts__malloc(len + 1);
        if (!name) return TS_ERR_NOMEM;
        memcpy(name, p, len);
        name[len] = '\0';
        info->class_names[info->num_class_names++] = name;
        p += len + 1;
    }
    return TS_OK;
}

/* ---- reading --------------------------------------------------------------------------------------------- */
ts_status ts__checkpoint_model_weights(const ts_ckpt *ck, const char *path, ts_tensor_list *out) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_status st = ts_ckpt_get_tensors(ck, CK_MODEL_PREFIX, &l);
    if (st == TS_OK && l.n == 0)
        st = ts_error(TS_ERR_INVALID_ARG, "%s: the checkpoint holds no " CK_MODEL_PREFIX "* tensors (no model state dict)",
                      path);
    for (int i = 0; i < l.n && st == TS_OK; i++) st = ts_tensor_list_append(out, l.names[i], l.tensors[i]);
    ts_tensor_list_clear(&l);
    return st;
}

/* The model's name: the one the checkpoint records, which `want` (when given) must be; else `want`. */
static ts_status model_name(const ts_ckpt *ck, const char *path, const char *want, char *name, size_t n) {
    const void *b = NULL;
    size_t len = 0;
    char rec[64] = "", esc[200];
    if (ts_ckpt_get_bytes(ck, CK_MODEL, &b, &len) == TS_OK && len > 0) {
        if (len >= sizeof rec || memchr(b, 0, len))
            return ts_error(TS_ERR_FORMAT, "%s: " CK_MODEL " is not a model name (%zu bytes)", path, len);
        memcpy(rec, b, len);
        rec[len] = '\0';
    }
    if (rec[0] && want && strcmp(rec, want) != 0)
        return ts_error(TS_ERR_INVALID_ARG, "%s: this is a %s checkpoint; the model is %s (leave the model unset to "
                        "take the checkpoint's)", path, ts__printable(rec, esc, sizeof esc), want);
    if (!rec[0] && !want)
        return ts_error(TS_ERR_FORMAT, "%s records no model name (" CK_MODEL "): name the model (--model)", path);
    snprintf(name, n, "%s", rec[0] ? rec : want);
    if (!ts_model_info(name, NULL))
        return ts_error(TS_ERR_FORMAT, "%s: model '%s' is not one of the zoo's", path, ts__printable(name, esc, sizeof esc));
    return TS_OK;
}

/* Everything but the weights: name, input, classes (older checkpoints: the rows of sd's output layer). */
static ts_status read_info(const ts_ckpt *ck, const char *path, const char *want, const ts_tensor_list *sd,
                           ts_checkpoint_model_info *info) {
    ts_model_desc md;
    TS_TRY(model_name(ck, path, want, info->model, sizeof info->model));
    ts_model_info(info->model, &md);
    int64_t h = md.image_size;
    ts_ckpt_get_i64(ck, CK_DATA_H, &h);
    if (md.tokens) h = 0; /* a language model: token ids, no image */
    if (!md.fixed_size && !md.tokens && (h < 1 || h > 4096))
        return ts_error(TS_ERR_FORMAT, "%s: " CK_DATA_H " %lld is not an image size", path, (long long)h);
    info->image_size = md.fixed_size ? 0 : (int)h;
    info->channels = md.in_channels;
    info->height = info->width = md.fixed_size ? md.image_size : h;
    ts_ckpt_get_i64(ck, CK_DATA_C, &info->channels);
    ts_ckpt_get_i64(ck, CK_DATA_W, &info->width);
    if (!ts_train_checkpoint_classes(ck, &info->num_classes)) {
        const ts_tensor *w = NULL;
        for (int i = 0; sd && i < sd->n; i++)
            if (ts_tensor_ndim(sd->tensors[i]) == 2 && strstr(sd->names[i], "weight")) w = sd->tensors[i];
        info->num_classes = w ? ts_tensor_shape(w)[0] : 0;
    }
    if (info->num_classes < 1 || info->num_classes > (1 << 24))
        return ts_error(TS_ERR_FORMAT, "%s: %lld classes", path, (long long)info->num_classes);
    return read_class_names(ck, info);
}

/* ---- a GPT's configuration: gpt.* ------------------------------------------------------------------------ */
ts_status ts__checkpoint_save_model_config(ts_ckpt *ck, const ts_module *m) {
    ts_gpt_config g;
    if (!m || ts_module_model_name(m) == NULL || strcmp(ts_module_model_name(m), "gpt2") != 0 ||
        ts_gpt_get_config(m, &g) != TS_OK) {
        ts_clear_error();
        return TS_OK;
    }
    TS_TRY(ts_ckpt_set_i64(ck, CK_GPT_N_LAYER, g.n_layer));
    TS_TRY(ts_ckpt_set_i64(ck, CK_GPT_N_HEAD, g.n_head));
    TS_TRY(ts_ckpt_set_i64(ck, CK_GPT_N_EMBD, g.n_embd));
    TS_TRY(ts_ckpt_set_i64(ck, CK_GPT_SEQ_LEN, g.seq_len));
    TS_TRY(ts_ckpt_set_i64(ck, CK_GPT_VOCAB, g.vocab_size));
    TS_TRY(ts_ckpt_set_f64(ck, CK_GPT_EPS, g.layer_norm_eps));
    TS_TRY(ts_ckpt_set_f64(ck, CK_GPT_DROPOUT, g.dropout));
    return ts_ckpt_set_f64(ck, CK_GPT_INIT_STD, g.init_std);
}

/* The gpt.* keys into *g (*has: whether the checkpoint records a GPT); checked as ts_gpt_config_check does. */
static ts_status read_gpt_config(const ts_ckpt *ck, const char *path, ts_gpt_config *g, bool *has) {
    *g = TS_GPT_CONFIG_INIT;
    *has = ts_ckpt_get_i64(ck, CK_GPT_N_LAYER, &g->n_layer) == TS_OK;
    if (!*has) return TS_OK;
    double eps = g->layer_norm_eps, drop = 0.0, std = g->init_std;
    ts_status st = ts_ckpt_get_i64(ck, CK_GPT_N_HEAD, &g->n_head);
    if (st == TS_OK) st = ts_ckpt_get_i64(ck, CK_GPT_N_EMBD, &g->n_embd);
    if (st == TS_OK) st = ts_ckpt_get_i64(ck, CK_GPT_SEQ_LEN, &g->seq_len);
    if (st == TS_OK) st = ts_ckpt_get_i64(ck, CK_GPT_VOCAB, &g->vocab_size);
    if (st == TS_OK) st = ts_ckpt_get_f64(ck, CK_GPT_EPS, &eps);
    if (st == TS_OK) st = ts_ckpt_get_f64(ck, CK_GPT_DROPOUT, &drop);
    if (st == TS_OK) st = ts_ckpt_get_f64(ck, CK_GPT_INIT_STD, &std);
    g->layer_norm_eps = (float)eps;
    g->dropout = (float)drop;
    g->init_std = (float)std;
    if (st == TS_OK) st = ts_gpt_config_check(g);
    return st == TS_OK ? TS_OK : ts_error(TS_ERR_FORMAT, "%s: its GPT configuration (gpt.*) is incomplete or invalid: %s",
                                          path, ts_last_error());
}

static ts_status build(const char *path, const ts_checkpoint_model_info *info, const ts_tensor_list *sd,
                       const ts_gpt_config *gpt, ts_module **out) {
    ts_module *m = NULL;
    if (gpt)
        TS_TRY(ts_model_gpt(gpt, NULL, &m));
    else
        TS_TRY(ts_model_new(info->model, info->num_classes, NULL, &m));
    ts_status st = ts_module_load_state_dict(m, sd, true);
    if (st != TS_OK) {
        char why[TS_ERRMSG_MAX]; /* ts_error writes the buffer ts_last_error reads: copy it first */
        snprintf(why, sizeof why, "%s", ts_last_error());
        ts_module_free(m);
        return ts_error(st, "%s: the weights do not fit model %s with %lld classes: %s", path, info->model,
                        (long long)info->num_classes, why);
    }
    ts_module_train(m, false);
    *out = m;
    return TS_OK;
}

ts_status ts_checkpoint_model_load(const char *path, const char *model, ts_module **out,
                                   ts_checkpoint_model_info *info) {
    ts_checkpoint_model_info own = {0}, *in = info ? info : &own;
    if (info) memset(info, 0, sizeof *info);
    if (out) *out = NULL;
    TS_ARG(path, "ts_checkpoint_model_load: NULL path");
    ts_ckpt *ck = NULL;
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    ts_status st;
    TS_CHECK_GOTO(ts_ckpt_load(path, &ck));
    TS_CHECK_GOTO(ts__checkpoint_model_weights(ck, path, &sd));
    TS_CHECK_GOTO(read_info(ck, path, model, &sd, in));
    ts_gpt_config gpt;
    bool has_gpt = false;
    TS_CHECK_GOTO(read_gpt_config(ck, path, &gpt, &has_gpt));
    if (has_gpt) in->seq_len = gpt.seq_len;
    if (out) TS_CHECK_GOTO(build(path, in, &sd, has_gpt ? &gpt : NULL, out));
fail:
    ts_tensor_list_clear(&sd);
    ts_ckpt_free(ck);
    ts_checkpoint_model_info_clear(&own);
    return st;
}

/* ---- writing --------------------------------------------------------------------------------------------- */
static ts_status write_class_names(ts_ckpt *ck, const ts_checkpoint_model_info *info) {
    size_t len = 0;
    for (int64_t k = 0; k < info->num_class_names; k++) {
        if (!info->class_names[k] || strchr(info->class_names[k], '\n'))
            return ts_error(TS_ERR_INVALID_ARG, "ts_checkpoint_model_save: class name %lld is NULL or holds a "
                            "line break", (long long)k);
        len += strlen(info->class_names[k]) + 1;
    }
    char *buf = ts__malloc(len ? len : 1), *w = buf;
    if (!buf) return TS_ERR_NOMEM;
    for (int64_t k = 0; k < info->num_class_names; k++) {
        size_t n = strlen(info->class_names[k]);
        memcpy(w, info->class_names[k], n);
        w[n] = '\n';
        w += n + 1;
    }
    ts_status st = ts_ckpt_set_bytes(ck, CK_DATA_NAMES, buf, len);
    free(buf);
    return st;
}

ts_status ts_checkpoint_model_save(const char *path, ts_module *model, const ts_checkpoint_model_info *info) {
    TS_ARG(path && model && info, "ts_checkpoint_model_save: NULL argument");
    ts_model_desc md;
    TS_ARG(ts_model_info(info->model, &md), "ts_checkpoint_model_save: model '%s' is not one of the zoo's",
           info->model);
    ts_ckpt *ck = ts_ckpt_new();
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    if (!ck) return TS_ERR_NOMEM;
    int64_t side = md.fixed_size || info->image_size <= 0 ? md.image_size : info->image_size;
    ts_status st;
    TS_CHECK_GOTO(ts_module_state_dict(model, &sd));
    TS_CHECK_GOTO(ts_ckpt_add_tensors(ck, CK_MODEL_PREFIX, &sd));
    TS_CHECK_GOTO(ts_ckpt_set_bytes(ck, CK_MODEL, info->model, strlen(info->model)));
    TS_CHECK_GOTO(ts__checkpoint_save_model_config(ck, model));
    TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_DATA_CLASSES, info->num_classes > 0 ? info->num_classes : md.num_classes));
    TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_DATA_C, info->channels > 0 ? info->channels : md.in_channels));
    TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_DATA_H, info->height > 0 ? info->height : side));
    TS_CHECK_GOTO(ts_ckpt_set_i64(ck, CK_DATA_W, info->width > 0 ? info->width : side));
    if (info->num_class_names > 0) TS_CHECK_GOTO(write_class_names(ck, info));
    TS_CHECK_GOTO(ts_ckpt_save(ck, path));
fail:
    ts_tensor_list_clear(&sd);
    ts_ckpt_free(ck);
    return st;
}

/* ---- the state dict as safetensors (tessera/safetensors.h) ---------------------------------------------- */
ts_status ts_safetensors_export_ckpt(const char *ckpt_path, const char *out_path, int *ntensors) {
    TS_ARG(ckpt_path && out_path, "ts_safetensors_export_ckpt: NULL argument");
    ts_ckpt *ck = NULL;
    TS_TRY(ts_ckpt_load(ckpt_path, &ck));
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
    ts_status st;
    TS_CHECK_GOTO(ts__checkpoint_model_weights(ck, ckpt_path, &l));
    TS_CHECK_GOTO(ts_safetensors_meta_set(&m, "format", "pt"));
    TS_CHECK_GOTO(ts_safetensors_meta_set(&m, "producer", "tessera"));
    const void *name = NULL;
    size_t nlen = 0;
    if (ts_ckpt_get_bytes(ck, CK_MODEL, &name, &nlen) == TS_OK && nlen > 0 && nlen < 64) {
        char model[64];
        bool printable = true;
        for (size_t i = 0; i < nlen; i++) printable = printable && ((const unsigned char *)name)[i] >= 0x20 &&
                                                     ((const unsigned char *)name)[i] < 0x7f;
        memcpy(model, name, nlen);
        model[nlen] = '\0';
        if (printable) TS_CHECK_GOTO(ts_safetensors_meta_set(&m, "model", model));
    }
    static const char *const keys[2] = {CK_EPOCH, CK_STEP}, *const meta[2] = {"epoch", "step"};
    for (int i = 0; i < 2; i++) {
        char val[24];
        int64_t v = 0;
        if (ts_ckpt_get_i64(ck, keys[i], &v) != TS_OK) continue;
        snprintf(val, sizeof val, "%lld", (long long)v);
        TS_CHECK_GOTO(ts_safetensors_meta_set(&m, meta[i], val));
    }
    ts_clear_error();
    TS_CHECK_GOTO(ts_safetensors_save(out_path, &l, &m));
    if (ntensors) *ntensors = l.n;
fail:
    ts_safetensors_meta_clear(&m);
    ts_tensor_list_clear(&l);
    ts_ckpt_free(ck);
    return st;
}

/* ---- the model an export writes ------------------------------------------------------------------------- */
/* A GPT's example input: token ids uniform in [0, vocab) from seed + 1, (1, seq_len) or shape (2 dims). */
static ts_status gpt_example(const ts_gpt_config *g, uint64_t seed, int ndim, const int64_t *shape, ts_module **m,
                             ts_tensor **example) {
    int64_t dims[2] = {1, g->seq_len};
    ts_status st = TS_OK;
    if (ndim != 0 && (ndim != 2 || shape[1] > g->seq_len))
        st = ts_error(TS_ERR_INVALID_ARG, "export: a GPT takes token ids (batch, sequence) with sequence <= %lld; "
                      "the input shape has %d dimensions", (long long)g->seq_len, ndim);
    if (st == TS_OK && ndim == 2) dims[0] = shape[0], dims[1] = shape[1];
    if (st == TS_OK) st = ts_tensor_empty(ts_device_cpu(), TS_I64, 2, dims, example);
    if (st == TS_OK) {
        ts_rng rng;
        ts_rng_seed(&rng, seed + 1);
        int64_t *ids = ts_tensor_data(*example);
        for (int64_t i = 0; i < dims[0] * dims[1]; i++) ids[i] = (int64_t)(ts_rng_uniform(&rng) * (double)g->vocab_size) % g->vocab_size;
    }
    if (st != TS_OK) {
        ts_tensor_release(*example), *example = NULL;
        ts_module_free(*m), *m = NULL;
    }
    return st;
}

ts_status ts_export_model_new(const char *checkpoint, const char *model, uint64_t seed, int ndim,
                              const int64_t *shape, ts_module **m, ts_tensor **example, const char **name) {
    TS_ARG(m && example, "ts_export_model_new: NULL output");
    TS_ARG(checkpoint || model, "export: a model name or a checkpoint is needed");
    TS_ARG(ndim >= 0 && ndim <= TS_MAX_DIMS && (ndim == 0 || shape), "export: input shape: %d dimensions", ndim);
    for (int i = 0; i < ndim; i++)
        TS_ARG(shape[i] >= 1 && shape[i] <= ((int64_t)1 << 31), "export: input shape: dimension %d is %lld", i,
               (long long)shape[i]);
    *m = NULL, *example = NULL;
    ts_checkpoint_model_info info = {0};
    ts_rng rng;
    ts_rng_seed(&rng, seed);
    ts_status st = checkpoint ? ts_checkpoint_model_load(checkpoint, model, m, &info) : ts_model_new(model, 0, &rng, m);
    if (st != TS_OK) {
        ts_checkpoint_model_info_clear(&info);
        return st;
    }
    int64_t dims[TS_MAX_DIMS];
    ts_model_desc md;
    ts_model_info(checkpoint ? info.model : model, &md);
    if (name) *name = md.name;
    ts_gpt_config gpt;
    if (md.tokens && ts_gpt_get_config(*m, &gpt) == TS_OK) { /* a language model: token ids, 1 x its context */
        ts_checkpoint_model_info_clear(&info);
        return gpt_example(&gpt, seed, ndim, shape, m, example);
    }
    if (ndim == 0) { /* 1 x the checkpoint's recorded input, else the model's */
        dims[0] = 1, dims[1] = info.channels > 0 ? info.channels : md.in_channels;
        dims[2] = info.height > 0 ? info.height : md.image_size, dims[3] = info.width > 0 ? info.width : md.image_size;
        ndim = 4;
    } else {
        memcpy(dims, shape, (size_t)ndim * sizeof *dims);
    }
    ts_checkpoint_model_info_clear(&info);
    ts_rng_seed(&rng, seed + 1);
    st = ts_tensor_empty(ts_device_cpu(), TS_F32, ndim, dims, example);
    if (st == TS_OK) st = ts_tensor_normal_(*example, 0, 1, &rng);
    if (st != TS_OK) {
        ts_tensor_release(*example), *example = NULL;
        ts_module_free(*m), *m = NULL;
    }
    return st;
}
