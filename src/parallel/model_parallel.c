/*
 * parallel/model_parallel.c — model parallelism in depth: the ToDevice module
 * and ModelParallel, a Sequential cut into stages that live on different
 * devices (see include/tessera/parallel.h).
 *
 * ModelParallel's forward runs on the calling thread: the stages depend on
 * each other, so only one device works at a time (the pipeline overlaps them).
 * Activations cross stage boundaries through ts_to_device, which autograd
 * records, so backward needs nothing special.
 */
#include "nn/module.h"
#include "tessera/parallel.h"

#include <stdio.h>

#define MP_MAX_STAGES 64

/* ---- ToDevice ------------------------------------------------------------------------------------- */
typedef struct to_device_impl {
    ts_device *dev;
} to_device_impl;

static ts_status to_device_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const to_device_impl *c = m->impl;
    return ts_to_device(x, c->dev, out);
}
static const ts_module_vt to_device_vt = {
    .name = "ToDevice", .kind = TS_MODULE_TO_DEVICE, .forward = to_device_forward};

ts_status ts_nn_to_device_new(ts_device *dev, ts_module **out) {
    TS_ARG(dev && out, "ts_nn_to_device_new: NULL argument");
    TS_TRY(ts__module_new(&to_device_vt, sizeof(to_device_impl), out));
    ((to_device_impl *)(*out)->impl)->dev = dev;
    return TS_OK;
}

/* ---- ModelParallel ---------------------------------------------------------------------------------- */
typedef struct mp_impl {
    int n;
    ts_device *devs[MP_MAX_STAGES];
    int bounds[MP_MAX_STAGES]; /* stage s: children [bounds[s-1], bounds[s]) */
    ts_device *output_device;
} mp_impl;

static ts_status mp_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const mp_impl *c = m->impl;
    ts_module *seq = m->children[0];
    ts_tensor *cur = NULL;
    ts_status st = TS_OK;
    int child = 0;
    for (int s = 0; s < c->n && st == TS_OK; s++) {
        ts_tensor *moved = NULL;
        st = ts_to_device(cur ? cur : x, c->devs[s], &moved);
        if (st != TS_OK) {
            ts__error_prefix(st, "ModelParallel: moving the input of stage %d to %s", s, c->devs[s]->name);
            break;
        }
        ts_tensor_release(cur);
        cur = moved;
        for (; child < c->bounds[s] && st == TS_OK; child++) {
            ts_tensor *next = NULL;
            st = ts_module_forward(seq->children[child], cur, &next);
            if (st != TS_OK) {
                ts__error_prefix(st, "ModelParallel stage %d (%s): '%s' (%s)", s, c->devs[s]->name,
                                 seq->child_names[child], ts_module_type_name(seq->children[child]));
                break;
            }
            ts_tensor_release(cur);
            cur = next;
        }
    }
    if (st == TS_OK) {
        ts_tensor *o = NULL;
        st = ts_to_device(cur, c->output_device, &o);
        if (st == TS_OK) *out = o;
    }
    ts_tensor_release(cur);
    return st;
}
static const ts_module_vt mp_vt = {.name = "ModelParallel", .kind = TS_MODULE_MODEL_PARALLEL, .forward = mp_forward};

/* The split of the children's parameter counts w[0..k) into n non-empty
 * contiguous stages that minimises the largest stage (ties: later boundaries). */
static ts_status balance(const int64_t *w, int k, int n, int *bounds) {
    /* best[s][j]: the least possible largest stage when children [0, j) form s + 1 stages */
    int64_t *prefix = ts__calloc((size_t)k + 1, sizeof *prefix);
    int64_t *best = ts__calloc((size_t)n * ((size_t)k + 1), sizeof *best);
    int *cut = ts__calloc((size_t)n * ((size_t)k + 1), sizeof *cut);
    if (!prefix || !best || !cut) {
        free(prefix);
        free(best);
        free(cut);
        return TS_ERR_NOMEM;
    }
#define BEST(s, j) best[(size_t)(s) * ((size_t)k + 1) + (size_t)(j)]
#define CUT(s, j) cut[(size_t)(s) * ((size_t)k + 1) + (size_t)(j)]
    for (int j = 0; j < k; j++) prefix[j + 1] = prefix[j] + w[j];
    for (int j = 1; j <= k; j++) BEST(0, j) = prefix[j];
    for (int s = 1; s < n; s++) {
        for (int j = s + 1; j <= k; j++) {
            int64_t b = INT64_MAX;
            int at = s;
            for (int i = s; i < j; i++) { /* the last stage is [i, j) */
                int64_t v = TS_MAX(BEST(s - 1, i), prefix[j] - prefix[i]);
                if (v <= b) { /* <=: the later boundary wins ties */
                    b = v;
                    at = i;
                }
            }
            BEST(s, j) = b;
            CUT(s, j) = at;
        }
    }
    int j = k;
    for (int s = n - 1; s >= 0; s--) {
        bounds[s] = j;
        if (s > 0) j = CUT(s, j);
    }
#undef BEST
#undef CUT
    free(prefix);
    free(best);
    free(cut);
    return TS_OK;
}

ts_status ts_nn_model_parallel_new(ts_module *seq, ts_device *const *devs, int n, const int *bounds,
                                   ts_device *output_device, ts_module **out) {
    ts_status st;
    ts_module *m = NULL;
    int64_t *w = NULL;
    if (!seq || !out || !devs) {
        ts_module_free(seq);
        return ts_error(TS_ERR_INVALID_ARG, "ts_nn_model_parallel_new: NULL argument");
    }
    *out = NULL;
    if (ts_module_kind(seq) != TS_MODULE_SEQUENTIAL) {
        st = ts_error(TS_ERR_INVALID_ARG, "ts_nn_model_parallel_new: the model must be a Sequential, got a %s",
                      ts_module_type_name(seq));
        goto fail;
    }
    if (n < 1 || n > MP_MAX_STAGES) {
        st = ts_error(TS_ERR_INVALID_ARG, "ts_nn_model_parallel_new: %d devices (want 1 to %d)", n, MP_MAX_STAGES);
        goto fail;
    }
    int k = seq->nchildren;
    if (k < n) {
        st = ts_error(TS_ERR_INVALID_ARG,
                      "ts_nn_model_parallel_new: cannot split a Sequential of %d children over %d devices (every "
                      "stage needs at least one child)",
                      k, n);
        goto fail;
    }
    for (int i = 0; i < n; i++)
        if (!devs[i]) {
            st = ts_error(TS_ERR_INVALID_ARG, "ts_nn_model_parallel_new: device %d is NULL", i);
            goto fail;
        }
    TS_CHECK_GOTO(ts__module_new(&mp_vt, sizeof(mp_impl), &m));
    mp_impl *c = m->impl;
    c->n = n;
    memcpy(c->devs, devs, sizeof *devs * (size_t)n);
    c->output_device = output_device ? output_device : devs[n - 1];
    if (bounds) {
        for (int i = 0; i < n; i++) {
            int lo = i ? bounds[i - 1] : 0;
            if (bounds[i] <= lo || bounds[i] > k) {
                st = ts_error(TS_ERR_INVALID_ARG,
                              "ts_nn_model_parallel_new: bounds[%d] = %d: stage %d would be children [%d, %d) of a "
                              "Sequential of %d (bounds must increase strictly and end at %d)",
                              i, bounds[i], i, lo, bounds[i], k, k);
                goto fail;
            }
        }
        if (bounds[n - 1] != k) {
            st = ts_error(TS_ERR_INVALID_ARG,
                          "ts_nn_model_parallel_new: bounds[%d] = %d, but the last stage must end at the Sequential's "
                          "%d children",
                          n - 1, bounds[n - 1], k);
            goto fail;
        }
        memcpy(c->bounds, bounds, sizeof *bounds * (size_t)n);
    } else {
        w = ts__calloc((size_t)k, sizeof *w);
        if (!w) {
            st = TS_ERR_NOMEM;
            goto fail;
        }
        for (int i = 0; i < k; i++) w[i] = ts_module_num_parameters(seq->children[i]);
        TS_CHECK_GOTO(balance(w, k, n, c->bounds));
    }
    for (int s = 0, child = 0; s < n; s++)
        for (; child < c->bounds[s]; child++) {
            st = ts_module_to(seq->children[child], devs[s]);
            if (st != TS_OK) {
                ts__error_prefix(st, "ts_nn_model_parallel_new: moving child %d to %s", child, devs[s]->name);
                goto fail;
            }
        }
    m->training = seq->training;
    st = ts__module_add_child(m, "module", seq);
    seq = NULL; /* owned by m, or freed */
    TS_CHECK_GOTO(st);
    free(w);
    *out = m;
    return TS_OK;
fail:
    free(w);
    ts_module_free(seq);
    ts_module_free(m);
    return st;
}

int ts_model_parallel_bounds(const ts_module *mp, int *bounds, int max) {
    if (!mp || mp->vt != &mp_vt) return -1;
    const mp_impl *c = mp->impl;
    for (int i = 0; bounds && i < c->n && i < max; i++) bounds[i] = c->bounds[i];
    return c->n;
}
