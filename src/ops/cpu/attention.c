/*
 * ops/cpu/attention.c — scaled-dot-product attention on the CPU (device/k_misc.h: attention_forward,
 * attention_backward), tiled as FlashAttention-2 is, so that memory grows with T and never holds a
 * Tq x Tk matrix.
 *
 * Layout: q (BH, Tq, D), k and v (BH, Tk, D) (B and H folded), out (BH, Tq, D), stats (BH, Tq, 2) =
 * each row's score max m and log l (l = sum of exp(s - m) over its visible keys).
 *
 * Forward: one work item per (b h, tile of BR queries), items spread over OpenMP's threads
 * (dynamic: causal tiles near the end of a row see more keys). For each tile of BC keys (a causal
 * query tile stops at its last row's diagonal): S = scale Q K^T (sgemm through the device's blas
 * table, one thread inside our region), the online softmax per row — m' = max(m, max_c S), the
 * running sum and the output rows rescaled by exp(m - m'), P = exp(S - m') (masked keys 0) — and
 * O += P V (sgemm). At the end O /= l. l is summed in double across tiles (float within one).
 *
 * Backward (FlashAttention-2's): D_i = gout_i . out_i for every row first, then one work item per
 * b h (one thread owns a head's gq, gk, gv: no atomics, and results that do not depend on the thread
 * count); per key tile, for each query tile that sees it, the scores are recomputed with the
 * forward's exact call (same tile shapes, same sgemm: the same bits), P = exp((S - m) - log l),
 * gv += P^T gout, dP = gout V^T, dS = P (dP - D_i), gk += scale dS^T Q, gq += scale dS (K - kmean)
 * (the rows of dS sum to 0, so subtracting the head's mean key changes nothing but the rounding: keys
 * with a large common part would otherwise cancel in gq). Scratch: two BR x BC tiles, a centred key
 * tile and a few rows per thread, and D (BH Tq floats), from the device's allocator.
 *
 * The exp is ops/cpu/vmath.h's (within 1.5 ulp); the row loops are cloned per ISA (TS_CLONES).
 */
#include "ops/cpu/attention.h"
#include "device/k_blas.h"
#include "ops/cpu/vmath.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#define BR 64  /* queries per tile */
#define BC 256 /* keys per tile (the leading dimension of the score tiles) */

typedef struct attn_geom {
    ts_device *dev;
    int64_t BH, Tq, Tk, D;
    bool causal;
    float scale;
} attn_geom;

static attn_geom geom_of(const ts_tensor *q, const ts_tensor *k, bool causal, float scale) {
    return (attn_geom){q->storage->device, q->shape[0] * q->shape[1], q->shape[2], k->shape[2], q->shape[3],
                       causal, scale};
}

/* Keys query row r sees in the key tile starting at c0 of width nc: [c0, c0 + visible) (<= 0: none). */
static inline int64_t visible(const attn_geom *g, int64_t r, int64_t c0, int64_t nc) {
    return g->causal ? TS_MIN(nc, r - c0 + 1) : nc;
}

/* The keys a query tile (rows r0 .. r0 + nr) reads: [0, key_end). */
static inline int64_t key_end(const attn_geom *g, int64_t r0, int64_t nr) {
    return g->causal ? TS_MIN(g->Tk, r0 + nr) : g->Tk;
}

/* S (nr x nc, leading dimension BC) = scale Q K^T for query rows r0.. and keys c0.. of one head: the same
 * call in forward and backward, so both see the same bits. */
static ts_status scores(const attn_geom *g, const float *Q, const float *K, int64_t r0, int64_t nr, int64_t c0,
                        int64_t nc, float *S) {
    return g->dev->k_blas->sgemm(g->dev, false, true, nr, nc, g->D, g->scale, Q + r0 * g->D, g->D, K + c0 * g->D,
                                 g->D, 0.0f, S, BC);
}

/* ---- row loops (cloned per ISA) ------------------------------------------------------------------------ */
TS_CLONES static float row_max(const float *s, int64_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < n; c++) m = s[c] > m ? s[c] : m; /* (NaN skipped, as fmaxf, which GCC calls) */
    return m;
}

/* s[c] = exp(s[c] - m) for c < vis, 0 for vis <= c < n; returns their sum. */
TS_CLONES static float exp_row(float *s, int64_t vis, int64_t n, float m) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < vis; c++) {
        const float e = ts__vexpf(s[c] - m);
        s[c] = e;
        sum += e;
    }
    for (int64_t c = vis; c < n; c++) s[c] = 0.0f;
    return sum;
}

/* s[c] = exp((s[c] - m) - log_l) for c < vis (P), 0 for vis <= c < n. */
TS_CLONES static void prob_row(float *s, int64_t vis, int64_t n, float m, float log_l) {
#pragma omp simd
    for (int64_t c = 0; c < vis; c++) s[c] = ts__vexpf((s[c] - m) - log_l);
    for (int64_t c = vis; c < n; c++) s[c] = 0.0f;
}

/* ds[c] = p[c] (ds[c] - d): dS from dP in place */
TS_CLONES static void dscore_row(float *ds, const float *p, int64_t n, float d) {
#pragma omp simd
    for (int64_t c = 0; c < n; c++) ds[c] = p[c] * (ds[c] - d);
}

TS_CLONES static void scale_row(float *o, int64_t n, float a) {
#pragma omp simd
    for (int64_t c = 0; c < n; c++) o[c] *= a;
}

/* sum_d a[d] b[d] in double */
TS_CLONES static double dot_row(const float *a, const float *b, int64_t n) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < n; c++) s += (double)a[c] * b[c];
    return s;
}

/* ---- forward -------------------------------------------------------------------------------------------- */
typedef struct fwd_scratch {
    float *S;         /* BR x BC */
    double *l;        /* BR */
    float *m;         /* BR */
} fwd_scratch;

/* The online softmax of the score tile S (rows r0 .. r0 + nr, keys c0 .. c0 + nc): S becomes P, m and l
 * move to the new row maxima, and the output rows O are rescaled to them. */
static void online_softmax(const attn_geom *g, fwd_scratch *w, float *O, int64_t r0, int64_t nr, int64_t c0,
                           int64_t nc) {
    for (int64_t r = 0; r < nr; r++) {
        float *s = w->S + r * BC;
        const int64_t vis = visible(g, r0 + r, c0, nc);
        if (vis <= 0) { /* none of these keys (a causal row above the tile's diagonal) */
            memset(s, 0, (size_t)nc * sizeof *s);
            continue;
        }
        const float mt = row_max(s, vis), m_old = w->m[r];
        const float m_new = m_old >= mt ? m_old : mt;                     /* (a NaN tile max leaves m) */
        const float alpha = m_old == -INFINITY ? 0.0f : ts__vexpf(m_old - m_new); /* the old terms' factor */
        const float sum = exp_row(s, vis, nc, m_new == -INFINITY ? 0.0f : m_new);
        if (alpha != 1.0f) {
            w->l[r] *= alpha;
            scale_row(O + r * g->D, g->D, alpha);
        }
        w->l[r] += sum;
        w->m[r] = m_new;
    }
}

/* One (head, query tile) work item: out rows r0 .. r0 + nr and their stats. */
static ts_status fwd_tile(const attn_geom *g, fwd_scratch *w, const float *Q, const float *K, const float *V,
                          float *O, float *stats, int64_t r0, int64_t nr) {
    const int64_t D = g->D, kend = key_end(g, r0, nr);
    float *Ot = O + r0 * D;
    memset(Ot, 0, (size_t)(nr * D) * sizeof *Ot);
    for (int64_t r = 0; r < nr; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0;
    }
    for (int64_t c0 = 0; c0 < kend; c0 += BC) {
        const int64_t nc = TS_MIN(BC, g->Tk - c0); /* the backward's tile width, whatever kend is */
        TS_TRY(scores(g, Q, K, r0, nr, c0, nc, w->S));
        online_softmax(g, w, Ot, r0, nr, c0, nc);
        TS_TRY(g->dev->k_blas->sgemm(g->dev, false, false, nr, D, nc, 1.0f, w->S, BC, V + c0 * D, D, 1.0f, Ot, D));
    }
    for (int64_t r = 0; r < nr; r++) {
        scale_row(Ot + r * D, D, (float)(1.0 / w->l[r]));
        stats[2 * (r0 + r)] = w->m[r];
        stats[2 * (r0 + r) + 1] = (float)log(w->l[r]);
    }
    return TS_OK;
}

/* Per-thread scratch of `per` floats for each of the calling team's possible threads. */
static ts_status thread_scratch(ts_device *dev, int64_t per, int *nthr, ts_tensor **out) {
    *nthr = omp_get_max_threads();
    return ts__scratch_f32(dev, per * *nthr, out);
}

ts_status ts__cpu_attention_forward(ts_tensor *out, ts_tensor *stats, const ts_tensor *q, const ts_tensor *k,
                                    const ts_tensor *v, bool causal, float scale) {
    const attn_geom g = geom_of(q, k, causal, scale);
    const int64_t nqt = (g.Tq + BR - 1) / BR, items = g.BH * nqt;
    if (items == 0) return TS_OK;
    const int64_t per = BR * BC + 2 * BR + BR; /* S, l (doubles), m */
    int nthr;
    ts_tensor *scr = NULL;
    TS_TRY(thread_scratch(g.dev, per, &nthr, &scr));
    const float *pq = ts__f32(q), *pk = ts__f32(k), *pv = ts__f32(v);
    float *po = ts__f32(out), *ps = ts__f32(stats);
    int bad = 0;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1 && g.Tk * g.D * BR >= 32768) reduction(| : bad)
    for (int64_t it = 0; it < items; it++) {
        /* heaviest first: the last query tiles of causal rows see the most keys */
        const int64_t bh = it % g.BH, qt = nqt - 1 - it / g.BH, r0 = qt * BR;
        float *base = ts__f32(scr) + per * omp_get_thread_num();
        fwd_scratch w = {base, (double *)(base + BR * BC), base + BR * BC + 2 * BR};
        bad |= fwd_tile(&g, &w, pq + bh * g.Tq * g.D, pk + bh * g.Tk * g.D, pv + bh * g.Tk * g.D,
                        po + bh * g.Tq * g.D, ps + bh * g.Tq * 2, r0, TS_MIN(BR, g.Tq - r0)) != TS_OK;
    }
    ts_tensor_release(scr);
    return bad ? ts_error(TS_ERR_NOMEM, "attention: out of memory in a tile's product (%s matmul precision)",
                          ts_dtype_name(ts_get_matmul_precision()))
               : TS_OK;
}

/* ---- backward ------------------------------------------------------------------------------------------- */
typedef struct bwd_head {
    const float *Q, *K, *V, *gO, *stats, *Dv; /* this head's rows */
    float *gQ, *gK, *gV;
    float *P, *dS; /* BR x BC scratch */
    float *Kc;     /* BC x D: the key tile less the head's mean key */
    float *kmean;  /* D */
} bwd_head;

/* The contributions of query rows r0 .. r0 + nr and keys c0 .. c0 + nc to the head's three gradients. */
static ts_status bwd_tile(const attn_geom *g, const bwd_head *h, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
    const int64_t D = g->D;
    ts_device *dev = g->dev;
    TS_TRY(scores(g, h->Q, h->K, r0, nr, c0, nc, h->P));
    for (int64_t r = 0; r < nr; r++) {
        const float *st = h->stats + 2 * (r0 + r);
        const int64_t vis = visible(g, r0 + r, c0, nc);
        prob_row(h->P + r * BC, vis > 0 ? vis : 0, nc, st[0], st[1]);
    }
    /* gv[c0..] += P^T gout */
    TS_TRY(dev->k_blas->sgemm(dev, true, false, nc, D, nr, 1.0f, h->P, BC, h->gO + r0 * D, D, 1.0f, h->gV + c0 * D, D));
    /* dP = gout V^T, then dS = P (dP - D_i) */
    TS_TRY(dev->k_blas->sgemm(dev, false, true, nr, nc, D, 1.0f, h->gO + r0 * D, D, h->V + c0 * D, D, 0.0f, h->dS, BC));
    for (int64_t r = 0; r < nr; r++) dscore_row(h->dS + r * BC, h->P + r * BC, nc, h->Dv[r0 + r]);
    /* gk[c0..] += scale dS^T Q; gq[r0..] += scale dS K */
    TS_TRY(dev->k_blas->sgemm(dev, true, false, nc, D, nr, g->scale, h->dS, BC, h->Q + r0 * D, D, 1.0f,
                              h->gK + c0 * D, D));
    return dev->k_blas->sgemm(dev, false, false, nr, D, nc, g->scale, h->dS, BC, h->Kc, D, 1.0f, h->gQ + r0 * D, D);
}

/* kmean = the mean of the head's keys; each row of dS sums to 0, so gq = scale dS (K - kmean) exactly, and
 * without the cancellation of keys with a large common part (keys near 1e4: gq 1e-3 off instead of 1e-7). */
TS_CLONES static void key_mean(const float *K, int64_t Tk, int64_t D, float *kmean) {
    for (int64_t d = 0; d < D; d++) {
        double s = 0;
        for (int64_t j = 0; j < Tk; j++) s += K[j * D + d];
        kmean[d] = (float)(s / (double)Tk);
    }
}

TS_CLONES static void centre_rows(float *dst, const float *K, int64_t n, int64_t D, const float *kmean) {
    for (int64_t j = 0; j < n; j++) {
#pragma omp simd
        for (int64_t d = 0; d < D; d++) dst[j * D + d] = K[j * D + d] - kmean[d];
    }
}

/* One head's three gradients, key tile by key tile. */
static ts_status bwd_head_run(const attn_geom *g, const bwd_head *h) {
    const int64_t D = g->D;
    memset(h->gQ, 0, (size_t)(g->Tq * D) * sizeof(float));
    memset(h->gK, 0, (size_t)(g->Tk * D) * sizeof(float));
    memset(h->gV, 0, (size_t)(g->Tk * D) * sizeof(float));
    key_mean(h->K, g->Tk, D, h->kmean);
    for (int64_t c0 = 0; c0 < g->Tk; c0 += BC) {
        const int64_t nc = TS_MIN(BC, g->Tk - c0);
        centre_rows(h->Kc, h->K + c0 * D, nc, D, h->kmean);
        /* the first query tile that sees key c0 (causal: row c0's), on the forward's tile grid */
        const int64_t first = g->causal ? (c0 / BR) * BR : 0;
        for (int64_t r0 = first; r0 < g->Tq; r0 += BR) TS_TRY(bwd_tile(g, h, r0, TS_MIN(BR, g->Tq - r0), c0, nc));
    }
    return TS_OK;
}

ts_status ts__cpu_attention_backward(ts_tensor *gq, ts_tensor *gk, ts_tensor *gv, const ts_tensor *gout,
                                     const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, const ts_tensor *out,
                                     const ts_tensor *stats, bool causal, float scale) {
    const attn_geom g = geom_of(q, k, causal, scale);
    const int64_t rows = g.BH * g.Tq, D = g.D;
    if (g.BH == 0) return TS_OK;
    ts_tensor *dv = NULL, *scr = NULL;
    int nthr;
    const int64_t per = 2 * BR * BC + BC * D + D;
    TS_TRY(ts__scratch_f32(g.dev, rows, &dv));
    ts_status st = thread_scratch(g.dev, per, &nthr, &scr);
    if (st != TS_OK) {
        ts_tensor_release(dv);
        return st;
    }
    float *pd = ts__f32(dv);
    const float *pgo = ts__f32(gout), *po = ts__f32(out);
#pragma omp parallel for schedule(static) if (rows * D >= 32768)
    for (int64_t r = 0; r < rows; r++) pd[r] = (float)dot_row(pgo + r * D, po + r * D, D);
    int bad = 0;
#pragma omp parallel for schedule(dynamic, 1) if (g.BH > 1) reduction(| : bad)
    for (int64_t bh = 0; bh < g.BH; bh++) {
        float *base = ts__f32(scr) + per * omp_get_thread_num();
        const int64_t oq = bh * g.Tq * D, ok = bh * g.Tk * D;
        const bwd_head h = {ts__f32(q) + oq, ts__f32(k) + ok, ts__f32(v) + ok, pgo + oq, ts__f32(stats) + bh * g.Tq * 2,
                            pd + bh * g.Tq, ts__f32(gq) + oq, ts__f32(gk) + ok, ts__f32(gv) + ok, base, base + BR * BC,
                            base + 2 * BR * BC, base + 2 * BR * BC + BC * D};
        bad |= bwd_head_run(&g, &h) != TS_OK;
    }
    ts_tensor_release(dv);
    ts_tensor_release(scr);
    return bad ? ts_error(TS_ERR_NOMEM, "attention backward: out of memory in a tile's product (%s matmul precision)",
                          ts_dtype_name(ts_get_matmul_precision()))
               : TS_OK;
}
