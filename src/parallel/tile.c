/*
 * parallel/tile.c — tile (spatial) parallelism: TileParallel runs the
 * convolutional stack of a Sequential on horizontal bands of the image, one
 * band ("tile") per device, and gives exactly the untiled network's results,
 * borders included (see include/tessera/parallel.h for the contract).
 *
 * Rows and halos — the arithmetic, for one layer along H (W is never split):
 *
 *   A Conv2d or pooling layer has kernel k, stride s, padding p, dilation d
 *   (pooling: stride 0 means k; AvgPool2d has d = 1). Its output height is
 *     H_out = floor((H + 2p - d(k-1) - 1) / s) + 1
 *   (MaxPool2d with ceil_mode: ceil instead of floor, then minus one if the last
 *   window would start at or after H + p: PyTorch's rule). Output row o reads
 *   input rows
 *     o*s - p  ...  o*s - p + d(k-1)                    (inclusive)
 *   Ownership: output row o goes to the tile owning input row
 *     c(o) = clamp(o*s - p + floor(d(k-1)/2), 0, H-1)   (the window's centre)
 *   c is nondecreasing in o, so every tile again owns one contiguous band
 *   [oa, ob) (possibly empty: the tile drops out for the rest of the stack),
 *   and a "same" convolution (s 1, p = d(k-1)/2) keeps the bands unchanged.
 *   A tile owning output rows [oa, ob) needs the input rows
 *     [lo, hi) = [oa*s - p,  (ob-1)*s - p + d(k-1) + 1)
 *   If it owns input rows [a, b), its halo is a - lo rows from above and
 *   hi - b rows from below (a negative count: rows it owns but does not read).
 *   The rows of [lo, hi) inside [0, H) are fetched from whichever tiles own
 *   them (the neighbours, or further when a band is thinner than the halo);
 *   the rows outside [0, H) are the image's own padding, so only the top tile
 *   adds max(0, -lo) rows and only the bottom one max(0, hi - H) rows: zeros
 *   for Conv2d and AvgPool2d (count_include_pad counts them, as it counts
 *   padding), -inf for MaxPool2d (padding never wins). The tile then runs the
 *   layer with padding 0 along H (its own padding along W) and gets exactly
 *     (hi - lo - d(k-1) - 1)/s + 1 = ob - oa rows,
 *   whatever the alignment of a and b to the stride. Examples:
 *     Conv2d(k 3, p 1)            1 row from each neighbour
 *     Conv2d(k 5, p 2, d 2)       4 rows from each neighbour
 *     Conv2d(k 3, s 2, p 1)       output band [oa, ob) = {o : a <= 2o < b}, reads
 *                                 [2oa - 1, 2ob): 1 row above when a is even
 *                                 (2oa = a), none when a is odd; 0 or 1 below
 *     MaxPool2d(2, 2)             band boundary b even: no halo; b odd: the tile
 *                                 above reads row b (its last window straddles
 *                                 the border) and the tile below skips it
 *     MaxPool2d(3, 2, p 1)        c(o) = 2o: reads [2oa - 1, 2ob) like the conv
 *   ReLU needs no rows from anyone; BatchNorm2d needs no rows but a reduction.
 *
 * BatchNorm2d (training, or no running stats) over the whole image:
 *   forward  each tile: batchnorm2d_stats kernel -> local count, mean, M2
 *            (momentum 1 into a zeroed scratch "running_var" gives the unbiased
 *            variance, as in syncbn.c) -> on the calling thread, Chan's pairwise
 *            combination in tile order (double) -> global mean, invstd; running
 *            stats and num_batches_tracked updated once, as BatchNorm2d does
 *            -> each tile: batchnorm2d_apply with the global mean/invstd.
 *   graph    S = [mean; invstd] (2, C) on the output device is the end of a chain
 *            of "tile_bn_stats" nodes, node t with inputs (x_t, S_{t-1}); each
 *            tile's "tile_bn_apply" node has inputs (x_t, S moved to the tile,
 *            weight, bias). Backward of apply (eval form, mean/invstd as inputs):
 *              gx_t += w invstd dy,  gw += invstd sum dy (x-mean),  gb += sum dy,
 *              gS_t  = [-w invstd sum dy ; w sum dy (x-mean)]
 *            The engine sums gS_t over tiles at S (ts_to_device's backward brings
 *            each home), then the chain hands the total gS = [gmean; ginvstd] to
 *            every stats node (pass-through to S_{t-1}), which adds
 *              gx_t += gmean/M - ginvstd invstd^3 (x_t - mean)/M
 *            (M = N*H*W over all tiles; one batchnorm2d_apply). Together:
 *              gx = w invstd (dy - mean(dy) - xhat mean(dy xhat)), BatchNorm2d's.
 *
 * Concurrency: each layer is one ts_device_run_parallel round over the active
 * tiles (BatchNorm2d: stats, then apply). Inside a round a tile reads its
 * neighbours' previous activations (never written again) and writes only its
 * own slot. Everything that touches a leaf (slicing the input, copying
 * parameters to the tiles) runs on the calling thread between rounds, because
 * a leaf's accumulate node is created lazily by the first op that uses it.
 * Every task runs in the caller's grad mode. Backward runs on the caller's
 * thread (the engine walks one graph).
 *
 * The plan dispatches on ts_module_kind and reads each layer's configuration
 * through its typed accessor (ts_conv2d_get_config, ts_pool2d_get_params,
 * ts_batchnorm2d_get_config); parameters through the generic slots.
 */
#include "autograd/autograd.h"
#include "core/internal.h"
#include "nn/module.h"
#include "tensor/tensor.h"
#include "device/k_spatial.h"
#include "tessera/parallel.h"

#include <math.h>
#include <stdio.h>

/* ---- the plan: the Sequential's leaves, the tiled stack then the head ---------------------------- */
typedef enum tl_kind { TL_CONV, TL_MAXPOOL, TL_AVGPOOL, TL_BN, TL_RELU } tl_kind;

typedef struct tl_layer {
    tl_kind kind;
    ts_module *m;   /* borrowed: a leaf of the wrapped Sequential */
    char name[64];  /* its dotted path, for errors */
    int k, s, p, d; /* geometry along H (conv and pooling) */
    ts_conv2d_params conv;
    ts_pool2d_params pool; /* stride and dilation normalised */
    float eps, momentum;   /* BatchNorm2d; momentum < 0: cumulative average */
    bool track;
} tl_layer;

typedef struct tile_impl {
    int n;
    ts_device **devs; /* n, borrowed */
    ts_device *out_dev;
    int nlayers, nhead;
    tl_layer *layers;
    ts_module **head; /* borrowed; run untiled, in order, on out_dev */
    char (*head_names)[64];
} tile_impl;

typedef struct plan {
    tl_layer *layers;
    int nl, capl;
    ts_module **head;
    char (*head_names)[64];
    int nh, caph;
    bool in_head;
} plan;

static ts_status plan_push_layer(plan *pl, const tl_layer *l) {
    if (pl->nl == pl->capl) {
        int cap = pl->capl ? 2 * pl->capl : 16;
        tl_layer *v = realloc(pl->layers, sizeof *v * (size_t)cap);
        if (!v) return ts_error(TS_ERR_NOMEM, "ts_nn_tile_parallel_new: out of memory");
        pl->layers = v;
        pl->capl = cap;
    }
    pl->layers[pl->nl++] = *l;
    return TS_OK;
}

static ts_status plan_push_head(plan *pl, ts_module *m, const char *name) {
    if (pl->nh == pl->caph) {
        int cap = pl->caph ? 2 * pl->caph : 8;
        ts_module **v = realloc(pl->head, sizeof *v * (size_t)cap);
        if (!v) return ts_error(TS_ERR_NOMEM, "ts_nn_tile_parallel_new: out of memory");
        pl->head = v;
        char(*nv)[64] = realloc(pl->head_names, sizeof *nv * (size_t)cap);
        if (!nv) return ts_error(TS_ERR_NOMEM, "ts_nn_tile_parallel_new: out of memory");
        pl->head_names = nv;
        pl->caph = cap;
    }
    pl->head[pl->nh] = m;
    snprintf(pl->head_names[pl->nh], sizeof pl->head_names[0], "%s", name);
    pl->nh++;
    return TS_OK;
}

/* Appends m's children (recursing into nested Sequentials while in the stack) to the plan. */
static ts_status plan_walk(ts_module *m, const char *prefix, plan *pl) {
    for (int i = 0; i < m->nchildren; i++) {
        ts_module *ch = m->children[i];
        const ts_module_kind_id kind = ts_module_kind(ch);
        const char *type = ts_module_type_name(ch);
        char path[64];
        snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", m->child_names[i]);
        if (pl->in_head) {
            TS_TRY(plan_push_head(pl, ch, path));
            continue;
        }
        if (kind == TS_MODULE_SEQUENTIAL) {
            TS_TRY(plan_walk(ch, path, pl));
            continue;
        }
        if (kind == TS_MODULE_FLATTEN || kind == TS_MODULE_ADAPTIVE_AVGPOOL2D) {
            pl->in_head = true;
            TS_TRY(plan_push_head(pl, ch, path));
            continue;
        }
        tl_layer l;
        memset(&l, 0, sizeof l);
        l.m = ch;
        snprintf(l.name, sizeof l.name, "%s", path);
        switch (kind) {
        case TS_MODULE_CONV2D:
            l.kind = TL_CONV;
            TS_TRY(ts_conv2d_get_config(ch, NULL, NULL, &l.k, NULL, &l.conv, NULL));
            l.s = l.conv.stride[0];
            l.p = l.conv.padding[0];
            l.d = l.conv.dilation[0];
            break;
        case TS_MODULE_MAXPOOL2D:
        case TS_MODULE_AVGPOOL2D: {
            bool is_max = kind == TS_MODULE_MAXPOOL2D;
            l.kind = is_max ? TL_MAXPOOL : TL_AVGPOOL;
            TS_TRY(ts_pool2d_get_params(ch, &l.pool));
            for (int j = 0; j < 2; j++) {
                if (l.pool.stride[j] == 0) l.pool.stride[j] = l.pool.kernel[j];
                if (l.pool.dilation[j] == 0) l.pool.dilation[j] = 1;
            }
            if (!is_max && l.pool.ceil_mode)
                return ts_error(TS_ERR_UNSUPPORTED,
                                "ts_nn_tile_parallel_new: layer '%s' (AvgPool2d with ceil_mode) cannot be tiled: its "
                                "last window's divisor depends on the image's bottom edge; use ceil_mode off",
                                path);
            if (!is_max && l.pool.exclude_pad && l.pool.padding[0] > 0)
                return ts_error(TS_ERR_UNSUPPORTED,
                                "ts_nn_tile_parallel_new: layer '%s' (AvgPool2d with exclude_pad and padding) cannot "
                                "be tiled: its top and bottom windows' divisors depend on the image's edges; use "
                                "exclude_pad off or no height padding",
                                path);
            l.k = l.pool.kernel[0];
            l.s = l.pool.stride[0];
            l.p = l.pool.padding[0];
            l.d = is_max ? l.pool.dilation[0] : 1;
            if (l.k < 1 || l.s < 1 || l.p < 0 || l.d < 1)
                return ts_error(TS_ERR_INVALID_ARG, "ts_nn_tile_parallel_new: layer '%s' (%s) has a bad geometry", path,
                                type);
            break;
        }
        case TS_MODULE_BATCHNORM2D:
            l.kind = TL_BN;
            TS_TRY(ts_batchnorm2d_get_config(ch, NULL, &l.eps, &l.momentum, NULL, &l.track));
            break;
        case TS_MODULE_RELU:
            l.kind = TL_RELU;
            break;
        default:
            return ts_error(TS_ERR_UNSUPPORTED,
                            "ts_nn_tile_parallel_new: layer '%s' (%s) cannot be tiled: the tiled stack may hold "
                            "Conv2d, MaxPool2d, AvgPool2d, BatchNorm2d and ReLU; it ends at the first Flatten or "
                            "AdaptiveAvgPool2d, after which layers run untiled",
                            path, type);
        }
        TS_TRY(plan_push_layer(pl, &l));
    }
    return TS_OK;
}

/* ---- one forward pass ---------------------------------------------------------------------------- */
typedef struct fwd {
    const tile_impl *c;
    bool grad; /* the caller's grad mode, for every task */
    int n;
    int64_t H;              /* height of the current activation */
    int64_t *a, *b;         /* rows [a_t, b_t) tile t owns of the current activation */
    int64_t *na, *nb;       /* ... of the layer's output */
    ts_tensor **cur, **nxt; /* per tile: current activation, the layer's output (NULL: no rows) */
    ts_tensor **w, **bias;  /* per tile: the layer's parameters on the tile's device */
    const tl_layer *L;      /* the layer being run */
    /* BatchNorm2d */
    int64_t C, M;          /* channels; element count per channel over all tiles */
    double *lmean, *lm2;   /* per tile (n*C): local mean and squared deviations */
    int64_t *lcount;       /* per tile */
    float *gmean, *ginvstd; /* (C) global statistics */
    ts_tensor **mu, **mr, **is; /* per tile: global mean, its residual, invstd (C) on the tile's device */
    ts_tensor *S;          /* [mean; invstd] (2, C) on out_dev: end of the stats chain */
} fwd;

typedef ts_status (*tile_fn)(fwd *f, int t);
typedef struct tile_arg {
    fwd *f;
    int t;
    tile_fn fn;
} tile_arg;

static ts_status tile_task(void *p) {
    tile_arg *a = p;
    bool prev = ts_grad_set_enabled(a->f->grad);
    ts_status st = a->fn(a->f, a->t);
    ts_grad_set_enabled(prev);
    return st;
}

/* Runs fn for every tile with rows in the layer's output (na/nb), concurrently on the tiles' devices. */
static ts_status run_tiles(fwd *f, tile_fn fn) {
    int n = f->n, k = 0;
    ts_device **devs = ts__calloc((size_t)n, sizeof *devs);
    tile_arg *args = ts__calloc((size_t)n, sizeof *args);
    void **ap = ts__calloc((size_t)n, sizeof *ap);
    ts_status st = TS_ERR_NOMEM;
    if (devs && args && ap) {
        for (int t = 0; t < n; t++) {
            if (f->nb[t] <= f->na[t]) continue;
            devs[k] = f->c->devs[t];
            args[k] = (tile_arg){f, t, fn};
            ap[k] = &args[k];
            k++;
        }
        st = ts_device_run_parallel(devs, k, tile_task, ap);
    }
    free(devs);
    free(args);
    free(ap);
    return st;
}

static void release_all(ts_tensor **v, int n) {
    for (int i = 0; v && i < n; i++) {
        ts_tensor_release(v[i]);
        v[i] = NULL;
    }
}

/* Copies param to every tile that runs the layer (one copy per distinct device; on the calling
 * thread, see the top of the file). param NULL: no copies. */
static ts_status replicate(fwd *f, ts_tensor *param, ts_tensor **rep) {
    if (!param) return TS_OK;
    for (int t = 0; t < f->n; t++) {
        if (f->nb[t] <= f->na[t]) continue;
        for (int u = 0; u < t && !rep[t]; u++)
            if (rep[u] && f->c->devs[u] == f->c->devs[t]) rep[t] = ts_tensor_retain(rep[u]);
        if (!rep[t]) TS_TRY(ts_to_device(param, f->c->devs[t], &rep[t]));
    }
    return TS_OK;
}

/* PyTorch's pooling_output_shape (src/ops/pool.c). */
static int64_t pool_out_size(int64_t in, int k, int pad, int s, int d, bool ceil_mode) {
    int64_t num = in + 2 * (int64_t)pad - (int64_t)d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t q = num >= 0 ? num / s : -((-num + s - 1) / s);
    int64_t o = q + 1;
    if (ceil_mode && (o - 1) * s >= in + pad) o--;
    return o;
}

/* The output height of a window layer and each tile's output band (centre rule). */
static ts_status window_bands(fwd *f, int64_t *H_out) {
    const tl_layer *L = f->L;
    int64_t span = (int64_t)L->d * (L->k - 1);
    int64_t ho = L->kind == TL_MAXPOOL ? pool_out_size(f->H, L->k, L->p, L->s, L->d, L->pool.ceil_mode)
                                       : (f->H + 2 * (int64_t)L->p - span - 1 >= 0
                                              ? (f->H + 2 * (int64_t)L->p - span - 1) / L->s + 1
                                              : 0);
    if (ho < 1)
        return ts_error(TS_ERR_SHAPE,
                        "kernel %d with dilation %d is larger than the padded input height %lld (padding %d)", L->k,
                        L->d, (long long)f->H, L->p);
    for (int t = 0; t < f->n; t++) f->na[t] = f->nb[t] = 0;
    int u = 0;
    for (int64_t o = 0; o < ho; o++) {
        int64_t c = o * L->s - L->p + span / 2;
        c = TS_MIN(TS_MAX(c, 0), f->H - 1);
        while (!(f->a[u] <= c && c < f->b[u])) u++; /* bands partition [0, H) in tile order */
        if (f->nb[u] == f->na[u]) f->na[u] = o;
        f->nb[u] = o + 1;
    }
    *H_out = ho;
    return TS_OK;
}

/* A (N, C, rows, W) block of constant padding rows on dev. */
static ts_status pad_rows(ts_device *dev, const ts_tensor *like, int64_t rows, float v, ts_tensor **out) {
    int64_t shape[4] = {like->shape[0], like->shape[1], rows, like->shape[3]};
    ts_tensor *f = NULL; /* in the activations' dtype (bfloat16 under autocast; float32: f itself) */
    TS_TRY(ts_tensor_full(dev, 4, shape, v, &f));
    ts_status st = ts_to_dtype(f, like->dtype, out);
    ts_tensor_release(f);
    return st;
}

/* Conv2d / pooling for tile t: gather rows [lo, hi) (halo exchange), pad at the image borders,
 * run the layer with padding 0 along H. */
static ts_status task_window(fwd *f, int t) {
    const tl_layer *L = f->L;
    ts_device *dev = f->c->devs[t];
    const int64_t lo = f->na[t] * L->s - L->p, hi = (f->nb[t] - 1) * L->s - L->p + (int64_t)L->d * (L->k - 1) + 1;
    const float padv = L->kind == TL_MAXPOOL ? -INFINITY : 0.0f;
    const ts_tensor *like = f->cur[t];
    ts_tensor **pieces = ts__calloc((size_t)f->n + 2, sizeof *pieces);
    ts_tensor *x = NULL, *piece = NULL;
    int np = 0;
    ts_status st = pieces ? TS_OK : TS_ERR_NOMEM;
    if (st != TS_OK) return st;
    if (lo < 0) TS_CHECK_GOTO(pad_rows(dev, like, -lo, padv, &pieces[np++]));
    for (int u = 0; u < f->n; u++) {
        int64_t ia = TS_MAX(lo, f->a[u]), ib = TS_MIN(hi, f->b[u]);
        if (ia >= ib) continue;
        if (ia == f->a[u] && ib == f->b[u])
            piece = ts_tensor_retain(f->cur[u]);
        else
            TS_CHECK_GOTO(ts_slice(f->cur[u], 2, ia - f->a[u], ib - f->a[u], &piece));
        TS_CHECK_GOTO(ts_to_device(piece, dev, &pieces[np++]));
        ts_tensor_release(piece);
        piece = NULL;
    }
    if (hi > f->H) TS_CHECK_GOTO(pad_rows(dev, like, hi - f->H, padv, &pieces[np++]));
    if (np == 1)
        x = ts_tensor_retain(pieces[0]);
    else
        TS_CHECK_GOTO(ts_concat(pieces, np, 2, &x));
    if (L->kind == TL_CONV) {
        ts_conv2d_params p = L->conv;
        p.padding[0] = 0;
        TS_CHECK_GOTO(ts_conv2d(x, f->w[t], f->bias[t], p, &f->nxt[t]));
    } else {
        ts_pool2d_params p = L->pool;
        p.padding[0] = 0;
        if (L->kind == TL_MAXPOOL)
            TS_CHECK_GOTO(ts_maxpool2d(x, p, &f->nxt[t]));
        else
            TS_CHECK_GOTO(ts_avgpool2d(x, p, &f->nxt[t]));
    }
    if (f->nxt[t]->shape[2] != f->nb[t] - f->na[t])
        st = ts_error(TS_ERR_INTERNAL, "tile %d: computed %lld rows, expected %lld", t, (long long)f->nxt[t]->shape[2],
                      (long long)(f->nb[t] - f->na[t]));
fail:
    ts_tensor_release(piece);
    ts_tensor_release(x);
    release_all(pieces, f->n + 2);
    free(pieces);
    return st;
}

static ts_status task_relu(fwd *f, int t) { return ts_relu(f->cur[t], &f->nxt[t]); }

/* ---- BatchNorm2d over all tiles --------------------------------------------------------------------- */
/* Local count, mean and M2 of tile t (into f->lmean/lm2/lcount). */
static ts_status task_bn_stats(fwd *f, int t) {
    ts_tensor *x = NULL, *mean = NULL, *mres = NULL, *is = NULL, *var = NULL;
    const int64_t C = f->C;
    ts_device *d = f->c->devs[t];
    float *h = ts__malloc(sizeof(float) * (size_t)(3 * C)); /* mean, var, mres */
    ts_status st = h ? TS_OK : TS_ERR_NOMEM;
    if (st != TS_OK) return st;
    TS_CHECK_GOTO(ts__contiguous(f->cur[t], &x));
    const int64_t M = x->shape[0] * x->shape[2] * x->shape[3];
    f->lcount[t] = M;
    if (M > 0) {
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &mean));
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &mres));
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &is));
        TS_CHECK_GOTO(ts_tensor_zeros(d, TS_F32, 1, &C, &var));
        /* momentum 1 into a zeroed running_var: var = the local unbiased variance */
        TS_CHECK_GOTO(d->k_spatial->batchnorm2d_stats(x, f->L->eps, 1.0f, mean, mres, is, NULL, var));
        TS_CHECK_GOTO(ts_tensor_to_host(mean, h, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(var, h + C, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(mres, h + 2 * C, sizeof(float) * (size_t)C));
        for (int64_t c = 0; c < C; c++) {
            f->lmean[t * C + c] = (double)h[c] + (double)h[2 * C + c]; /* the mean to ~48 bits */
            f->lm2[t * C + c] = (double)h[C + c] * (double)(M - 1);
        }
    }
fail:
    ts_tensor_release(x);
    ts_tensor_release(mean);
    ts_tensor_release(mres);
    ts_tensor_release(is);
    ts_tensor_release(var);
    free(h);
    return st;
}

/* Backward of one link of the stats chain (see the top of the file). saved: x_t, mean, invstd, mean's
 * residual (on x_t's device); p.i[0]: M. gout: gS (2, C) = [gmean; ginvstd]. */
static ts_status bn_stats_backward(ts_node *n, ts_tensor *gout, ts_tensor **gin) {
    const ts_tensor *x = n->saved[0], *mean = n->saved[1], *invstd = n->saved[2], *mres = n->saved[3];
    const int64_t C = mean->shape[0];
    const double M = (double)n->p.i[0];
    ts_device *d = x->storage->device;
    ts_tensor *coef = NULL, *shift = NULL;
    ts_status st = TS_OK;
    if (n->needs[1]) gin[1] = ts_tensor_retain(gout); /* S_t = S_{t-1} as far as gradients go */
    if (!n->needs[0]) return TS_OK;
    float *h = ts__malloc(sizeof(float) * (size_t)(5 * C)); /* gS[2C], invstd, coef, shift */
    if (!h) return TS_ERR_NOMEM;
    float *his = h + 2 * C, *hcoef = h + 3 * C, *hshift = h + 4 * C;
    TS_CHECK_GOTO(ts_tensor_to_host(gout, h, sizeof(float) * (size_t)(2 * C)));
    TS_CHECK_GOTO(ts_tensor_to_host(invstd, his, sizeof(float) * (size_t)C));
    for (int64_t c = 0; c < C; c++) {
        double is = his[c];
        hcoef[c] = (float)(-(double)h[C + c] * is * is * is / M); /* d invstd / dx = -invstd^3 (x - mean) / M */
        hshift[c] = (float)((double)h[c] / M);                    /* d mean / dx = 1 / M */
    }
    TS_CHECK_GOTO(ts__new_like(mean, &coef));
    TS_CHECK_GOTO(ts__new_like(mean, &shift));
    TS_CHECK_GOTO(ts_tensor_from_host(coef, hcoef, sizeof(float) * (size_t)C));
    TS_CHECK_GOTO(ts_tensor_from_host(shift, hshift, sizeof(float) * (size_t)C));
    TS_CHECK_GOTO(ts__new_like(x, &gin[0]));
    /* gx = (x - mean) * coef + shift */
    TS_CHECK_GOTO(d->k_spatial->batchnorm2d_apply(gin[0], x, mean, mres, coef, NULL, shift));
fail:
    ts_tensor_release(coef);
    ts_tensor_release(shift);
    free(h);
    return st;
}

/* Backward of one tile's normalisation with mean/invstd as inputs. saved: x, mean, invstd, weight
 * (or NULL), mean's residual. Inputs: x, S_t (2, C), weight, bias. */
static ts_status bn_apply_backward(ts_node *n, ts_tensor *g_in, ts_tensor **gin) {
    const ts_tensor *x = n->saved[0], *mean = n->saved[1], *invstd = n->saved[2], *w = n->saved[3];
    const ts_tensor *mres = n->saved[4];
    const int64_t C = mean->shape[0];
    ts_device *d = x->storage->device;
    ts_tensor *g = NULL, *gw = NULL, *gb = NULL, *gx = NULL;
    float *h = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts__contiguous(g_in, &g));
    if (n->needs[0]) TS_CHECK_GOTO(ts__new_like(x, &gx));
    if (n->needs[1] || n->needs[2]) TS_CHECK_GOTO(ts__new_like(mean, &gw));
    if (n->needs[1] || n->needs[3]) TS_CHECK_GOTO(ts__new_like(mean, &gb));
    TS_CHECK_GOTO(d->k_spatial->batchnorm2d_backward(g, x, mean, mres, invstd, w, false, gx, gw, gb));
    if (n->needs[1]) { /* gS_t = [-w invstd sum(dy); w sum(dy (x - mean))], gw = invstd sum(dy (x - mean)) */
        h = ts__malloc(sizeof(float) * (size_t)(6 * C));
        if (!h) {
            st = TS_ERR_NOMEM;
            goto fail;
        }
        float *hgw = h, *hgb = h + C, *his = h + 2 * C, *hw = h + 3 * C, *hs = h + 4 * C;
        TS_CHECK_GOTO(ts_tensor_to_host(gw, hgw, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(gb, hgb, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(invstd, his, sizeof(float) * (size_t)C));
        if (w) TS_CHECK_GOTO(ts_tensor_to_host(w, hw, sizeof(float) * (size_t)C));
        for (int64_t c = 0; c < C; c++) {
            double wv = w ? hw[c] : 1.0, is = his[c];
            hs[c] = (float)(-wv * is * (double)hgb[c]);
            hs[C + c] = (float)(wv * (double)hgw[c] / is);
        }
        TS_CHECK_GOTO(ts__new(d, TS_F32, 2, (int64_t[]){2, C}, &gin[1]));
        TS_CHECK_GOTO(ts_tensor_from_host(gin[1], hs, sizeof(float) * (size_t)(2 * C)));
    }
    if (n->needs[0]) gin[0] = gx, gx = NULL;
    if (n->needs[2]) gin[2] = gw, gw = NULL;
    if (n->needs[3]) gin[3] = gb, gb = NULL;
fail:
    ts_tensor_release(g);
    ts_tensor_release(gx);
    ts_tensor_release(gw);
    ts_tensor_release(gb);
    free(h);
    return st;
}

/* Combines the tiles' statistics (tile order), updates the running stats, and builds the chain
 * S_0 -> ... -> S (calling thread). */
static ts_status bn_combine(fwd *f) {
    const tl_layer *L = f->L;
    ts_module *m = L->m;
    const int64_t C = f->C;
    ts_status st = TS_OK;
    double *acc = ts__calloc((size_t)(2 * C), sizeof(double));
    float *hs = ts__malloc(sizeof(float) * (size_t)(3 * C)); /* mean, invstd, mean's residual */
    float *hr = ts__malloc(sizeof(float) * (size_t)(2 * C));
    ts_tensor *prev = NULL;
    if (!acc || !hs || !hr) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    double *gm = acc, *gm2 = acc + C, total = 0;
    for (int t = 0; t < f->n; t++) {
        if (f->nb[t] <= f->na[t]) continue;
        double nr = (double)f->lcount[t];
        if (nr <= 0) continue;
        double tot = total + nr;
        for (int64_t c = 0; c < C; c++) {
            double delta = f->lmean[t * C + c] - gm[c];
            gm[c] += delta * (nr / tot);
            gm2[c] += f->lm2[t * C + c] + delta * delta * (total * nr / tot);
        }
        total = tot;
    }
    f->M = (int64_t)total;
    if (total <= 1) {
        st = ts_error(TS_ERR_SHAPE, "expected more than 1 value per channel when training, got %.0f", total);
        goto fail;
    }
    for (int64_t c = 0; c < C; c++) {
        f->gmean[c] = hs[c] = (float)gm[c];
        f->ginvstd[c] = hs[C + c] = (float)(1.0 / sqrt(gm2[c] / total + (double)L->eps));
        hs[2 * C + c] = (float)(gm[c] - (double)hs[c]);
    }
    if (m->training && L->track) { /* r = (1 - momentum) r + momentum * stat, unbiased variance */
        int64_t count = (int64_t)ts_tensor_item(m->buffers[2], 0) + 1;
        double mom = L->momentum < 0 ? 1.0 / (double)count : (double)L->momentum;
        TS_CHECK_GOTO(ts_tensor_to_host(m->buffers[0], hr, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_to_host(m->buffers[1], hr + C, sizeof(float) * (size_t)C));
        for (int64_t c = 0; c < C; c++) {
            hr[c] = (float)(mom * gm[c] + (1.0 - mom) * hr[c]);
            hr[C + c] = (float)(mom * (gm2[c] / (total - 1)) + (1.0 - mom) * hr[C + c]);
        }
        TS_CHECK_GOTO(ts_tensor_from_host(m->buffers[0], hr, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_from_host(m->buffers[1], hr + C, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_from_host(m->buffers[2], &count, sizeof count));
    }
    /* per tile mean/invstd, and the chain of stats nodes */
    for (int t = 0; t < f->n; t++) {
        if (f->nb[t] <= f->na[t]) continue;
        ts_device *d = f->c->devs[t];
        ts_tensor *s = NULL;
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &f->mu[t]));
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &f->is[t]));
        TS_CHECK_GOTO(ts__new(d, TS_F32, 1, &C, &f->mr[t]));
        TS_CHECK_GOTO(ts_tensor_from_host(f->mu[t], hs, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_from_host(f->is[t], hs + C, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts_tensor_from_host(f->mr[t], hs + 2 * C, sizeof(float) * (size_t)C));
        TS_CHECK_GOTO(ts__new(f->c->out_dev, TS_F32, 2, (int64_t[]){2, C}, &s));
        st = ts_tensor_from_host(s, hs, sizeof(float) * (size_t)(2 * C));
        if (st != TS_OK) {
            ts_tensor_release(s);
            goto fail;
        }
        const ts_tensor *in[2] = {f->cur[t], prev};
        ts_node *node = NULL;
        st = ts__node_new("tile_bn_stats", bn_stats_backward, 2, in, &node);
        if (node) {
            ts__node_save(node, f->cur[t]);
            ts__node_save(node, f->mu[t]);
            ts__node_save(node, f->is[t]);
            ts__node_save(node, f->mr[t]);
            node->p.i[0] = f->M;
            st = ts__node_attach(node, s);
        }
        if (st != TS_OK) {
            ts_tensor_release(s);
            goto fail;
        }
        ts_tensor_release(prev);
        prev = s;
    }
    f->S = prev;
    prev = NULL;
fail:
    ts_tensor_release(prev);
    free(acc);
    free(hs);
    free(hr);
    return st;
}

/* Tile t's normalisation with the global statistics. */
static ts_status task_bn_apply(fwd *f, int t) {
    ts_device *d = f->c->devs[t];
    ts_tensor *x = NULL, *s = NULL, *w = NULL, *b = NULL, *o = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts__contiguous(f->cur[t], &x));
    TS_CHECK_GOTO(ts_to_device(f->S, d, &s));
    if (f->w[t]) TS_CHECK_GOTO(ts__contiguous(f->w[t], &w));
    if (f->bias[t]) TS_CHECK_GOTO(ts__contiguous(f->bias[t], &b));
    TS_CHECK_GOTO(ts__new_like(x, &o));
    TS_CHECK_GOTO(d->k_spatial->batchnorm2d_apply(o, x, f->mu[t], f->mr[t], f->is[t], w, b));
    const ts_tensor *in[4] = {f->cur[t], s, f->w[t], f->bias[t]};
    ts_node *node = NULL;
    TS_CHECK_GOTO(ts__node_new("tile_bn_apply", bn_apply_backward, 4, in, &node));
    if (node) {
        ts__node_save(node, x);
        ts__node_save(node, f->mu[t]);
        ts__node_save(node, f->is[t]);
        ts__node_save(node, w);
        ts__node_save(node, f->mr[t]);
        TS_CHECK_GOTO(ts__node_attach(node, o));
    }
    f->nxt[t] = o;
    o = NULL;
fail:
    ts_tensor_release(x);
    ts_tensor_release(s);
    ts_tensor_release(w);
    ts_tensor_release(b);
    ts_tensor_release(o);
    return st;
}

/* Eval mode with running statistics: BatchNorm2d's own op, per tile. */
static ts_status task_bn_eval(fwd *f, int t) {
    ts_device *d = f->c->devs[t];
    ts_module *m = f->L->m;
    ts_tensor *rm = NULL, *rv = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_to_device(m->buffers[0], d, &rm));
    TS_CHECK_GOTO(ts_to_device(m->buffers[1], d, &rv));
    TS_CHECK_GOTO(ts_batchnorm2d(f->cur[t], f->w[t], f->bias[t], rm, rv, false, 0.0f, f->L->eps, &f->nxt[t]));
fail:
    ts_tensor_release(rm);
    ts_tensor_release(rv);
    return st;
}

static ts_status run_bn(fwd *f) {
    const tl_layer *L = f->L;
    ts_module *m = L->m;
    for (int t = 0; t < f->n; t++) {
        f->na[t] = f->a[t];
        f->nb[t] = f->b[t];
    }
    TS_TRY(replicate(f, m->params[0], f->w));
    TS_TRY(replicate(f, m->params[1], f->bias));
    if (!m->training && L->track) return run_tiles(f, task_bn_eval);
    int t0 = 0;
    while (f->b[t0] <= f->a[t0]) t0++;
    f->C = f->cur[t0]->shape[1];
    const int64_t C = f->C;
    for (int j = 0; j < 2; j++) { /* the kernels trust shapes: check them as ts_batchnorm2d does */
        const ts_tensor *v[2] = {m->params[j], L->track ? m->buffers[j] : NULL};
        for (int i = 0; i < 2; i++)
            if (v[i] && (v[i]->ndim != 1 || v[i]->shape[0] != C)) {
                char xs[96];
                return ts_error(TS_ERR_SHAPE, "input %s has %lld channels, but the layer has %lld",
                                ts_shape_str(4, f->cur[t0]->shape, xs, sizeof xs), (long long)C,
                                (long long)v[i]->shape[0]);
            }
    }
    ts_status st;
    f->lmean = ts__calloc((size_t)(f->n * C), sizeof(double));
    f->lm2 = ts__calloc((size_t)(f->n * C), sizeof(double));
    f->lcount = ts__calloc((size_t)f->n, sizeof(int64_t));
    f->gmean = ts__calloc((size_t)C, sizeof(float));
    f->ginvstd = ts__calloc((size_t)C, sizeof(float));
    if (!f->lmean || !f->lm2 || !f->lcount || !f->gmean || !f->ginvstd) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    TS_CHECK_GOTO(run_tiles(f, task_bn_stats));
    TS_CHECK_GOTO(bn_combine(f));
    TS_CHECK_GOTO(run_tiles(f, task_bn_apply));
fail:
    free(f->lmean);
    free(f->lm2);
    free(f->lcount);
    free(f->gmean);
    free(f->ginvstd);
    f->lmean = f->lm2 = NULL;
    f->lcount = NULL;
    f->gmean = f->ginvstd = NULL;
    release_all(f->mu, f->n);
    release_all(f->mr, f->n);
    release_all(f->is, f->n);
    ts_tensor_release(f->S);
    f->S = NULL;
    return st;
}

/* Runs layer L on every tile: f->cur -> f->nxt, bands a/b -> na/nb, height H -> new H. */
static ts_status run_layer(fwd *f, int64_t *H_out) {
    const tl_layer *L = f->L;
    *H_out = f->H;
    switch (L->kind) {
    case TL_RELU:
        for (int t = 0; t < f->n; t++) {
            f->na[t] = f->a[t];
            f->nb[t] = f->b[t];
        }
        return run_tiles(f, task_relu);
    case TL_BN:
        return run_bn(f);
    case TL_CONV:
        TS_TRY(window_bands(f, H_out));
        TS_TRY(replicate(f, L->m->params[0], f->w));
        TS_TRY(replicate(f, L->m->params[1], f->bias));
        return run_tiles(f, task_window);
    case TL_MAXPOOL:
    case TL_AVGPOOL:
        TS_TRY(window_bands(f, H_out));
        return run_tiles(f, task_window);
    }
    return ts_error(TS_ERR_INTERNAL, "unknown layer kind");
}

static ts_status tile_forward(ts_module *m, const ts_tensor *x, ts_tensor **out) {
    const tile_impl *c = m->impl;
    TS_TRY(ts__check_f32("TileParallel", "input", x));
    TS_TRY(ts__check_ndim("TileParallel", "input", x, 4));
    const int n = c->n;
    const int64_t H = x->shape[2];
    char xs[96];
    if (H < n)
        return ts_error(TS_ERR_SHAPE,
                        "TileParallel: the input %s has %lld rows, fewer than the %d tiles (each tile needs at least "
                        "one row of the image; use at most %lld tiles)",
                        ts_shape_str(4, x->shape, xs, sizeof xs), (long long)H, n, (long long)H);
    fwd f;
    memset(&f, 0, sizeof f);
    f.c = c;
    f.n = n;
    f.grad = ts_grad_is_enabled();
    f.H = H;
    ts_status st = TS_OK;
    ts_tensor *y = NULL, *piece = NULL;
    ts_tensor **parts = NULL;
    int64_t *rows = ts__calloc((size_t)(4 * n), sizeof *rows);
    ts_tensor **tv = ts__calloc((size_t)(8 * n), sizeof *tv);
    if (!rows || !tv) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    f.a = rows, f.b = rows + n, f.na = rows + 2 * n, f.nb = rows + 3 * n;
    f.cur = tv, f.nxt = tv + n, f.w = tv + 2 * n, f.bias = tv + 3 * n, f.mu = tv + 4 * n, f.is = tv + 5 * n;
    f.mr = tv + 6 * n;
    parts = tv + 7 * n;

    /* scatter: tile t gets rows [t*H/n, (t+1)*H/n) (calling thread: x may be a leaf) */
    for (int t = 0; t < n; t++) {
        f.a[t] = (int64_t)t * H / n;
        f.b[t] = (int64_t)(t + 1) * H / n;
        TS_CHECK_GOTO(ts_slice(x, 2, f.a[t], f.b[t], &piece));
        TS_CHECK_GOTO(ts_to_device(piece, c->devs[t], &f.cur[t]));
        ts_tensor_release(piece);
        piece = NULL;
    }

    for (int l = 0; l < c->nlayers; l++) {
        f.L = &c->layers[l];
        int64_t H_out = f.H;
        st = run_layer(&f, &H_out);
        release_all(f.w, n);
        release_all(f.bias, n);
        if (st != TS_OK) {
            ts__error_prefix(st, "TileParallel: layer '%s' (%s)", f.L->name, ts_module_type_name(f.L->m));
            goto fail;
        }
        for (int t = 0; t < n; t++) {
            ts_tensor_release(f.cur[t]);
            f.cur[t] = f.nxt[t];
            f.nxt[t] = NULL;
            f.a[t] = f.na[t];
            f.b[t] = f.nb[t];
        }
        f.H = H_out;
    }

    /* gather the bands on the output device, in tile order */
    int k = 0;
    for (int t = 0; t < n; t++)
        if (f.b[t] > f.a[t]) TS_CHECK_GOTO(ts_to_device(f.cur[t], c->out_dev, &parts[k++]));
    if (k == 1)
        y = ts_tensor_retain(parts[0]);
    else
        TS_CHECK_GOTO(ts_concat(parts, k, 2, &y));
    release_all(f.cur, n);
    release_all(parts, n);

    /* the head, untiled */
    for (int i = 0; i < c->nhead; i++) {
        ts_tensor *z = NULL;
        st = ts_module_forward(c->head[i], y, &z);
        if (st != TS_OK) {
            ts__error_prefix(st, "TileParallel: head layer '%s' (%s)", c->head_names[i],
                             ts_module_type_name(c->head[i]));
            goto fail;
        }
        ts_tensor_release(y);
        y = z;
    }
    *out = y;
    y = NULL;
fail:
    ts_tensor_release(piece);
    ts_tensor_release(y);
    if (tv) release_all(tv, 7 * n);
    free(tv);
    free(rows);
    return st;
}

static void tile_free_impl(ts_module *m) {
    tile_impl *c = m->impl;
    if (!c) return;
    free(c->devs);
    free(c->layers);
    free(c->head);
    free(c->head_names);
}

static const ts_module_vt tile_vt = {
    .name = "TileParallel", .kind = TS_MODULE_TILE_PARALLEL, .forward = tile_forward, .free_impl = tile_free_impl};

ts_status ts_nn_tile_parallel_new(ts_module *seq, ts_device *const *devs, int n, ts_device *output_device,
                                  ts_module **out) {
    ts_status st = TS_OK;
    ts_module *w = NULL;
    plan pl;
    memset(&pl, 0, sizeof pl);
    if (!out || !seq || !devs || n < 1) {
        st = ts_error(TS_ERR_INVALID_ARG, "ts_nn_tile_parallel_new: %s",
                      !out ? "NULL out" : !seq ? "NULL module" : !devs ? "NULL device list" : "n must be >= 1");
        goto fail;
    }
    *out = NULL;
    for (int t = 0; t < n; t++)
        if (!devs[t]) {
            st = ts_error(TS_ERR_INVALID_ARG, "ts_nn_tile_parallel_new: device %d is NULL", t);
            goto fail;
        }
    if (!output_device) output_device = devs[0];
    if (ts_module_kind(seq) != TS_MODULE_SEQUENTIAL) {
        st = ts_error(TS_ERR_UNSUPPORTED,
                      "ts_nn_tile_parallel_new: expected a Sequential (convolutional layers, then an optional head "
                      "from Flatten on), got a %s",
                      ts_module_type_name(seq));
        goto fail;
    }
    TS_CHECK_GOTO(plan_walk(seq, "", &pl));
    TS_CHECK_GOTO(ts_module_to(seq, output_device));
    TS_CHECK_GOTO(ts__module_new(&tile_vt, sizeof(tile_impl), &w));
    tile_impl *c = w->impl;
    c->devs = ts__calloc((size_t)n, sizeof *c->devs);
    if (!c->devs) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    memcpy(c->devs, devs, sizeof *c->devs * (size_t)n);
    c->n = n;
    c->out_dev = output_device;
    c->layers = pl.layers, c->nlayers = pl.nl;
    c->head = pl.head, c->head_names = pl.head_names, c->nhead = pl.nh;
    memset(&pl, 0, sizeof pl);
    w->training = seq->training;
    st = ts__module_add_child(w, "module", seq);
    seq = NULL; /* owned by w now, or freed by the failed add */
    if (st != TS_OK) goto fail;
    *out = w;
    return TS_OK;
fail:
    free(pl.layers);
    free(pl.head);
    free(pl.head_names);
    ts_module_free(seq);
    ts_module_free(w);
    return st;
}
