/*
 * train/weights.c — a model's weights from a file (tessera/train.h): a safetensors file
 * (PyTorch's state-dict names, e.g. written by safetensors.torch.save_file or `tessera ckpt
 * export`) or a Tessera checkpoint's model.* tensors, told apart by their first bytes
 * (ts_safetensors_probe), then loaded strictly: every missing, unexpected or mismatched
 * tensor is named before anything is copied (ts_module_load_state_dict).
 */
#include "train/strategy.h"

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
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    const void *b = NULL;
    size_t bn = 0;
    if (model && ts_ckpt_get_bytes(ck, "train.model", &b, &bn) == TS_OK && bn < n) {
        memcpy(model, b, bn);
        model[bn] = '\0';
    }
    st = ts_ckpt_get_tensors(ck, "model.", &l);
    if (st == TS_OK && l.n == 0)
        st = ts_error(TS_ERR_INVALID_ARG, "%s: the checkpoint holds no model.* tensors (no model state dict)", path);
    for (int i = 0; i < l.n && st == TS_OK; i++) st = ts_tensor_list_append(out, l.names[i], l.tensors[i]);
    ts_tensor_list_clear(&l);
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
