/*
 * tensor/list.c — ts_tensor_list: an ordered list of named tensors.
 */
#include "tensor/tensor.h"

ts_status ts_tensor_list_append(ts_tensor_list *l, const char *name, ts_tensor *t) {
    TS_ARG(l && name && t, "ts_tensor_list_append: NULL argument");
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        char **nn = ts__realloc(l->names, sizeof *nn * (size_t)cap);
        if (!nn) return ts__error_prefix(TS_ERR_NOMEM, "ts_tensor_list_append('%s')", name);
        l->names = nn;
        ts_tensor **tt = ts__realloc(l->tensors, sizeof *tt * (size_t)cap);
        if (!tt) return ts__error_prefix(TS_ERR_NOMEM, "ts_tensor_list_append('%s')", name);
        l->tensors = tt;
        l->cap = cap;
    }
    char *copy = ts__strdup(name);
    if (!copy) return ts__error_prefix(TS_ERR_NOMEM, "ts_tensor_list_append('%s')", name);
    l->names[l->n] = copy;
    l->tensors[l->n] = ts_tensor_retain(t);
    l->n++;
    return TS_OK;
}

ts_tensor *ts_tensor_list_find(const ts_tensor_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->names[i], name) == 0) return l->tensors[i];
    return NULL;
}

void ts_tensor_list_clear(ts_tensor_list *l) {
    for (int i = 0; i < l->n; i++) {
        free(l->names[i]);
        ts_tensor_release(l->tensors[i]);
    }
    free(l->names);
    free(l->tensors);
    *l = TS_TENSOR_LIST_INIT;
}
