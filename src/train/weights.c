/*
 * train/weights.c — a model's weights from a file (tessera/train.h): a safetensors file
 * (PyTorch's state-dict names, e.g. written by safetensors.torch.save_file or `tessera ckpt
 * export`) or a Tessera checkpoint's model.* tensors, told apart by their first bytes
 * (ts_safetensors_probe), then loaded strictly: every missing, unexpected or mismatched
 * tensor is named before anything is copied (ts_module_load_state_dict).
 */
#include "train/strategy.h"
#include "train/ckpt_keys.h"

/* ts_weights_read, and the model a checkpoint was saved from (train.model) into model[0, n) ("" when none). */
static ts_status weights_read(const char *path, ts_tensor_list *out, const char **format, char *model, size_t n) {
    if (model) model[0] = '\0';
    if (ts_safetensors_probe(path)) {
        if (format) *format = "safetensors";
        return ts_safetensors_load(path, TS_SAFETENSORS_F32, out, NULL);
    }
    ts_ckpt *ck = NULL;
    ts_status st = ts_ckpt_load(path, &ck);
    if (st == TS_ERR_FORMAT && strstr(ts_last_error(), "bad magic"))
        return ts_error(TS_ERR_FORMAT, "%s: neither a safetensors file nor a Tessera checkpoint", path);
    if (st != TS_OK) return st;
    const void *b = NULL;
    size_t bn = 0;
    if (model && ts_ckpt_get_bytes(ck, CK_MODEL, &b, &bn) == TS_OK && bn < n) {
        memcpy(model, b, bn);
        model[bn] = '\0';
    }
    st = ts__checkpoint_model_weights(ck, path, out);
    ts_ckpt_free(ck);
    if (format) *format = "checkpoint";
    return st;
}

ts_status ts_weights_read(const char *path, ts_tensor_list *out, const char **format) {
    TS_ARG(path && out, "ts_weights_read: NULL argument");
    return weights_read(path, out, format, NULL, 0);
}

ts_status ts_weights_load(ts_module *model, const char *path) { return ts_weights_load_except(model, path, NULL); }

/* name is under one of the comma-separated prefixes of list: "fc" covers "fc.weight", "fc.bias". */
static bool excluded(const char *name, const char *list) {
    for (const char *p = list; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len && strncmp(name, p, len) == 0 && (name[len] == '\0' || name[len] == '.' || p[len - 1] == '.'))
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

ts_status ts_weights_load_except(ts_module *model, const char *path, const char *exclude) {
    TS_ARG(model && path, "ts_weights_load: NULL argument");
    ts_tensor_list file = TS_TENSOR_LIST_INIT, sd = TS_TENSOR_LIST_INIT, own = TS_TENSOR_LIST_INIT;
    char saved[64]; /* a checkpoint's train.model: the mismatch message names it */
    ts_status st = weights_read(path, &file, NULL, saved, sizeof saved);
    int dropped = 0, kept = 0;
    if (st == TS_OK && exclude) {
        /* the file's entries under the prefixes go; the model's own take their place (copied onto themselves) */
        st = ts_module_state_dict(model, &own);
        for (int i = 0; i < file.n && st == TS_OK; i++) {
            if (excluded(file.names[i], exclude))
                dropped++;
            else
                st = ts_tensor_list_append(&sd, file.names[i], file.tensors[i]);
        }
        for (int i = 0; i < own.n && st == TS_OK; i++)
            if (excluded(own.names[i], exclude)) {
                kept++;
                st = ts_tensor_list_append(&sd, own.names[i], own.tensors[i]);
            }
        if (st == TS_OK && kept == 0)
            st = ts_error(TS_ERR_INVALID_ARG, "%s: no tensor of the model is under '%s' (the prefixes to keep)", path,
                          exclude);
    }
    if (st == TS_OK &&
        (st = ts_module_load_state_dict_from(model, exclude ? &sd : &file, true, saved[0] ? saved : NULL)) != TS_OK)
        ts__error_prefix(st, "%s", path);
    (void)dropped;
    ts_tensor_list_clear(&file);
    ts_tensor_list_clear(&sd);
    ts_tensor_list_clear(&own);
    return st;
}

/* ---- `tessera ckpt import` ------------------------------------------------------------------------------ */
/* The name of model's output layer weight: its last 2-D tensor named "...weight" (fc.weight for the ResNets,
 * the last Linear's for cnn and mlp), or NULL. Borrowed from sd. */
static const char *output_weight(const ts_tensor_list *sd) {
    const char *name = NULL;
    for (int i = 0; i < sd->n; i++) {
        size_t n = strlen(sd->names[i]);
        if (ts_tensor_ndim(sd->tensors[i]) == 2 && n >= 6 && strcmp(sd->names[i] + n - 6, "weight") == 0)
            name = sd->names[i];
    }
    return name;
}

/* The classes the weights at path were trained for: the rows of the file's tensor named as model's output
 * weight; 0 when the file has none (the strict load then names what does not fit). */
static ts_status infer_classes(const char *path, const char *model, int64_t *classes) {
    ts_module *m = NULL;
    ts_tensor_list sd = TS_TENSOR_LIST_INIT, file = TS_TENSOR_LIST_INIT;
    ts_rng rng;
    ts_rng_seed(&rng, 0);
    *classes = 0;
    ts_status st;
    TS_CHECK_GOTO(ts_model_new(model, 0, &rng, &m));
    TS_CHECK_GOTO(ts_module_state_dict(m, &sd));
    TS_CHECK_GOTO(ts_weights_read(path, &file, NULL));
    const char *out = output_weight(&sd);
    for (int i = 0; out && i < file.n; i++)
        if (strcmp(file.names[i], out) == 0 && ts_tensor_ndim(file.tensors[i]) == 2)
            *classes = ts_tensor_shape(file.tensors[i])[0];
    if (*classes > TS_MAX_CLASSES) {
        char nb[160];
        st = ts_error(TS_ERR_FORMAT, "%s: '%s' has %lld rows: more than the %d classes a model may have", path,
                      ts__printable(out, nb, sizeof nb), (long long)*classes, TS_MAX_CLASSES);
    }
fail:
    ts_tensor_list_clear(&sd);
    ts_tensor_list_clear(&file);
    ts_module_free(m);
    return st;
}

ts_status ts_checkpoint_import(const char *path, const char *model, int64_t num_classes, int image_size,
                               const char *out, ts_checkpoint_model_info *written, int *ntensors) {
    TS_ARG(path && model && out, "ts_checkpoint_import: NULL argument");
    TS_ARG(num_classes >= 0 && num_classes <= TS_MAX_CLASSES && image_size >= 0 && image_size <= 4096,
           "ts_checkpoint_import: num_classes %lld or image_size %d out of range", (long long)num_classes, image_size);
    ts_model_desc md;
    ts_module *m = NULL;
    if (!ts_model_info(model, &md)) return ts_model_new(model, 0, NULL, &m); /* fails: the zoo's message */
    if (written) memset(written, 0, sizeof *written);
    int64_t classes = num_classes;
    if (!classes) TS_TRY(infer_classes(path, model, &classes));
    if (!classes) classes = md.num_classes;
    ts_rng rng;
    ts_rng_seed(&rng, 0);
    ts_checkpoint_model_info info = {0}; /* the input tessera eval/predict/export will feed it */
    snprintf(info.model, sizeof info.model, "%s", model);
    info.num_classes = classes;
    info.image_size = md.fixed_size ? 0 : image_size;
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    ts_status st;
    TS_CHECK_GOTO(ts_model_new(model, classes, &rng, &m));
    TS_CHECK_GOTO(ts_weights_load(m, path));
    TS_CHECK_GOTO(ts_checkpoint_model_save(out, m, &info));
    TS_CHECK_GOTO(ts_module_state_dict(m, &sd));
    if (ntensors) *ntensors = sd.n;
    if (written) *written = info;
fail:
    ts_tensor_list_clear(&sd);
    ts_module_free(m);
    return st;
}
