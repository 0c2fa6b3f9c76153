/*
 * ops/cpu/spatial.c — CPU kernels of the spatial family: conv2d (im2col +
 * sgemm), max/avg pooling and batchnorm2d, forward and backward.
 *
 * Threading: conv2d runs one image per OpenMP iteration and calls the BLAS
 * gemm inside the parallel region (OpenBLAS's OpenMP build then runs it on the
 * calling thread); with fewer images than threads it runs the images in turn
 * and lets BLAS use the threads. Weight and bias gradients are accumulated in
 * per-thread buffers and summed afterwards, so there are no races. Pooling runs
 * over (n, c) planes; batchnorm over channels, its per-plane sums and maps in
 * plane.c (16 float partial sums in a fixed order, totalled in double: the same
 * bits for float32 and bfloat16 planes and on every CPU).
 *
 * Fast paths: 1x1 stride-1 unpadded convs use the input as the im2col matrix;
 * stride-1 convs whose output rows are as long as the input's (3x3 pad 1, ...)
 * im2col/col2im a whole shifted span at once; 2x2 stride-2 max pooling is
 * branch-free (AVX-512 when the build targets it). Scratch buffers come from
 * ts__scratch_f32 so the device's caching allocator recycles them. 3x3
 * stride-1 convolutions may go to Winograd (winograd.c, ts__cpu_wino_ok).
 */
#include "tensor/tensor.h"
#include "core/half.h"
#include "device/k_blas.h"
#include "device/k_ew.h"
#include "device/k_spatial.h"
#include "ops/cpu/winograd.h"
#include "ops/cpu/dnnl_conv.h"
#include "ops/cpu/plane.h"

#include <math.h>
#include <omp.h>
#include <immintrin.h>

#define PAR_MIN 32768 /* below this many elements of work, stay on one thread */


/* Element i of a float32 or (h) bfloat16 array (the planes plane.h's kernels take); plane_at_w: writable */
static inline const void *plane_at(const void *base, int64_t i, bool h) { return (const char *)base + i * (h ? 2 : 4); }
static inline void *plane_at_w(void *base, int64_t i, bool h) { return (char *)base + i * (h ? 2 : 4); }

/* A float32 copy of bfloat16 tensor t (the device's cast kernel), or (widen false) an uninitialised float32
 * tensor of its shape. */
static ts_status f32_like(const ts_tensor *t, bool widen, ts_tensor **out) {
    TS_TRY(ts__new(t->storage->device, TS_F32, t->ndim, t->shape, out));
    return widen ? t->storage->device->k_ew->cast(*out, t) : TS_OK;
}

/* ================================ conv2d ================================ */

/* The range [*o0, *o1) of output positions o whose input position o*s + off lies in [0, n). */
static void valid_range(int64_t n, int64_t nout, int s, int64_t off, int64_t *o0, int64_t *o1) {
    int64_t lo = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t hi = (n - 1 - off) < 0 ? 0 : (n - 1 - off) / s + 1;
    if (hi > nout) hi = nout;
    if (lo > hi) lo = hi;
    *o0 = lo;
    *o1 = hi;
}

/* Tiny output planes (ResNet-18's layer4 at 64x64 inputs: 2x2): the rows of im2col are a few elements,
 * where a memset and a memcpy per row cost more than the copy. tiny_map gives, for each (ki, kj, oh, ow)
 * of the window over the plane, the input's offset in its channel plane or -1 for padding (false when the
 * plane is not tiny); im2col and col2im then gather and scatter through it, in the same order. */
#define TINY_PLANE 16   /* output positions */
#define TINY_MAP 1024   /* kh * kw * OH * OW entries */
static bool tiny_map(const ts_conv2d_geom *g, int32_t *map) {
    const int64_t OHW = g->OH * g->OW;
    if (OHW > TINY_PLANE || g->kh * g->kw * OHW > TINY_MAP) return false;
    for (int ki = 0; ki < g->kh; ki++)
        for (int kj = 0; kj < g->kw; kj++)
            for (int64_t oh = 0; oh < g->OH; oh++)
                for (int64_t ow = 0; ow < g->OW; ow++) {
                    const int64_t ih = oh * g->sh + (int64_t)ki * g->dh - g->ph;
                    const int64_t iw = ow * g->sw + (int64_t)kj * g->dw - g->pw;
                    *map++ = ih >= 0 && ih < g->H && iw >= 0 && iw < g->W ? (int32_t)(ih * g->W + iw) : -1;
                }
    return true;
}

/* col: (Cg*kh*kw, OH*OW) <- x: (Cg, H, W), zero outside the input; col's rows are ld floats apart
 * (ld >= OH*OW: the batched path puts several images' columns side by side). */
static void im2col_ld(const ts_conv2d_geom *g, int64_t Cg, const float *x, float *col, int64_t ld) {
    const int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW, OHW = OH * OW;
    int32_t map[TINY_MAP];
    if (tiny_map(g, map)) {
        const int64_t kk = (int64_t)g->kh * g->kw;
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t k = 0; k < kk; k++) {
                float *row = col + (c * kk + k) * ld;
                const int32_t *mk = map + k * OHW;
                const float *xc = x + c * H * W;
                for (int64_t p = 0; p < OHW; p++) row[p] = mk[p] >= 0 ? xc[mk[p]] : 0.0f;
            }
        return;
    }
    for (int ki = 0; ki < g->kh; ki++) {
        int64_t ioff = (int64_t)ki * g->dh - g->ph, oh0, oh1;
        valid_range(H, OH, g->sh, ioff, &oh0, &oh1);
        for (int kj = 0; kj < g->kw; kj++) {
            int64_t joff = (int64_t)kj * g->dw - g->pw, ow0, ow1;
            valid_range(W, OW, g->sw, joff, &ow0, &ow1);
            for (int64_t c = 0; c < Cg; c++) {
                float *row = col + ((c * g->kh + ki) * g->kw + kj) * ld;
                const float *xc = x + c * H * W;
                if (g->sh == 1 && g->sw == 1 && OW == W) {
                    /* rows of x and col have one length: the valid rows are one shifted copy,
                     * then the |joff| columns that wrapped around are zeroed */
                    const int64_t shift = ioff * W + joff, lo = oh0 * OW, hi = oh1 * OW;
                    const int64_t c0 = TS_MIN(TS_MAX(lo, -shift), hi), c1 = TS_MAX(TS_MIN(hi, H * W - shift), c0);
                    memset(row, 0, sizeof(float) * (size_t)c0);
                    if (c1 > c0) memcpy(row + c0, xc + c0 + shift, sizeof(float) * (size_t)(c1 - c0));
                    memset(row + c1, 0, sizeof(float) * (size_t)(OHW - c1));
                    for (int64_t oh = oh0; oh < oh1; oh++) {
                        for (int64_t ow = 0; ow < ow0; ow++) row[oh * OW + ow] = 0.0f;
                        for (int64_t ow = ow1; ow < OW; ow++) row[oh * OW + ow] = 0.0f;
                    }
                    continue;
                }
                if (oh0 > 0) memset(row, 0, sizeof(float) * (size_t)(oh0 * OW));
                for (int64_t oh = oh0; oh < oh1; oh++) {
                    float *dst = row + oh * OW;
                    const float *src = xc + (oh * g->sh + ioff) * W + joff;
                    for (int64_t ow = 0; ow < ow0; ow++) dst[ow] = 0.0f;
                    if (g->sw == 1)
                        for (int64_t ow = ow0; ow < ow1; ow++) dst[ow] = src[ow];
                    else
                        for (int64_t ow = ow0; ow < ow1; ow++) dst[ow] = src[ow * g->sw];
                    for (int64_t ow = ow1; ow < OW; ow++) dst[ow] = 0.0f;
                }
                if (oh1 < OH) memset(row + oh1 * OW, 0, sizeof(float) * (size_t)((OH - oh1) * OW));
            }
        }
    }
}

static void im2col(const ts_conv2d_geom *g, int64_t Cg, const float *x, float *col) {
    im2col_ld(g, Cg, x, col, g->OH * g->OW);
}

/* x: (Cg, H, W) += col: (Cg*kh*kw, OH*OW) scattered back (the adjoint of im2col); col's rows are ld
 * floats apart. col is scratch: entries that map to padding may be overwritten with zeros. */
static void col2im_add_ld(const ts_conv2d_geom *g, int64_t Cg, float *col, int64_t ld, float *x) {
    const int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW;
    int32_t map[TINY_MAP];
    if (tiny_map(g, map)) { /* the same (c, ki, kj, oh, ow) order of additions as below */
        const int64_t kk = (int64_t)g->kh * g->kw, OHW = OH * OW;
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t k = 0; k < kk; k++) {
                const float *row = col + (c * kk + k) * ld;
                const int32_t *mk = map + k * OHW;
                float *xc = x + c * H * W;
                for (int64_t p = 0; p < OHW; p++)
                    if (mk[p] >= 0) xc[mk[p]] += row[p];
            }
        return;
    }
    for (int64_t c = 0; c < Cg; c++) {
        float *xc = x + c * H * W;
        for (int ki = 0; ki < g->kh; ki++) {
            int64_t ioff = (int64_t)ki * g->dh - g->ph, oh0, oh1;
            valid_range(H, OH, g->sh, ioff, &oh0, &oh1);
            for (int kj = 0; kj < g->kw; kj++) {
                int64_t joff = (int64_t)kj * g->dw - g->pw, ow0, ow1;
                valid_range(W, OW, g->sw, joff, &ow0, &ow1);
                float *row = col + ((c * g->kh + ki) * g->kw + kj) * ld;
                if (g->sh == 1 && g->sw == 1 && OW == W) { /* as in im2col: one shifted span */
                    const int64_t shift = ioff * W + joff;
                    for (int64_t oh = oh0; oh < oh1; oh++) {
                        for (int64_t ow = 0; ow < ow0; ow++) row[oh * OW + ow] = 0.0f;
                        for (int64_t ow = ow1; ow < OW; ow++) row[oh * OW + ow] = 0.0f;
                    }
                    const int64_t c0 = TS_MAX(oh0 * OW, -shift), c1 = TS_MIN(oh1 * OW, H * W - shift);
                    for (int64_t i = c0; i < c1; i++) xc[i + shift] += row[i];
                    continue;
                }
                for (int64_t oh = oh0; oh < oh1; oh++) {
                    const float *src = row + oh * OW;
                    float *dst = xc + (oh * g->sh + ioff) * W + joff;
                    if (g->sw == 1)
                        for (int64_t ow = ow0; ow < ow1; ow++) dst[ow] += src[ow];
                    else
                        for (int64_t ow = ow0; ow < ow1; ow++) dst[ow * g->sw] += src[ow];
                }
            }
        }
    }
}

static void col2im_add(const ts_conv2d_geom *g, int64_t Cg, float *col, float *x) {
    col2im_add_ld(g, Cg, col, g->OH * g->OW, x);
}

/* 1x1, stride 1, no padding: the input plane is its own im2col matrix. */
static bool conv_is_pointwise(const ts_conv2d_geom *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* Run images in parallel when there is at least one per thread and enough work. */
static bool conv_par(const ts_conv2d_geom *g, int nthr) {
    return nthr > 1 && g->N >= nthr && g->N * g->K * g->OH * g->OW >= PAR_MIN;
}


/* ---- batched images: small output planes -------------------------------------------------------
 * Deep layers have small planes (ResNet-18's layer4 at 64x64 input: 2x2 = 4 columns), where a sgemm
 * per image spends its time packing. Below CONV_BATCH_COLS columns, images go in blocks of nb whose
 * im2col matrices sit side by side — (CKK, nb*OHW) — so one sgemm covers the block. Blocks run in
 * parallel when there are at least as many as threads; otherwise one after another, each sgemm split
 * between the threads by the blas kernel. */
#define CONV_BATCH_COLS 512

static int64_t conv_block_images(const ts_conv2d_geom *g) {
    const int64_t OHW = g->OH * g->OW, CKK = (g->C / g->groups) * g->kh * g->kw;
    if (OHW >= CONV_BATCH_COLS || CKK == 0 || g->N < 2) return 1;
    int64_t nb = (CONV_BATCH_COLS + OHW - 1) / OHW;
    return nb < g->N ? nb : g->N;
}

/* What one conv2d call's work items (an image, or a block of nb images) share. */
typedef struct conv_job {
    const ts_conv2d_geom *g;
    ts_device *dev;
    const struct ts_kernels_blas *blas;
    int64_t G, Cg, Kg, OHW, HW, CKK, WN, nb; /* nb: images per item (1: the per-image path) */
    bool pointwise;
    const float *px, *pw, *pb, *pg;          /* x, w, bias, gout */
    float *po, *pgx;                         /* out, gx */
    float *buf;                              /* per-thread scratch, `per` floats each */
    int64_t per, colsz;
    bool gw, gb;                             /* backward: weight / bias gradients wanted */
} conv_job;

typedef void (*conv_item_fn)(const conv_job *j, float *scratch, int64_t item);

/* Runs fn on items 0..n-1: as an OpenMP team (static schedule, thread t's scratch at buf + t*per) when
 * par, else on the calling thread outside any parallel region, so the sgemms inside run at top level
 * and split between the threads themselves (a parallel region nested in even an inactive one gets a
 * team of fresh threads: with the first team's threads spin-waiting, 2 cores ran ResNet-18 at a third
 * of the speed). */
static void conv_for(const conv_job *j, bool par, int64_t n, conv_item_fn fn) {
    if (!par) {
        for (int64_t i = 0; i < n; i++) fn(j, j->buf, i);
        return;
    }
#pragma omp parallel
    {
        float *mine = j->buf + (int64_t)omp_get_thread_num() * j->per;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) fn(j, mine, i);
    }
}

/* Adds the per-thread accumulators (weight gradient at woff, bias gradient at boff of each thread's
 * scratch) into gw / gb, thread 0's first, in a fixed order. */
static void conv_reduce(const conv_job *j, int nbuf, int64_t woff, int64_t boff, ts_tensor *gw, ts_tensor *gb) {
    if (gw) {
        float *o = ts__f32(gw);
        memcpy(o, j->buf + woff, sizeof(float) * (size_t)j->WN);
        for (int t = 1; t < nbuf; t++) {
            const float *sp = j->buf + t * j->per + woff;
            for (int64_t i = 0; i < j->WN; i++) o[i] += sp[i];
        }
    }
    if (gb) {
        float *o = ts__f32(gb);
        memcpy(o, j->buf + boff, sizeof(float) * (size_t)j->g->K);
        for (int t = 1; t < nbuf; t++) {
            const float *sp = j->buf + t * j->per + boff;
            for (int64_t i = 0; i < j->g->K; i++) o[i] += sp[i];
        }
    }
}

static conv_job conv_job_init(const ts_conv2d_geom *g, const ts_tensor *x, const ts_tensor *w) {
    conv_job j;
    memset(&j, 0, sizeof j);
    j.g = g;
    j.dev = x->storage->device;
    j.blas = j.dev->k_blas;
    j.G = g->groups;
    j.Cg = g->C / j.G;
    j.Kg = g->K / j.G;
    j.OHW = g->OH * g->OW;
    j.HW = g->H * g->W;
    j.CKK = j.Cg * g->kh * g->kw;
    j.WN = g->K * j.CKK;
    j.nb = conv_block_images(g);
    j.pointwise = j.nb == 1 && conv_is_pointwise(g);
    j.px = ts__f32(x);
    j.pw = ts__f32(w);
    return j;
}

/* ---- forward ---- */
// block `blk` of nb images, per group: tmp: (Kg, cols) = w_g @ [im2col(x[n]) ...]: (CKK, cols), then
// scattered to out: (N, K, OH, OW) with the bias
static void conv_fwd_block(const conv_job *j, float *scratch, int64_t blk) {
    const ts_conv2d_geom *g = j->g;
    float *col = scratch, *tmp = scratch + j->CKK * j->nb * j->OHW;
    const int64_t n0 = blk * j->nb, m = TS_MIN(j->nb, g->N - n0), cols = m * j->OHW;
    for (int64_t gr = 0; gr < j->G; gr++) {
        for (int64_t i = 0; i < m; i++)
            im2col_ld(g, j->Cg, j->px + ((n0 + i) * g->C + gr * j->Cg) * j->HW, col + i * j->OHW, cols);
        j->blas->sgemm(j->dev, false, false, j->Kg, cols, j->CKK, 1.0f, j->pw + gr * j->Kg * j->CKK, j->CKK, col,
                       cols, 0.0f, tmp, cols);
        for (int64_t i = 0; i < m; i++)
            for (int64_t k = 0; k < j->Kg; k++) {
                float *o = j->po + ((n0 + i) * g->K + gr * j->Kg + k) * j->OHW;
                const float *t = tmp + k * cols + i * j->OHW;
                const float bv = j->pb ? j->pb[gr * j->Kg + k] : 0.0f;
                for (int64_t q = 0; q < j->OHW; q++) o[q] = t[q] + bv;
            }
    }
}

// image n, per group: out_g: (Kg, OHW) = w_g: (Kg, CKK) @ im2col(x[n]): (CKK, OHW) + b
static void conv_fwd_image(const conv_job *j, float *col, int64_t n) {
    const ts_conv2d_geom *g = j->g;
    for (int64_t gr = 0; gr < j->G; gr++) {
        const float *xin = j->px + (n * g->C + gr * j->Cg) * j->HW;
        float *o = j->po + (n * g->K + gr * j->Kg) * j->OHW;
        const float *B = xin;
        if (!j->pointwise) {
            im2col(g, j->Cg, xin, col);
            B = col;
        }
        if (j->pb)
            for (int64_t k = 0; k < j->Kg; k++) {
                float bv = j->pb[gr * j->Kg + k];
                for (int64_t i = 0; i < j->OHW; i++) o[k * j->OHW + i] = bv;
            }
        if (j->CKK == 0) {
            if (!j->pb) memset(o, 0, sizeof(float) * (size_t)(j->Kg * j->OHW));
            continue;
        }
        j->blas->sgemm(j->dev, false, false, j->Kg, j->OHW, j->CKK, 1.0f, j->pw + gr * j->Kg * j->CKK, j->CKK, B,
                       j->OHW, j->pb ? 1.0f : 0.0f, o, j->OHW);
    }
}

// out: (N, K, OH, OW) = w: (K, Cg*kh*kw) @ im2col(x[n]): (Cg*kh*kw, OH*OW) per image (or block) and group, + b
static ts_status cpu_conv2d(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                            const ts_tensor *b);

/* bfloat16 x and out (float32 w, b): oneDNN reads and writes them directly; the other paths run on float32
 * copies, the output rounded once */
static ts_status conv2d_bf16(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                             const ts_tensor *b) {
    ts_status st;
    if (ts__cpu_dnnl_conv_ok(g) && ts__cpu_dnnl_conv2d(g, out, x, w, b, &st)) return st;
    ts_tensor *fx = NULL, *fo = NULL;
    st = f32_like(x, true, &fx);
    if (st == TS_OK) st = f32_like(out, false, &fo);
    if (st == TS_OK) st = cpu_conv2d(g, fo, fx, w, b);
    if (st == TS_OK) st = out->storage->device->k_ew->cast(out, fo);
    ts_tensor_release(fx);
    ts_tensor_release(fo);
    return st;
}

static ts_status cpu_conv2d(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                            const ts_tensor *b) {
    ts_status st;
    if (x->dtype == TS_BF16) return conv2d_bf16(g, out, x, w, b);
    if (ts__cpu_dnnl_conv_ok(g) && ts__cpu_dnnl_conv2d(g, out, x, w, b, &st)) return st;
    if (ts__cpu_wino_ok(g)) return ts__cpu_wino_conv2d(g, out, x, w, b);
    conv_job j = conv_job_init(g, x, w);
    j.pb = b ? ts__f32(b) : NULL;
    j.po = ts__f32(out);
    const int nthr = omp_get_max_threads();
    const int64_t items = (g->N + j.nb - 1) / j.nb;
    const bool par = j.nb > 1 ? nthr > 1 && items >= nthr : conv_par(g, nthr);
    j.per = j.nb > 1 ? (j.CKK + j.Kg) * j.nb * j.OHW : j.pointwise ? 0 : j.CKK * j.OHW;
    ts_tensor *buf = NULL;
    if (j.per) {
        TS_TRY(ts__scratch_f32(j.dev, (par ? nthr : 1) * j.per, &buf));
        j.buf = ts__f32(buf);
    }
    conv_for(&j, par, items, j.nb > 1 ? conv_fwd_block : conv_fwd_image);
    ts_tensor_release(buf);
    return TS_OK;
}

/* ---- backward ---- */
/* A thread's scratch: [goc (blocked path)] [colx] [colg] [gw accumulator] [gb accumulator]. */
typedef struct conv_bwd_layout {
    int64_t goc, colx, colg, gw, gb, per;
} conv_bwd_layout;

static conv_bwd_layout conv_bwd_layout_of(const conv_job *j, bool gx) {
    conv_bwd_layout l;
    const int64_t colsz = j->pointwise ? 0 : j->CKK * j->nb * j->OHW;
    l.goc = 0;
    l.colx = j->nb > 1 ? j->Kg * j->nb * j->OHW : 0;
    l.colg = l.colx + (j->gw ? colsz : 0);
    l.gw = l.colg + (gx ? colsz : 0);
    l.gb = l.gw + (j->gw ? j->WN : 0);
    l.per = l.gb + (j->gb ? j->g->K : 0);
    return l;
}

// block `blk`: goc: (Kg, cols) gathers gout's planes; gw_g += goc @ [im2col(x[n]) ...]^T;
// [colg ...] = w_g^T @ goc, scattered back by col2im per image
static void conv_bwd_block(const conv_job *j, float *s, int64_t blk) {
    const ts_conv2d_geom *g = j->g;
    const conv_bwd_layout l = conv_bwd_layout_of(j, j->pgx != NULL);
    float *goc = s + l.goc, *colx = s + l.colx, *colg = s + l.colg;
    float *gwt = j->gw ? s + l.gw : NULL, *gbt = j->gb ? s + l.gb : NULL;
    const int64_t n0 = blk * j->nb, m = TS_MIN(j->nb, g->N - n0), cols = m * j->OHW, OHW = j->OHW;
    /* The gathers and scatters around the two sgemms run over the threads when the block is the whole
     * batch (conv_for runs it alone, the sgemms split over the threads): left to one thread they were the
     * other's idle time */
    const bool par = !omp_in_parallel() && omp_get_max_threads() > 1 && cols * (j->Kg + j->CKK) >= PAR_MIN;
    for (int64_t gr = 0; gr < j->G; gr++) {
        const float *wg = j->pw + gr * j->Kg * j->CKK;
#pragma omp parallel for if (par) schedule(static)
        for (int64_t k = 0; k < j->Kg; k++) /* goc's row k: gout's plane k of each image (a few floats each) */
            for (int64_t i = 0; i < m; i++) {
                const float *src = j->pg + ((n0 + i) * g->K + gr * j->Kg + k) * OHW;
                float *dst = goc + k * cols + i * OHW;
                for (int64_t q = 0; q < OHW; q++) dst[q] = src[q];
                if (gbt) gbt[gr * j->Kg + k] += (float)ts__cpu_plane_sum(src, OHW, false);
            }
        if (gwt) {
#pragma omp parallel for if (par) schedule(static)
            for (int64_t i = 0; i < m; i++)
                im2col_ld(g, j->Cg, j->px + ((n0 + i) * g->C + gr * j->Cg) * j->HW, colx + i * j->OHW, cols);
            // gw_g: (Kg, CKK) += goc: (Kg, cols) @ colx^T: (cols, CKK)
            j->blas->sgemm(j->dev, false, true, j->Kg, j->CKK, cols, 1.0f, goc, cols, colx, cols, 1.0f,
                           gwt + gr * j->Kg * j->CKK, j->CKK);
        }
        if (j->pgx) {
            // colg: (CKK, cols) = w_g^T: (CKK, Kg) @ goc: (Kg, cols)
            j->blas->sgemm(j->dev, true, false, j->CKK, cols, j->Kg, 1.0f, wg, j->CKK, goc, cols, 0.0f, colg, cols);
#pragma omp parallel for if (par) schedule(static)
            for (int64_t i = 0; i < m; i++) {
                float *gxin = j->pgx + ((n0 + i) * g->C + gr * j->Cg) * j->HW;
                memset(gxin, 0, sizeof(float) * (size_t)(j->Cg * j->HW));
                col2im_add_ld(g, j->Cg, colg + i * j->OHW, cols, gxin);
            }
        }
    }
}

// image n: gx[n] = col2im(w_g^T (CKK, Kg) @ gout_g (Kg, OHW)); gw += gout_g @ im2col(x[n])^T; gb += row sums
static void conv_bwd_image(const conv_job *j, float *s, int64_t n) {
    const ts_conv2d_geom *g = j->g;
    const conv_bwd_layout l = conv_bwd_layout_of(j, j->pgx != NULL);
    float *colx = s + l.colx, *colg = s + l.colg;
    float *gwt = j->gw ? s + l.gw : NULL, *gbt = j->gb ? s + l.gb : NULL;
    for (int64_t gr = 0; gr < j->G; gr++) {
        const float *go = j->pg + (n * g->K + gr * j->Kg) * j->OHW;
        const float *xin = j->px + (n * g->C + gr * j->Cg) * j->HW;
        const float *wg = j->pw + gr * j->Kg * j->CKK;
        if (gbt)
            for (int64_t k = 0; k < j->Kg; k++)
                gbt[gr * j->Kg + k] += (float)ts__cpu_plane_sum(go + k * j->OHW, j->OHW, false);
        if (j->CKK == 0) continue;
        if (gwt) {
            const float *B = xin;
            if (!j->pointwise) {
                im2col(g, j->Cg, xin, colx);
                B = colx;
            }
            // gw_g: (Kg, CKK) += gout_g: (Kg, OHW) @ B^T: (OHW, CKK)
            j->blas->sgemm(j->dev, false, true, j->Kg, j->CKK, j->OHW, 1.0f, go, j->OHW, B, j->OHW, 1.0f,
                           gwt + gr * j->Kg * j->CKK, j->CKK);
        }
        if (j->pgx) {
            float *gxin = j->pgx + (n * g->C + gr * j->Cg) * j->HW;
            // colg: (CKK, OHW) = w_g^T: (CKK, Kg) @ gout_g: (Kg, OHW)
            if (j->pointwise) {
                j->blas->sgemm(j->dev, true, false, j->CKK, j->OHW, j->Kg, 1.0f, wg, j->CKK, go, j->OHW, 0.0f, gxin,
                               j->OHW);
            } else {
                j->blas->sgemm(j->dev, true, false, j->CKK, j->OHW, j->Kg, 1.0f, wg, j->CKK, go, j->OHW, 0.0f, colg,
                               j->OHW);
                memset(gxin, 0, sizeof(float) * (size_t)(j->Cg * j->HW));
                col2im_add(g, j->Cg, colg, gxin);
            }
        }
    }
}

/* BatchNorm's per-channel loops walk the tensor in memory order — image by image, each thread over its own
 * range of channels (channel_range), with per-channel accumulators — instead of channel by channel, which
 * jumps C*H*W elements between planes: planes of 7x7 .. 28x28 are too short for the hardware prefetcher, and
 * the reference CNN's bfloat16 BatchNorm spent most of its time waiting on those jumps. Each channel's
 * planes are still summed in image order, on one thread: the results do not change. */
static void channel_range(int64_t C, int64_t *c0, int64_t *c1) {
    const int64_t t = omp_in_parallel() ? omp_get_thread_num() : 0, nt = omp_in_parallel() ? omp_get_num_threads() : 1;
    *c0 = C * t / nt;
    *c1 = C * (t + 1) / nt;
}

/* gb[k] = sum of gout's planes of channel k over the images (float plane sums added in double, in image
 * order; the planes walked in memory order, as BatchNorm's: channel_range) */
static ts_status conv_grad_bias(const ts_conv2d_geom *g, const ts_tensor *gout, ts_tensor *gb) {
    const int64_t OHW = g->OH * g->OW, K = g->K;
    const bool h = gout->dtype == TS_BF16; /* bfloat16 activations' gradient */
    const void *go = ts__ptr(gout);
    float *pb = ts__f32(gb);
    double *acc = calloc((size_t)K, sizeof(double));
    if (!acc) return ts_error(TS_ERR_NOMEM, "conv2d backward: %lld channels' bias sums", (long long)K);
#pragma omp parallel if (g->N * K * OHW >= PAR_MIN)
    {
        int64_t k0, k1;
        channel_range(K, &k0, &k1);
        for (int64_t n = 0; n < g->N; n++)
            for (int64_t k = k0; k < k1; k++) {
                const int64_t o = (n * K + k) * OHW;
                acc[k] += ts__cpu_plane_sum(plane_at(go, o, h), OHW, h);
            }
        for (int64_t k = k0; k < k1; k++) pb[k] = (float)acc[k];
    }
    free(acc);
    return TS_OK;
}

/* Backward of a conv with a tiny output plane (dnnl_conv.h: TS_CONV_TINY_PLANE) under the automatic choice
 * or Winograd: the batched im2col path below — one sgemm per pass over the whole batch, tiny_map's gathers —
 * beats oneDNN's direct kernels and our Winograd there (512 channels at 2x2, batch 32: 6.6 vs 10.1 ms at one
 * thread, 4.3 vs 5.5 at two; ResNet-18 64x64 training +8% at one thread, +5% at two; at 4x4 oneDNN wins).
 * Under bfloat16 precision the sgemms are blas.c's bfloat16 products (operands rounded, float32
 * accumulation, as oneDNN's bfloat16 convolutions): +1-3% at one thread, +8-14% at two. float16 goes to
 * im2col anyway. */
static bool conv_bwd_batched(const ts_conv2d_geom *g) {
    const ts_conv_algo a = ts_get_conv_algo();
    return g->OH * g->OW <= TS_CONV_TINY_PLANE && (a == TS_CONV_AUTO || a == TS_CONV_WINOGRAD) &&
           ts_get_matmul_precision() != TS_F16 && conv_block_images(g) == g->N;
}

static ts_status cpu_conv2d_backward(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                     const ts_tensor *w, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb);

/* The batched tiny-plane backward (conv_bwd_batched) on bfloat16 gout, x and gx, one group: gout's planes
 * gathered into goc (K, N*OHW) and x's windows into colx (C*kh*kw, N*OHW) in bfloat16 through tiny_map, the two
 * products through the blas table's gemm_bf16 (bfloat16 operands read as they are), gx scattered per image
 * in float32 and rounded once. The float32 path would widen gout and x, gather in float32 and round the
 * columns back to bfloat16 for its products. false (nothing touched) when it does not apply. */
static bool conv2d_backward_tiny_bf16(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                      const ts_tensor *w, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb, ts_status *st) {
    ts_device *dev = x->storage->device;
    int32_t map[TINY_MAP];
    if (g->groups != 1 || !dev->k_blas->gemm_bf16 || !tiny_map(g, map)) return false;
    const int64_t N = g->N, K = g->K, C = g->C, OHW = g->OH * g->OW, HW = g->H * g->W, kk = (int64_t)g->kh * g->kw,
                  CKK = C * kk, cols = N * OHW;
    const uint16_t *go = ts__ptr(gout), *px = ts__ptr(x);
    ts_tensor *tgoc = NULL, *tcol = NULL, *tcg = NULL, *tacc = NULL;
    *st = ts__scratch_bytes(dev, sizeof(uint16_t) * (size_t)(K * cols), &tgoc);
    if (*st != TS_OK) return true;
    uint16_t *goc = ts__ptr(tgoc);
    const bool par = omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for if (par) schedule(static)
    for (int64_t k = 0; k < K; k++) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t q = 0; q < OHW; q++) goc[k * cols + n * OHW + q] = go[(n * K + k) * OHW + q];
        if (gb) ts__f32(gb)[k] = (float)ts__cpu_plane_sum(goc + k * cols, cols, true);
    }
    if (gw && *st == TS_OK) { /* gw (K, CKK) = goc (K, cols) @ colx^T (cols, CKK) */
        *st = ts__scratch_bytes(dev, sizeof(uint16_t) * (size_t)(CKK * cols), &tcol);
        uint16_t *colx = *st == TS_OK ? ts__ptr(tcol) : NULL;
        if (colx) {
#pragma omp parallel for if (par) schedule(static)
            for (int64_t r = 0; r < CKK; r++) {
                const int64_t c = r / kk, t = r % kk;
                for (int64_t n = 0; n < N; n++)
                    for (int64_t q = 0; q < OHW; q++) {
                        const int32_t m = map[t * OHW + q];
                        colx[r * cols + n * OHW + q] = m >= 0 ? px[(n * C + c) * HW + m] : 0;
                    }
            }
            *st = dev->k_blas->gemm_bf16(dev, false, true, K, CKK, cols, 1.0f, goc, TS_BF16, cols, colx, TS_BF16, cols,
                                         0.0f, ts__f32(gw), CKK);
        }
    }
    if (gx && *st == TS_OK) { /* colg (CKK, cols) = w^T (CKK, K) @ goc (K, cols); gx = col2im per image */
        *st = ts__scratch_f32(dev, CKK * cols, &tcg);
        if (*st == TS_OK) *st = ts__scratch_f32(dev, (par ? omp_get_max_threads() : 1) * C * HW, &tacc);
        if (*st == TS_OK)
            *st = dev->k_blas->gemm_bf16(dev, true, false, CKK, cols, K, 1.0f, ts__f32(w), TS_F32, CKK, goc, TS_BF16,
                                         cols, 0.0f, ts__f32(tcg), cols);
        if (*st == TS_OK) {
            const float *colg = ts__f32(tcg);
            uint16_t *pgx = ts__ptr(gx);
#pragma omp parallel for if (par) schedule(static)
            for (int64_t n = 0; n < N; n++) {
                float *acc = ts__f32(tacc) + (par ? omp_get_thread_num() : 0) * C * HW;
                memset(acc, 0, sizeof(float) * (size_t)(C * HW));
                for (int64_t c = 0; c < C; c++)
                    for (int64_t t = 0; t < kk; t++)
                        for (int64_t q = 0; q < OHW; q++) {
                            const int32_t m = map[t * OHW + q];
                            if (m >= 0) acc[c * HW + m] += colg[(c * kk + t) * cols + n * OHW + q];
                        }
                (void)ts_convert(pgx + n * C * HW, TS_BF16, acc, TS_F32, (size_t)(C * HW));
            }
        }
    }
    ts_tensor_release(tgoc);
    ts_tensor_release(tcol);
    ts_tensor_release(tcg);
    ts_tensor_release(tacc);
    return true;
}

/* bfloat16 gout, x, gx (float32 w, gw, gb), as conv2d_bf16 */
static ts_status conv2d_backward_bf16(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                      const ts_tensor *w, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb) {
    ts_status st;
    const bool batched = conv_bwd_batched(g);
    if (!batched && ts__cpu_dnnl_conv_ok(g) && ts__cpu_dnnl_conv2d_backward(g, gout, x, w, gx, gw, &gb, &st)) {
        if (st == TS_OK && gb) st = conv_grad_bias(g, gout, gb);
        return st;
    }
    if (batched && conv2d_backward_tiny_bf16(g, gout, x, w, gx, gw, gb, &st)) return st;
    ts_tensor *fg = NULL, *fx = NULL, *fgx = NULL;
    st = f32_like(gout, true, &fg);
    if (st == TS_OK) st = f32_like(x, true, &fx);
    if (st == TS_OK && gx) st = f32_like(gx, false, &fgx);
    if (st == TS_OK) st = cpu_conv2d_backward(g, fg, fx, w, fgx, gw, gb);
    if (st == TS_OK && gx) st = gx->storage->device->k_ew->cast(gx, fgx);
    ts_tensor_release(fg);
    ts_tensor_release(fx);
    ts_tensor_release(fgx);
    return st;
}

static ts_status cpu_conv2d_backward(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                     const ts_tensor *w, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb) {
    ts_status st;
    if (x->dtype == TS_BF16) return conv2d_backward_bf16(g, gout, x, w, gx, gw, gb);
    const bool batched = conv_bwd_batched(g);
    if (!batched && ts__cpu_dnnl_conv_ok(g) && ts__cpu_dnnl_conv2d_backward(g, gout, x, w, gx, gw, &gb, &st)) {
        if (st == TS_OK && gb) st = conv_grad_bias(g, gout, gb);
        return st;
    }
    if (!batched && ts__cpu_wino_ok(g)) {
        if (gb && (st = conv_grad_bias(g, gout, gb)) != TS_OK) return st;
        return ts__cpu_wino_conv2d_backward(g, gout, x, w, gx, gw);
    }
    conv_job j = conv_job_init(g, x, w);
    j.pg = ts__f32(gout);
    j.pgx = gx ? ts__f32(gx) : NULL;
    j.gw = gw != NULL;
    j.gb = gb != NULL;
    const int nthr = omp_get_max_threads();
    const int64_t items = (g->N + j.nb - 1) / j.nb;
    const bool par = j.nb > 1 ? nthr > 1 && items >= nthr : conv_par(g, nthr);
    const int nbuf = par ? nthr : 1;
    const conv_bwd_layout l = conv_bwd_layout_of(&j, gx != NULL);
    j.per = l.per;
    ts_tensor *buf = NULL;
    TS_TRY(ts__scratch_f32(j.dev, nbuf * j.per + 1, &buf));
    j.buf = ts__f32(buf);
    for (int t = 0; t < nbuf; t++) { /* the accumulators start at zero */
        if (gw) memset(j.buf + t * j.per + l.gw, 0, sizeof(float) * (size_t)j.WN);
        if (gb) memset(j.buf + t * j.per + l.gb, 0, sizeof(float) * (size_t)g->K);
    }
    conv_for(&j, par, items, j.nb > 1 ? conv_bwd_block : conv_bwd_image);
    conv_reduce(&j, nbuf, l.gw, l.gb, gw, gb);
    ts_tensor_release(buf);
    return TS_OK;
}

/* ================================ pooling ================================ */

/* The first valid input position of a window starting at s with step d, or n when none. */
static inline int64_t first_valid(int64_t s, int d) {
    if (s >= 0) return s;
    return s + ((-s + d - 1) / d) * d;
}

/* One output row of the 2x2 / stride 2 max pool from input rows r0, r1 (r1 = r0 + W).
 * o, ix: OW outputs; b0, b1: flat indices of r0[0], r1[0] in the plane. The max,
 * then the first position holding it (selected last-to-first), which is the
 * sequential rule when there is no NaN; returns true when a NaN was seen (the
 * caller then redoes the row with the sequential rule). */
/* Where a 2x2 window's max m is, of its candidates a, b (row r0, even and odd column), c, d (row r1) at
 * flat indices j + b0, j + b0 + 1, j + b1, j + b1 + 1 (j: the even columns): the first that holds it
 * (selected last to first). */
__attribute__((target("avx512f"))) static inline __m512i maxpool4_index(__m512 a, __m512 b, __m512 c, __m512 m,
                                                                       __m512i j, int32_t b0, int32_t b1) {
    __m512i bi = _mm512_add_epi32(j, _mm512_set1_epi32(b1 + 1));
    bi = _mm512_mask_mov_epi32(bi, _mm512_cmp_ps_mask(c, m, _CMP_EQ_OQ), _mm512_add_epi32(j, _mm512_set1_epi32(b1)));
    bi = _mm512_mask_mov_epi32(bi, _mm512_cmp_ps_mask(b, m, _CMP_EQ_OQ), _mm512_add_epi32(j, _mm512_set1_epi32(b0 + 1)));
    return _mm512_mask_mov_epi32(bi, _mm512_cmp_ps_mask(a, m, _CMP_EQ_OQ), _mm512_add_epi32(j, _mm512_set1_epi32(b0)));
}

/* The AVX-512 part of maxpool_2x2_row: every output of the row (masked tail); compiled for AVX-512 whatever
 * the build's -march, run only where cpuid has it. */
__attribute__((target("avx512f"))) static int maxpool_2x2_row_avx512(const float *r0, const float *r1, int64_t OW,
                                                                     int32_t b0, int32_t b1, float *o, int32_t *ix) {
    int nan = 0;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int64_t ow = 0; ow < OW; ow += 16) {
        int64_t nout = TS_MIN(16, OW - ow), nin = 2 * nout;
        __mmask16 mlo = (__mmask16)(nin >= 16 ? 0xffff : (1u << nin) - 1);
        __mmask16 mhi = (__mmask16)(nin <= 16 ? 0 : (1u << (nin - 16)) - 1);
        __mmask16 mout = (__mmask16)(nout == 16 ? 0xffff : (1u << nout) - 1);
        const float *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
        __m512 l0 = _mm512_maskz_loadu_ps(mlo, p0), h0 = _mm512_maskz_loadu_ps(mhi, p0 + 16);
        __m512 l1 = _mm512_maskz_loadu_ps(mlo, p1), h1 = _mm512_maskz_loadu_ps(mhi, p1 + 16);
        __m512 a = _mm512_permutex2var_ps(l0, ev, h0), b = _mm512_permutex2var_ps(l0, od, h0);
        __m512 c = _mm512_permutex2var_ps(l1, ev, h1), d = _mm512_permutex2var_ps(l1, od, h1);
        __m512 m = _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(b, a), c), d); /* max(x, y) = x > y ? x : y */
        const __m512i bi = maxpool4_index(a, b, c, m, _mm512_add_epi32(ev, _mm512_set1_epi32((int32_t)(2 * ow))), b0, b1);
        nan |= (_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, d, _CMP_UNORD_Q)) != 0;
        _mm512_mask_storeu_ps(o + ow, mout, m);
        _mm512_mask_storeu_epi32(ix + ow, mout, bi);
    }
    return nan;
}

/* maxpool_2x2_row_avx512 on bfloat16 rows: each 32-bit lane of a row holds an even column (low half) and the
 * odd one after it (high half), so the four candidates widen with a shift and a mask; the max is one of them,
 * narrowed back exactly. AVX-512 (F, BW), run only where cpuid has it. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static int maxpool_2x2_row16_avx512(const uint16_t *r0,
                                                                                      const uint16_t *r1, int64_t OW,
                                                                                      int32_t b0, int32_t b1,
                                                                                      uint16_t *o, int32_t *ix) {
    int nan = 0;
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i hi = _mm512_set1_epi32((int32_t)0xffff0000u);
    for (int64_t ow = 0; ow < OW; ow += 16) {
        const int64_t nout = TS_MIN(16, OW - ow);
        const __mmask16 mout = (__mmask16)(nout == 16 ? 0xffff : (1u << nout) - 1);
        const __m512i w0 = _mm512_maskz_loadu_epi32(mout, r0 + 2 * ow), w1 = _mm512_maskz_loadu_epi32(mout, r1 + 2 * ow);
        const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)), b = _mm512_castsi512_ps(_mm512_and_si512(w0, hi));
        const __m512 c = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)), d = _mm512_castsi512_ps(_mm512_and_si512(w1, hi));
        __m512 m = _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(b, a), c), d);
        const __m512i bi = maxpool4_index(a, b, c, m, _mm512_add_epi32(ev, _mm512_set1_epi32((int32_t)(2 * ow))), b0, b1);
        nan |= (_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, d, _CMP_UNORD_Q)) != 0;
        _mm256_mask_storeu_epi16(o + ow, mout, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(m), 16)));
        _mm512_mask_storeu_epi32(ix + ow, mout, bi);
    }
    return nan;
}

static _Atomic int have_avx512 = -1; /* cpuid, asked once */
static bool avx512(void) {
    if (have_avx512 < 0) have_avx512 = __builtin_cpu_supports("avx512f") ? 1 : 0;
    return have_avx512 != 0;
}


/* Max-pool outputs t = 0..n-1 (n <= 16) of one output row whose windows lie inside the row horizontally:
 * window t spans columns c0 + t sw .. + kw - 1 (sw 1 or 2, dilation 1) of rows h0, h0 + dh, .. < he.
 * The max and the first position holding it in scan order (as the sequential loop); returns true when a
 * NaN was seen (the caller then redoes these outputs sequentially: a NaN wins there). AVX-512, run only
 * where cpuid has it. */
__attribute__((target("avx512f"))) static int maxpool_cols_avx512(const float *xp, int64_t W, int64_t h0, int64_t he,
                                                                  int dh, int kw, int sw, int64_t c0, int64_t n,
                                                                  float *o, int32_t *ix) {
    const __mmask16 m = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    const int64_t nin = sw == 1 ? n : 2 * n - 1; /* input floats a tap reads */
    const __mmask16 mlo = (__mmask16)(nin >= 16 ? 0xffff : (1u << nin) - 1);
    const __mmask16 mhi = (__mmask16)(nin <= 16 ? 0 : (1u << (nin - 16)) - 1);
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i step = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(sw));
    __m512 best = _mm512_set1_ps(-INFINITY);
    __m512i bi = _mm512_add_epi32(step, _mm512_set1_epi32((int32_t)(h0 * W + c0)));
    int nan = 0;
    for (int64_t ih = h0; ih < he; ih += dh)
        for (int j = 0; j < kw; j++) {
            const float *p = xp + ih * W + c0 + j;
            __m512 v = sw == 1 ? _mm512_maskz_loadu_ps(m, p)
                               : _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(mlo, p), ev,
                                                        _mm512_maskz_loadu_ps(mhi, p + 16));
            __mmask16 gt = _mm512_mask_cmp_ps_mask(m, v, best, _CMP_GT_OQ);
            nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q) != 0;
            best = _mm512_mask_mov_ps(best, gt, v);
            bi = _mm512_mask_mov_epi32(bi, gt, _mm512_add_epi32(step, _mm512_set1_epi32((int32_t)(ih * W + c0 + j))));
        }
    _mm512_mask_storeu_ps(o, m, best);
    _mm512_mask_storeu_epi32(ix, m, bi);
    return nan;
}

static bool maxpool_2x2_row(const float *r0, const float *r1, int64_t OW, int32_t b0, int32_t b1, float *o,
                            int32_t *ix) {
    if (avx512()) return maxpool_2x2_row_avx512(r0, r1, OW, b0, b1, o, ix) != 0;
    int nan = 0;
    for (int64_t ow = 0; ow < OW; ow++) {
        const int32_t j = (int32_t)(2 * ow);
        float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
        float m = b > a ? b : a;
        m = c > m ? c : m;
        m = d > m ? d : m;
        int32_t bi = b1 + j + 1;
        bi = c == m ? b1 + j : bi;
        bi = b == m ? b0 + j + 1 : bi;
        bi = a == m ? b0 + j : bi;
        nan |= (a != a) | (b != b) | (c != c) | (d != d);
        o[ow] = m;
        ix[ow] = bi;
    }
    return nan != 0;
}

/* One (n, c) plane of the max pool: xp (H, W) -> op, ip (OH, OW); k2s2: the 2x2 / stride 2 window always
 * inside; vec: AVX-512 for the windows inside a row */
static void maxpool_plane(const ts_pool2d_geom *g, const float *xp, float *op, int32_t *ip, bool k2s2, bool vec) {
    const int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW;
    if (k2s2) { /* the common 2x2 / stride 2 window, always inside */
        for (int64_t oh = 0; oh < OH; oh++) {
            const float *r0 = xp + 2 * oh * W, *r1 = r0 + W;
            const int32_t b0 = (int32_t)(2 * oh * W), b1 = (int32_t)(b0 + W);
            float *o = op + oh * OW;
            int32_t *ix = ip + oh * OW;
            if (!maxpool_2x2_row(r0, r1, OW, b0, b1, o, ix)) continue;
            for (int64_t ow = 0; ow < OW; ow++) { /* a NaN wins, the last one seen */
                const int32_t j = (int32_t)(2 * ow);
                const int32_t pos[4] = {b0 + j, b0 + j + 1, b1 + j, b1 + j + 1};
                float best = xp[pos[0]];
                int32_t bi = pos[0];
                for (int q = 1; q < 4; q++) {
                    float v = xp[pos[q]];
                    if (v > best || isnan(v)) best = v, bi = pos[q];
                }
                o[ow] = best;
                ix[ow] = bi;
            }
        }
        return;
    }
    for (int64_t oh = 0; oh < OH; oh++) {
        int64_t hs = oh * g->sh - g->ph, he = TS_MIN(hs + (int64_t)(g->kh - 1) * g->dh + 1, H);
        int64_t h0 = first_valid(hs, g->dh);
        /* the outputs whose windows lie inside the row go 16 at a time (AVX-512), the edges one by one */
        int64_t lo = OW, hi = OW;
        if (vec && h0 < he) {
            lo = (g->pw + g->sw - 1) / g->sw;
            hi = TS_MIN(OW, W - g->kw + g->pw >= 0 ? (W - g->kw + g->pw) / g->sw + 1 : 0);
            if (hi <= lo) lo = hi = OW;
        }
        for (int64_t ow = lo; ow < hi; ow += 16) {
            int64_t n = TS_MIN(16, hi - ow);
            if (!maxpool_cols_avx512(xp, W, h0, he, g->dh, g->kw, g->sw, ow * g->sw - g->pw, n, op + oh * OW + ow,
                                     ip + oh * OW + ow))
                continue;
            for (int64_t t = ow; t < ow + n; t++) { /* a NaN: sequentially */
                float best = -INFINITY;
                int64_t bi = h0 * W + t * g->sw - g->pw;
                for (int64_t ih = h0; ih < he; ih += g->dh)
                    for (int64_t iw = t * g->sw - g->pw; iw < t * g->sw - g->pw + g->kw; iw++) {
                        float v = xp[ih * W + iw];
                        if (v > best || isnan(v)) {
                            best = v;
                            bi = ih * W + iw;
                        }
                    }
                op[oh * OW + t] = best;
                ip[oh * OW + t] = (int32_t)bi;
            }
        }
        for (int64_t ow = 0; ow < OW; ow++) {
            if (ow == lo) ow = hi; /* done above */
            if (ow >= OW) break;
            int64_t ws = ow * g->sw - g->pw, we = TS_MIN(ws + (int64_t)(g->kw - 1) * g->dw + 1, W);
            int64_t w0 = first_valid(ws, g->dw);
            float best = -INFINITY;
            int64_t bi = h0 * W + w0;
            for (int64_t ih = h0; ih < he; ih += g->dh)
                for (int64_t iw = w0; iw < we; iw += g->dw) {
                    float v = xp[ih * W + iw];
                    if (v > best || isnan(v)) {
                        best = v;
                        bi = ih * W + iw;
                    }
                }
            op[oh * OW + ow] = best;
            ip[oh * OW + ow] = (int32_t)(h0 < he && w0 < we ? bi : 0); /* (a window always has an element) */
        }
    }
}

// out, idx: (N, C, OH, OW) <- max over each window of x: (N, C, H, W). bfloat16 x and out: each plane
// widened into a thread's float32 scratch (a max rounds nothing: the output is exact)
static ts_status cpu_maxpool2d(const ts_pool2d_geom *g, ts_tensor *out, ts_tensor *idx, const ts_tensor *x) {
    const int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW, P = g->N * g->C;
    const bool h = x->dtype == TS_BF16;
    int32_t *pi = (int32_t *)ts__ptr(idx);
    const bool k2s2 = g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0 &&
                      g->dh == 1 && g->dw == 1 && 2 * OH <= H && 2 * OW <= W;
    const bool vec = avx512() && g->dw <= 1 && (g->sw == 1 || g->sw == 2);
    const int64_t per = H * W + OH * OW;
    ts_tensor *scr = NULL;
    if (h) TS_TRY(ts__scratch_f32(x->storage->device, omp_get_max_threads() * per, &scr));
    float *sb = h ? ts__f32(scr) : NULL;
#pragma omp parallel for if (P * H * W > PAR_MIN) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        if (!h) {
            maxpool_plane(g, ts__f32(x) + p * H * W, ts__f32(out) + p * OH * OW, pi + p * OH * OW, k2s2, vec);
            continue;
        }
        float *t = sb + omp_get_thread_num() * per;
        const uint16_t *xp = (const uint16_t *)ts__ptr(x) + p * H * W;
        uint16_t *op = (uint16_t *)ts__ptr(out) + p * OH * OW;
        if (k2s2 && ts__cpu_avx512bw()) { /* on the bfloat16 rows; a plane with a NaN goes the float32 way below */
            int nan = 0;
            for (int64_t oh = 0; oh < OH && !nan; oh++)
                nan = maxpool_2x2_row16_avx512(xp + 2 * oh * W, xp + (2 * oh + 1) * W, OW, (int32_t)(2 * oh * W),
                                               (int32_t)((2 * oh + 1) * W), op + oh * OW, pi + p * OH * OW + oh * OW);
            if (!nan) continue;
        }
        (void)ts_convert(t, TS_F32, xp, TS_BF16, (size_t)(H * W));
        maxpool_plane(g, t, t + H * W, pi + p * OH * OW, k2s2, vec);
        (void)ts_convert(op, TS_BF16, t + H * W, TS_F32, (size_t)(OH * OW));
    }
    ts_tensor_release(scr);
    return TS_OK;
}

// gx: (N, C, H, W) = scatter-add of gout: (N, C, OH, OW) at idx
static ts_status cpu_maxpool2d_backward(const ts_pool2d_geom *g, ts_tensor *gx, const ts_tensor *gout,
                                        const ts_tensor *idx) {
    const int64_t HW = g->H * g->W, OHW = g->OH * g->OW, P = g->N * g->C;
    const int32_t *pi = (const int32_t *)ts__ptr(idx);
    if (gx->dtype == TS_BF16 && g->sh >= g->kh && g->sw >= g->kw && g->dh == 1 && g->dw == 1) {
        /* windows that do not overlap: each input takes at most one gradient, copied as it is */
        uint16_t *px = ts__ptr(gx);
        const uint16_t *pg = ts__ptr(gout);
#pragma omp parallel for if (P * HW > PAR_MIN) schedule(static)
        for (int64_t p = 0; p < P; p++) {
            uint16_t *xp = px + p * HW;
            const uint16_t *gp = pg + p * OHW;
            const int32_t *ip = pi + p * OHW;
            memset(xp, 0, sizeof(uint16_t) * (size_t)HW);
            for (int64_t i = 0; i < OHW; i++) xp[ip[i]] = gp[i];
        }
        return TS_OK;
    }
    if (gx->dtype == TS_BF16) { /* overlapping windows: summed in a thread's float32 plane, rounded once */
        ts_tensor *scr = NULL;
        TS_TRY(ts__scratch_f32(gx->storage->device, omp_get_max_threads() * HW, &scr));
        float *sb = ts__f32(scr);
        uint16_t *px = ts__ptr(gx);
        const uint16_t *pg = ts__ptr(gout);
#pragma omp parallel for if (P * HW > PAR_MIN) schedule(static)
        for (int64_t p = 0; p < P; p++) {
            float *t = sb + omp_get_thread_num() * HW;
            const uint16_t *gp = pg + p * OHW;
            const int32_t *ip = pi + p * OHW;
            memset(t, 0, sizeof(float) * (size_t)HW);
            for (int64_t i = 0; i < OHW; i++) t[ip[i]] += ts__bf16_to_f32(gp[i]);
            (void)ts_convert(px + p * HW, TS_BF16, t, TS_F32, (size_t)HW);
        }
        ts_tensor_release(scr);
        return TS_OK;
    }
    float *px = ts__f32(gx);
    const float *pg = ts__f32(gout);
#pragma omp parallel for if (P * HW > PAR_MIN) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        float *xp = px + p * HW;
        const float *gp = pg + p * OHW;
        const int32_t *ip = pi + p * OHW;
        memset(xp, 0, sizeof(float) * (size_t)HW);
        for (int64_t i = 0; i < OHW; i++) xp[ip[i]] += gp[i];
    }
    return TS_OK;
}

/* Reciprocal of each window's divisor (count_include_pad: the window clipped
 * at H + ph, W + pw; exclude_pad: the input elements in it), or 0 for a window
 * with no input element: inv (OH*OW). PyTorch's avg_pool2d rule. */
static void avgpool_divisors(const ts_pool2d_geom *g, float *inv) {
    for (int64_t oh = 0; oh < g->OH; oh++) {
        int64_t hs = oh * g->sh - g->ph, he = TS_MIN(hs + g->kh, g->H + g->ph);
        int64_t hn = TS_MIN(he, g->H) - TS_MAX(hs, 0); /* input rows in the window */
        for (int64_t ow = 0; ow < g->OW; ow++) {
            int64_t ws = ow * g->sw - g->pw, we = TS_MIN(ws + g->kw, g->W + g->pw);
            int64_t wn = TS_MIN(we, g->W) - TS_MAX(ws, 0);
            int64_t count = g->exclude_pad ? hn * wn : (he - hs) * (we - ws);
            inv[oh * g->OW + ow] = hn > 0 && wn > 0 ? 1.0f / (float)count : 0.0f;
        }
    }
}

// out: (N, C, OH, OW) = window sums of x: (N, C, H, W) / window size
static ts_status cpu_avgpool2d(const ts_pool2d_geom *g, ts_tensor *out, const ts_tensor *x) {
    const int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW, P = g->N * g->C;
    ts_tensor *invt = NULL;
    TS_TRY(ts__scratch_f32(x->storage->device, OH * OW, &invt));
    const float *inv = ts__f32(invt);
    avgpool_divisors(g, ts__f32(invt));
    const float *px = ts__f32(x);
    float *po = ts__f32(out);
#pragma omp parallel for if (P * H * W > PAR_MIN) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        const float *xp = px + p * H * W;
        float *op = po + p * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t hs = TS_MAX(oh * g->sh - g->ph, 0), he = TS_MIN(oh * g->sh - g->ph + g->kh, H);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t ws = TS_MAX(ow * g->sw - g->pw, 0), we = TS_MIN(ow * g->sw - g->pw + g->kw, W);
                float s = 0.0f;
                for (int64_t ih = hs; ih < he; ih++)
                    for (int64_t iw = ws; iw < we; iw++) s += xp[ih * W + iw];
                op[oh * OW + ow] = s * inv[oh * OW + ow];
            }
        }
    }
    ts_tensor_release(invt);
    return TS_OK;
}

// gx: (N, C, H, W) = each gout: (N, C, OH, OW) spread evenly over its window
static ts_status cpu_avgpool2d_backward(const ts_pool2d_geom *g, ts_tensor *gx, const ts_tensor *gout) {
    const int64_t H = g->H, W = g->W, OH = g->OH, OW = g->OW, P = g->N * g->C;
    ts_tensor *invt = NULL;
    TS_TRY(ts__scratch_f32(gx->storage->device, OH * OW, &invt));
    const float *inv = ts__f32(invt);
    avgpool_divisors(g, ts__f32(invt));
    float *px = ts__f32(gx);
    const float *pg = ts__f32(gout);
#pragma omp parallel for if (P * H * W > PAR_MIN) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        float *xp = px + p * H * W;
        const float *gp = pg + p * OH * OW;
        memset(xp, 0, sizeof(float) * (size_t)(H * W));
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t hs = TS_MAX(oh * g->sh - g->ph, 0), he = TS_MIN(oh * g->sh - g->ph + g->kh, H);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t ws = TS_MAX(ow * g->sw - g->pw, 0), we = TS_MIN(ow * g->sw - g->pw + g->kw, W);
                float v = gp[oh * OW + ow] * inv[oh * OW + ow];
                for (int64_t ih = hs; ih < he; ih++)
                    for (int64_t iw = ws; iw < we; iw++) xp[ih * W + iw] += v;
            }
        }
    }
    ts_tensor_release(invt);
    return TS_OK;
}

/* =============================== batchnorm2d =============================== */

// mean, mres (or NULL), invstd: (C) <- x: (N, C, H, W); running_mean, running_var: (C) updated in place
static ts_status cpu_batchnorm2d_stats(const ts_tensor *x, float eps, float momentum, ts_tensor *mean,
                                       ts_tensor *mres, ts_tensor *invstd, ts_tensor *running_mean,
                                       ts_tensor *running_var) {
    const int64_t N = x->shape[0], C = x->shape[1], HW = x->shape[2] * x->shape[3], M = N * HW;
    const bool h = x->dtype == TS_BF16; /* bfloat16 activations: the statistics in float32 all the same */
    const void *px = ts__ptr(x);
    float *pm = ts__f32(mean), *pis = ts__f32(invstd), *pr = mres ? ts__f32(mres) : NULL;
    float *rm = running_mean ? ts__f32(running_mean) : NULL, *rv = running_var ? ts__f32(running_var) : NULL;
    const double mom = momentum;
    double *acc = malloc(sizeof(double) * (size_t)(3 * C)); /* per channel: the shift, s1, s2 */
    if (!acc) return ts_error(TS_ERR_NOMEM, "batchnorm2d: %lld channels' sums", (long long)C);
#pragma omp parallel if (N * C * HW > PAR_MIN)
    {
        int64_t c0, c1;
        channel_range(C, &c0, &c1);
        /* one pass: sums of (x - s) and (x - s)^2 about s, the mean of the channel's first plane (close to
         * the channel's mean, so sum (x - mu)^2 = s2 - s1^2 / M cancels no more than a two-pass sum would);
         * x is read 1 + 1/N times instead of twice: BatchNorm is memory-bound */
        for (int64_t c = c0; c < c1; c++) {
            acc[3 * c] = M ? ts__cpu_plane_sum(plane_at(px, c * HW, h), HW, h) / (double)HW : 0.0;
            acc[3 * c + 1] = acc[3 * c + 2] = 0.0;
        }
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = c0; c < c1; c++) {
                const float sh = (float)acc[3 * c];
                ts__cpu_plane_shifted_sums(plane_at(px, (n * C + c) * HW, h), HW, sh, h, &acc[3 * c + 1],
                                           &acc[3 * c + 2]);
            }
        for (int64_t c = c0; c < c1; c++) {
            const double sh = (float)acc[3 * c], s1 = acc[3 * c + 1], s2 = acc[3 * c + 2];
            double mu = M ? sh + s1 / (double)M : 0.0, ss = M ? s2 - s1 * s1 / (double)M : 0.0;
            if (!(ss > 0)) ss = ss == ss ? 0.0 : ss; /* rounding below zero: 0; NaN stays */
            pm[c] = (float)mu;
            if (pr) pr[c] = (float)(mu - (double)pm[c]);
            pis[c] = (float)(1.0 / sqrt((M ? ss / (double)M : 0.0) + (double)eps));
            if (rm) rm[c] = (float)(mom * mu + (1.0 - mom) * rm[c]);
            if (rv) rv[c] = (float)(mom * (M > 1 ? ss / (double)(M - 1) : 0.0) + (1.0 - mom) * rv[c]);
        }
    }
    free(acc);
    return TS_OK;
}

// invstd: (C) = 1 / sqrt(var + eps)
static ts_status cpu_batchnorm2d_invstd(const ts_tensor *var, float eps, ts_tensor *invstd) {
    const float *v = ts__f32(var);
    float *o = ts__f32(invstd);
    for (int64_t c = 0; c < var->shape[0]; c++) o[c] = (float)(1.0 / sqrt((double)v[c] + (double)eps));
    return TS_OK;
}

// out: (N, C, H, W) = (x - mean[c]) * s[c] + (bias[c] - mres[c] * s[c]), s = invstd * weight (centred: at
// |mean| >> std, x * s + (bias - mean * s) would round x * s, |mean| / std times the output, and cancel it)
static ts_status cpu_batchnorm2d_apply(ts_tensor *out, const ts_tensor *x, const ts_tensor *mean,
                                       const ts_tensor *mres, const ts_tensor *invstd, const ts_tensor *weight,
                                       const ts_tensor *bias) {
    const int64_t N = x->shape[0], C = x->shape[1], HW = x->shape[2] * x->shape[3];
    const float *pm = ts__f32(mean), *pis = ts__f32(invstd), *pr = mres ? ts__f32(mres) : NULL;
    const float *pw = weight ? ts__f32(weight) : NULL, *pb = bias ? ts__f32(bias) : NULL;
    const bool h = out->dtype == TS_BF16;
#pragma omp parallel for if (N * C * HW > PAR_MIN) schedule(static)
    for (int64_t p = 0; p < N * C; p++) {
        int64_t c = p % C;
        const float scale = pis[c] * (pw ? pw[c] : 1.0f);
        const float shift = (float)((pb ? (double)pb[c] : 0.0) - (pr ? (double)pr[c] * scale : 0.0));
        ts__cpu_plane_affine(plane_at_w(ts__ptr(out), p * HW, h), plane_at(ts__ptr(x), p * HW, h), HW, pm[c], scale,
                             shift, h);
    }
    return TS_OK;
}

/* With xhat = (x - mean) invstd, M = N*H*W, per channel:
 *   gb = sum g, gw = sum g xhat,
 *   training: gx = w invstd (g - gb/M - xhat gw/M)   eval: gx = w invstd g.
 * The sums run about the float mean m; with the residual r (mres), sum g (x - m - r) = sgx - r sg.
 * gx is written as a g + b (x - m) + (k - b r) per channel (centred, as the forward: b x + (k - b mean)
 * cancels when |mean| >> std). */
static ts_status cpu_batchnorm2d_backward(const ts_tensor *gout, const ts_tensor *x, const ts_tensor *mean,
                                          const ts_tensor *mres, const ts_tensor *invstd, const ts_tensor *weight,
                                          bool training, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb) {
    const int64_t N = x->shape[0], C = x->shape[1], HW = x->shape[2] * x->shape[3], M = N * HW;
    const void *px = ts__ptr(x), *pg = ts__ptr(gout); /* float32, or (h) bfloat16 gout, x and gx */
    const float *pm = ts__f32(mean), *pis = ts__f32(invstd), *pw = weight ? ts__f32(weight) : NULL;
    const float *pr = mres ? ts__f32(mres) : NULL;
    void *pgx = gx ? ts__ptr(gx) : NULL;
    float *pgw = gw ? ts__f32(gw) : NULL, *pgb = gb ? ts__f32(gb) : NULL;
    const bool h = x->dtype == TS_BF16;
    const bool sums = pgw || pgb || (pgx && training);
    double *acc = malloc((sizeof(double) * 2 + sizeof(float) * 3) * (size_t)C); /* per channel: sg, sgx */
    float *coef = (float *)(acc + 2 * C);                                        /* per channel: a, b, k */
    if (!acc) return ts_error(TS_ERR_NOMEM, "batchnorm2d backward: %lld channels' sums", (long long)C);
#pragma omp parallel if (N * C * HW > PAR_MIN)
    {
        int64_t c0, c1;
        channel_range(C, &c0, &c1);
        for (int64_t c = c0; c < c1; c++) acc[2 * c] = acc[2 * c + 1] = 0.0;
        if (sums)
            for (int64_t n = 0; n < N; n++)
                for (int64_t c = c0; c < c1; c++) {
                    const int64_t o = (n * C + c) * HW;
                    ts__cpu_plane_dot_dev(plane_at(pg, o, h), plane_at(px, o, h), HW, pm[c], h, &acc[2 * c],
                                          &acc[2 * c + 1]);
                }
        for (int64_t c = c0; c < c1; c++) {
            const double r = pr ? pr[c] : 0.0, sg = acc[2 * c], sgx = acc[2 * c + 1] - r * sg, is = pis[c];
            if (pgb) pgb[c] = (float)sg;
            if (pgw) pgw[c] = (float)(sgx * is);
            double wv = pw ? pw[c] : 1.0;
            float a = (float)(wv * is), b = 0.0f, k = 0.0f;
            if (training && M > 0) {
                /* - w is (xhat gw / M) = - w is^3 (x - mu) sgx / M ; - w is gb / M */
                const double bb = -wv * is * is * is * sgx / (double)M;
                b = (float)bb;
                k = (float)(-wv * is * sg / (double)M - bb * r);
            }
            coef[3 * c] = a, coef[3 * c + 1] = b, coef[3 * c + 2] = k;
        }
        if (pgx)
            for (int64_t n = 0; n < N; n++)
                for (int64_t c = c0; c < c1; c++) {
                    const int64_t o = (n * C + c) * HW;
                    const float *abk = coef + 3 * c;
                    ts__cpu_plane_axpbyc(plane_at_w(pgx, o, h), plane_at(pg, o, h), plane_at(px, o, h), HW, abk[0],
                                         abk[1], pm[c], abk[2], h);
                }
    }
    free(acc);
    return TS_OK;
}

/* ---- adaptive average pooling ------------------------------------------------------------------------ */
/* PyTorch's adaptive windows: [floor(i in / out), ceil((i + 1) in / out)) */
static inline int64_t adaptive_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
static inline int64_t adaptive_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

// out: (P, OH, OW) = window means of x: (P, H, W)
static ts_status cpu_adaptive_avgpool2d(ts_tensor *out, const ts_tensor *x, int64_t P, int64_t H, int64_t W,
                                        int64_t OH, int64_t OW) {
    const float *px = ts__f32(x);
    float *po = ts__f32(out);
#pragma omp parallel for if (P * H * W > PAR_MIN) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        const float *xp = px + p * H * W;
        float *op = po + p * OH * OW;
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t hs = adaptive_start(oh, H, OH), he = adaptive_end(oh, H, OH);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t ws = adaptive_start(ow, W, OW), we = adaptive_end(ow, W, OW);
                float s = 0.0f;
                for (int64_t ih = hs; ih < he; ih++)
                    for (int64_t iw = ws; iw < we; iw++) s += xp[ih * W + iw];
                op[oh * OW + ow] = s / (float)((he - hs) * (we - ws));
            }
        }
    }
    return TS_OK;
}

// gx: (P, H, W) = each gout: (P, OH, OW) spread evenly over its (possibly overlapping) window
static ts_status cpu_adaptive_avgpool2d_backward(ts_tensor *gx, const ts_tensor *gout, int64_t P, int64_t H,
                                                 int64_t W, int64_t OH, int64_t OW) {
    float *px = ts__f32(gx);
    const float *pg = ts__f32(gout);
#pragma omp parallel for if (P * H * W > PAR_MIN) schedule(static)
    for (int64_t p = 0; p < P; p++) {
        float *xp = px + p * H * W;
        const float *gp = pg + p * OH * OW;
        memset(xp, 0, sizeof(float) * (size_t)(H * W));
        for (int64_t oh = 0; oh < OH; oh++) {
            int64_t hs = adaptive_start(oh, H, OH), he = adaptive_end(oh, H, OH);
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t ws = adaptive_start(ow, W, OW), we = adaptive_end(ow, W, OW);
                float v = gp[oh * OW + ow] / (float)((he - hs) * (we - ws));
                for (int64_t ih = hs; ih < he; ih++)
                    for (int64_t iw = ws; iw < we; iw++) xp[ih * W + iw] += v;
            }
        }
    }
    return TS_OK;
}

const struct ts_kernels_spatial ts_cpu_kernels_spatial = {
    .conv2d = cpu_conv2d,
    .conv2d_backward = cpu_conv2d_backward,
    .maxpool2d = cpu_maxpool2d,
    .maxpool2d_backward = cpu_maxpool2d_backward,
    .avgpool2d = cpu_avgpool2d,
    .avgpool2d_backward = cpu_avgpool2d_backward,
    .batchnorm2d_stats = cpu_batchnorm2d_stats,
    .batchnorm2d_invstd = cpu_batchnorm2d_invstd,
    .batchnorm2d_apply = cpu_batchnorm2d_apply,
    .batchnorm2d_backward = cpu_batchnorm2d_backward,
    .adaptive_avgpool2d = cpu_adaptive_avgpool2d,
    .adaptive_avgpool2d_backward = cpu_adaptive_avgpool2d_backward,
    .bf16 = true,
};
