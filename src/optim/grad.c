/*
 * optim/grad.c — operations on a parameter list's gradients (tessera/optim.h):
 * clipping by the global L2 norm (torch.nn.utils.clip_grad_norm_), scaling
 * (gradient accumulation's 1/K), and dynamic loss scaling (torch.amp.GradScaler's
 * unscale_ and update). The element passes are the device's optim kernels
 * (grad_sumsq, grad_scale in src/device/k_optim.h).
 */
#include "tensor/tensor.h"
#include "device/k_optim.h"
#include "tessera/optim.h"

#include <math.h>

/* The gradient of params entry i as a contiguous F32 tensor the kernels can take (borrowed), or NULL
 * when it has none. A non-contiguous gradient is replaced by a contiguous copy first. */
static ts_status grad_of(const ts_tensor_list *params, int i, const char *fn, ts_tensor **out) {
    *out = NULL;
    ts_tensor *g = params->tensors[i] ? ts_tensor_grad(params->tensors[i]) : NULL;
    if (!g) return TS_OK;
    if (g->dtype != TS_F32)
        return ts_error(TS_ERR_DTYPE, "%s: the gradient of '%s' has dtype %s (want f32)", fn,
                        params->names ? params->names[i] : "?", ts_dtype_name(g->dtype));
    const struct ts_kernels_optim *k = g->storage->device->k_optim;
    if (!k || !k->grad_sumsq || !k->grad_scale)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: no gradient kernels on device %s", fn,
                        ts_device_name(g->storage->device));
    if (!ts_tensor_is_contiguous(g)) {
        ts_tensor *c = NULL;
        TS_TRY(ts__contiguous(g, &c));
        ts_tensor_set_grad(params->tensors[i], c);
        ts_tensor_release(c);
        g = c;
    }
    *out = g;
    return TS_OK;
}

ts_status ts_scale_grads(const ts_tensor_list *params, float factor, bool *finite) {
    TS_ARG(params, "ts_scale_grads: NULL argument");
    bool bad = false;
    for (int i = 0; i < params->n; i++) {
        ts_tensor *g;
        TS_TRY(grad_of(params, i, "ts_scale_grads", &g));
        if (g) TS_TRY(g->storage->device->k_optim->grad_scale(g, factor, &bad));
    }
    if (finite) *finite = !bad;
    return TS_OK;
}

ts_status ts_clip_grad_norm(const ts_tensor_list *params, double max_norm, double *total_norm) {
    TS_ARG(params, "ts_clip_grad_norm: NULL argument");
    TS_ARG(max_norm > 0 && isfinite(max_norm), "ts_clip_grad_norm: max_norm %g must be finite and > 0", max_norm);
    double sum = 0.0;
    for (int i = 0; i < params->n; i++) {
        ts_tensor *g;
        double s = 0.0;
        TS_TRY(grad_of(params, i, "ts_clip_grad_norm", &g));
        if (g) TS_TRY(g->storage->device->k_optim->grad_sumsq(g, &s));
        sum += s;
    }
    double total = sqrt(sum);
    if (total_norm) *total_norm = total;
    double coef = max_norm / (total + 1e-6);
    if (!isfinite(total) || coef >= 1.0) return TS_OK;
    return ts_scale_grads(params, (float)coef, NULL);
}

ts_status ts_grad_scaler_check(const ts_grad_scaler *gs) {
    TS_ARG(gs, "ts_grad_scaler_check: NULL argument");
    TS_ARG(isfinite(gs->scale) && gs->scale > 0, "grad scaler: scale %g must be finite and > 0", (double)gs->scale);
    TS_ARG(isfinite(gs->growth_factor) && gs->growth_factor > 1, "grad scaler: growth_factor %g must be > 1",
           gs->growth_factor);
    TS_ARG(gs->backoff_factor > 0 && gs->backoff_factor < 1, "grad scaler: backoff_factor %g must be in (0, 1)",
           gs->backoff_factor);
    TS_ARG(gs->growth_interval >= 1, "grad scaler: growth_interval %lld must be >= 1", (long long)gs->growth_interval);
    TS_ARG(gs->growth_tracker >= 0 && gs->growth_tracker < gs->growth_interval,
           "grad scaler: growth_tracker %lld must be in [0, growth_interval)", (long long)gs->growth_tracker);
    return TS_OK;
}

ts_status ts_grad_scaler_unscale(const ts_grad_scaler *gs, const ts_tensor_list *params, bool *found_inf) {
    TS_ARG(gs && params && found_inf, "ts_grad_scaler_unscale: NULL argument");
    TS_TRY(ts_grad_scaler_check(gs));
    bool finite = true;
    /* torch multiplies by the float32 reciprocal of the scale */
    TS_TRY(ts_scale_grads(params, 1.0f / gs->scale, &finite));
    *found_inf = !finite;
    return TS_OK;
}

void ts_grad_scaler_update(ts_grad_scaler *gs, bool found_inf) {
    if (!gs) return;
    if (found_inf) {
        gs->scale = (float)((double)gs->scale * gs->backoff_factor);
        gs->growth_tracker = 0;
        return;
    }
    int64_t ok = gs->growth_tracker + 1;
    if (ok < gs->growth_interval) {
        gs->growth_tracker = ok;
        return;
    }
    float grown = (float)((double)gs->scale * gs->growth_factor);
    if (isfinite(grown)) gs->scale = grown;
    gs->growth_tracker = 0;
}
