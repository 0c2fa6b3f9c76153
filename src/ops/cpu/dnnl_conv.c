/*
 * ops/cpu/dnnl_conv.c — conv2d forward, backward-data and backward-weights
 * through oneDNN's convolution primitives (see dnnl_conv.h).
 *
 * Each call: the cached primitive for (geometry, precision, pass) — created on
 * first use with format "any", so oneDNN picks its blocked layouts (nChw16c,
 * OIhw16i16o on AVX-512; nChw8c, OIhw8i8o on AVX2) and its JIT kernel for this
 * CPU (AVX-512, AVX512_BF16, AVX2), direct, or Winograd under TS_CONV_WINOGRAD
 * where it pays (wino_fits) — then our plain float32 NCHW / OIHW tensors are
 * reordered into the primitive's layouts (rounding to bfloat16 on the way under
 * bfloat16 precision: oneDNN's reorders round to nearest even), the primitive
 * runs, and its float32 output is reordered back; bfloat16 activation tensors
 * (autocast) go in and come out as bfloat16, the reorders changing only the
 * layout. Reorder primitives are cached with the convolution; the activations'
 * NCHW <-> nChw16c ones and the weights' OIhw <-> 16x16-blocked ones run
 * blocked.c's transposes instead (own_reorder_of, which matches the primitive's
 * whole memory descriptor: the 8-blocked layouts of AVX2 machines, and any
 * other, go through oneDNN's reorders; oneDNN 2.6's bfloat16 reorders are generic
 * kernels: the reference CNN's bfloat16 step spent 2.0 of its 7.9 ms in them,
 * 0.5 in ours; ResNet-18's 7.6 of 92 ms in its weights'). The backward-weights
 * primitive also sums the bias gradient (diff_bias) when the caller wants one.
 * Every primitive uses a user scratchpad (from the device's allocator), so one
 * primitive may run on several threads at once. oneDNN threads the call over
 * the calling thread's OpenMP budget.
 *
 * Rounding: oneDNN's kernels sum in their own order (and backward-weights
 * reduces over threads), so results differ from im2col's by float rounding and
 * between thread counts (as our own kernels' per-thread partial sums do). It is
 * AUTO's choice wherever the build has oneDNN: on this project's machines it is
 * the fastest float32 path too (the reference CNN 5,339 against Winograd's
 * 4,471 images/s at one thread; ResNet-18 at 64x64 354 against 292 at two).
 */
#include "tensor/tensor.h"
#include "ops/cpu/dnnl_conv.h"

#ifndef TS_HAVE_DNNL
bool ts__cpu_dnnl_conv_ok(const ts_conv2d_geom *g) {
    (void)g;
    return false;
}
bool ts__cpu_dnnl_conv2d(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                         const ts_tensor *b, ts_status *st) {
    (void)g, (void)out, (void)x, (void)w, (void)b, (void)st;
    return false;
}
bool ts__cpu_dnnl_conv2d_backward(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                  const ts_tensor *w, ts_tensor *gx, ts_tensor *gw, ts_tensor **gb, ts_status *st) {
    (void)g, (void)gout, (void)x, (void)w, (void)gx, (void)gw, (void)gb, (void)st;
    return false;
}
#else
#include "ops/cpu/blocked.h"
#include "ops/cpu/onednn.h"

#include <pthread.h>
#include <string.h>

static bool wino_fits(const ts_conv2d_geom *g, bool bf16);

bool ts__cpu_dnnl_conv_ok(const ts_conv2d_geom *g) {
    /* float16 precision: im2col + blas.c's rounded products (oneDNN's f16 convolutions need AVX512-FP16) */
    if (g->groups != 1 || strcmp(ts_cpu_gemm_library(), "onednn") != 0 || ts_get_matmul_precision() == TS_F16)
        return false;
    ts_conv_algo a = ts_get_conv_algo();
    if (a == TS_CONV_ONEDNN || a == TS_CONV_AUTO) return true;
    if (a != TS_CONV_WINOGRAD) return false;
    /* WINOGRAD: oneDNN's Winograd where it fits (ours where oneDNN has no Winograd kernel: without AVX-512;
     * entry_get), our own for the other 3x3 stride-1 convs but tiny planes (TS_CONV_TINY_PLANE), oneDNN's
     * direct kernels for the rest (7x7, 1x1, strided, tiny) */
    const bool s1_3x3 = g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1;
    return !s1_3x3 || wino_fits(g, ts_get_matmul_precision() == TS_BF16) || g->OH * g->OW <= TS_CONV_TINY_PLANE;
}

enum { PASS_FWD = 0, PASS_BWD_DATA = 1, PASS_BWD_WEIGHTS = 2 };

/* A reorder blocked.c does (oneDNN's reorders run the rest): activations NCHW <-> nChw16c in one type, and
 * float32 OIhw weights to the primitive's blocked weights (bfloat16 or float32) and float32 gradients back. */
typedef struct own_reorder {
    enum { OWN_NONE, OWN_ACT, OWN_WEIGHTS } what;
    size_t es;       /* OWN_ACT: the element size */
    ts_wblock kind;  /* OWN_WEIGHTS: the blocked layout */
} own_reorder;

/* One cached primitive: the convolution of one pass and the reorders of its three tensors
 * (in0, in1: inputs, from our layout; t2: the output, back to ours), NULL where none is needed or blocked.c
 * does it (own). */
typedef struct conv_entry {
    ts_conv2d_geom g;
    int pass;
    dnnl_alg_kind_t alg; /* direct, or Winograd (wino_fits, wino_pass) */
    bool bf16, bias;
    bool act16; /* our activations (x, out, gout, gx) are bfloat16 tensors (ts_set_autocast): the primitive
                 * reads and writes them in bfloat16, its reorders only change the layout */
    dnnl_primitive_t conv, reorder[3];
    dnnl_memory_desc_t user_md[3], prim_md[3];
    own_reorder own[3]; /* reorder i through blocked.c's kernels instead of oneDNN's */
    size_t scratch;
    uint64_t used;
    bool none; /* oneDNN has no primitive for it (bfloat16 ones on CPUs without AVX-512): the caller's own
                * algorithm runs, without asking oneDNN again */
} conv_entry;

#define CONV_CACHE 256
static conv_entry cache[CONV_CACHE];
static int ncache;
static uint64_t clock_;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static bool same_geom(const ts_conv2d_geom *a, const ts_conv2d_geom *b) {
    return a->N == b->N && a->C == b->C && a->H == b->H && a->W == b->W && a->K == b->K && a->OH == b->OH &&
           a->OW == b->OW && a->kh == b->kh && a->kw == b->kw && a->sh == b->sh && a->sw == b->sw &&
           a->ph == b->ph && a->pw == b->pw && a->dh == b->dh && a->dw == b->dw && a->groups == b->groups;
}

static bool md_plain(dnnl_memory_desc_t *md, int nd, const int64_t *dims, dnnl_data_type_t dt, dnnl_format_tag_t tag) {
    dnnl_dims_t d;
    for (int i = 0; i < nd; i++) d[i] = dims[i];
    return dnnl_memory_desc_init_by_tag(md, nd, d, dt, tag) == dnnl_success;
}

static bool md_any(dnnl_memory_desc_t *md, int nd, const int64_t *dims, dnnl_data_type_t dt) {
    dnnl_dims_t d;
    for (int i = 0; i < nd; i++) d[i] = dims[i];
    return dnnl_memory_desc_init_by_tag(md, nd, d, dt, dnnl_format_tag_any) == dnnl_success;
}

/* A reorder from src to dst (NULL with *ok true when they are the same layout and type). */
static dnnl_primitive_t make_reorder(const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst, bool *ok) {
    dnnl_engine_t eng = ts__dnnl_engine();
    if (dnnl_memory_desc_equal(src, dst)) return NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    if (dnnl_reorder_primitive_desc_create(&pd, src, eng, dst, eng, NULL) != dnnl_success ||
        dnnl_primitive_create(&p, pd) != dnnl_success)
        *ok = false;
    if (pd) dnnl_primitive_desc_destroy(pd);
    return p;
}

static bool md_is(const dnnl_memory_desc_t *md, dnnl_data_type_t dt, dnnl_format_tag_t tag) {
    dnnl_memory_desc_t m;
    return md->ndims == 4 && dnnl_memory_desc_init_by_tag(&m, 4, md->dims, dt, tag) == dnnl_success &&
           dnnl_memory_desc_equal(md, &m);
}

/* Whether blocked.c does the reorder between user (our plain tensor) and prim (the primitive's layout). */
static own_reorder own_reorder_of(const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *prim) {
    own_reorder r = {OWN_NONE, 0, TS_WB_16I16O};
    for (int t = 0; t < 2; t++) { /* activations */
        const dnnl_data_type_t dt = t ? dnnl_bf16 : dnnl_f32;
        if (md_is(user, dt, dnnl_nchw) && md_is(prim, dt, dnnl_aBcd16b)) return (own_reorder){OWN_ACT, t ? 2 : 4, 0};
    }
    static const struct {
        dnnl_data_type_t dt;
        dnnl_format_tag_t tag;
        ts_wblock kind;
    } wk[] = {{dnnl_f32, dnnl_ABcd16b16a, TS_WB_16I16O}, {dnnl_f32, dnnl_ABcd16a16b, TS_WB_16O16I},
              {dnnl_bf16, dnnl_ABcd8b16a2b, TS_WB_8I16O2I}, {dnnl_bf16, dnnl_ABcd8a16b2a, TS_WB_8O16I2O}};
    if (!md_is(user, dnnl_f32, dnnl_oihw) || user->dims[2] * user->dims[3] > TS_WB_MAX_KK) return r;
    for (size_t k = 0; k < sizeof wk / sizeof wk[0]; k++)
        if (md_is(prim, wk[k].dt, wk[k].tag)) return (own_reorder){OWN_WEIGHTS, 0, wk[k].kind};
    return r;
}

/* Whether tensor i goes through a layout change (blocked.c's or a oneDNN reorder primitive) */
static bool reordered(const conv_entry *e, int i) { return e->reorder[i] || e->own[i].what != OWN_NONE; }

static void entry_destroy(conv_entry *e) {
    if (e->conv) dnnl_primitive_destroy(e->conv);
    for (int i = 0; i < 3; i++)
        if (e->reorder[i]) dnnl_primitive_destroy(e->reorder[i]);
    memset(e, 0, sizeof *e);
}

/* Builds the entry's primitives; false when oneDNN has no implementation for it. */
static bool entry_make(conv_entry *e) {
    dnnl_engine_t eng = ts__dnnl_engine();
    const ts_conv2d_geom *g = &e->g;
    int64_t xd[4] = {g->N, g->C, g->H, g->W}, wd[4] = {g->K, g->C, g->kh, g->kw}, yd[4] = {g->N, g->K, g->OH, g->OW},
            bd[1] = {g->K};
    dnnl_dims_t strides = {g->sh, g->sw}, dil = {g->dh - 1, g->dw - 1}, pl = {g->ph, g->pw},
                pr = {(g->OH - 1) * g->sh + (g->kh - 1) * g->dh + 1 - g->H - g->ph,
                      (g->OW - 1) * g->sw + (g->kw - 1) * g->dw + 1 - g->W - g->pw};
    if (pr[0] < 0 || pr[1] < 0) return false;
    dnnl_data_type_t in = e->bf16 ? dnnl_bf16 : dnnl_f32, act = e->act16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t xa, wa, ya, xo, wo, yo, bm, xu, wu, yu;
    bool ok = md_any(&xa, 4, xd, in) && md_any(&wa, 4, wd, in) && md_any(&ya, 4, yd, in) && md_any(&xo, 4, xd, act) &&
              md_any(&wo, 4, wd, dnnl_f32) && md_any(&yo, 4, yd, act) && md_plain(&bm, 1, bd, dnnl_f32, dnnl_a) &&
              md_plain(&xu, 4, xd, act, dnnl_nchw) && md_plain(&wu, 4, wd, dnnl_f32, dnnl_oihw) &&
              md_plain(&yu, 4, yd, act, dnnl_nchw);
    if (!ok) return false;
    dnnl_convolution_desc_t fwd, cd;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t hint = NULL, pd = NULL;
    /* the forward descriptor (a backward pass's hint): inputs in the pass's type, output float32 */
    ok = dnnl_dilated_convolution_forward_desc_init(&fwd, dnnl_forward_training, e->alg, &xa, &wa,
                                                    e->bias ? &bm : NULL, &yo, strides, dil, pl, pr) == dnnl_success &&
         dnnl_primitive_attr_create(&attr) == dnnl_success &&
         dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && e->pass == PASS_FWD) {
        ok = dnnl_primitive_desc_create(&pd, &fwd, attr, eng, NULL) == dnnl_success;
    } else if (ok) {
        /* the hint: the forward of the same types with a bfloat16 output where the pass reads one */
        dnnl_convolution_desc_t hf;
        ok = dnnl_dilated_convolution_forward_desc_init(&hf, dnnl_forward_training, e->alg, &xa, &wa,
                                                        NULL, &ya, strides, dil, pl, pr) == dnnl_success &&
             dnnl_primitive_desc_create(&hint, &hf, NULL, eng, NULL) == dnnl_success;
        if (ok && e->pass == PASS_BWD_DATA)
            ok = dnnl_dilated_convolution_backward_data_desc_init(&cd, e->alg, &xo, &wa, &ya, strides,
                                                                  dil, pl, pr) == dnnl_success;
        else if (ok) /* with the bias gradient when asked for (e->bias): summed inside oneDNN's kernel */
            ok = dnnl_dilated_convolution_backward_weights_desc_init(&cd, e->alg, &xa, &wo, e->bias ? &bm : NULL,
                                                                     &ya, strides, dil, pl, pr) == dnnl_success;
        ok = ok && dnnl_primitive_desc_create(&pd, &cd, attr, eng, hint) == dnnl_success;
    }
    /* the three tensors: (in0, in1, out) of each pass */
    static const dnnl_query_t q[3][3] = {
        {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md},
        {dnnl_query_diff_dst_md, dnnl_query_weights_md, dnnl_query_diff_src_md},
        {dnnl_query_src_md, dnnl_query_diff_dst_md, dnnl_query_diff_weights_md},
    };
    const dnnl_memory_desc_t *user[3][3] = {{&xu, &wu, &yu}, {&yu, &wu, &xu}, {&xu, &yu, &wu}};
    for (int i = 0; ok && i < 3; i++) {
        const dnnl_memory_desc_t *m = dnnl_primitive_desc_query_md(pd, q[e->pass][i], 0);
        if (!m) {
            ok = false;
            break;
        }
        e->prim_md[i] = *m;
        e->user_md[i] = *user[e->pass][i];
        if (dnnl_memory_desc_equal(&e->user_md[i], &e->prim_md[i])) continue; /* the primitive takes our layout */
        e->own[i] = own_reorder_of(&e->user_md[i], &e->prim_md[i]);
        if (i == 2 && e->own[i].what == OWN_WEIGHTS && e->own[i].kind != TS_WB_16I16O && e->own[i].kind != TS_WB_16O16I)
            e->own[i].what = OWN_NONE; /* a gradient comes back from float32 blocks only */
        if (e->own[i].what == OWN_NONE)
            e->reorder[i] = i < 2 ? make_reorder(&e->user_md[i], &e->prim_md[i], &ok)
                                  : make_reorder(&e->prim_md[i], &e->user_md[i], &ok);
    }
    e->scratch = ok ? ts__dnnl_scratchpad_bytes(pd) : 0;
    ok = ok && dnnl_primitive_create(&e->conv, pd) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok;
}

/* oneDNN's float32 Winograd (F(4x4, 3x3) in its AVX-512 kernels) under TS_CONV_WINOGRAD, where it pays: 3x3 stride-1
 * one-dilation convolutions with 64+ input and output channels on output planes of 4x4 and more. Measured
 * on ResNet-18 (batch 32): 181 -> 202 images/s at 64x64 and 65 -> 79 at 112x112 on one thread, 318 -> 353
 * and 124 -> 152 on two; with fewer channels (the reference CNN's 32 -> 64 conv) or on 2x2 planes the
 * transforms cost more than they save. Its rounding is Winograd's (tests/test_winograd.c holds it to 1e-5
 * of the direct convolution in double), which through ResNet-18's BatchNorms moved a bias gradient's sum
 * by over 1e-3 of its |g| sum from torchvision's in the -O1 sanitizer build (as our F(4x4) did): opt-in,
 * like ours. Never under bfloat16 precision (its kernels are float32). Without AVX-512 oneDNN has no Winograd
 * kernels: entry_get then says it has none and our own Winograd runs (it ran oneDNN's direct kernels before,
 * and AVX2 machines got no Winograd at all: ResNet-18 at 64x64, batch 32, one thread, on an AMD EPYC with
 * AVX2, 12-16 -> 18-28 images/s, a loaded machine's best of three). */
static bool wino_fits(const ts_conv2d_geom *g, bool bf16) {
    return !bf16 && g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 && g->C >= 64 &&
           g->K >= 64 && g->OH * g->OW >= 16;
}

/* Which passes of a conv that fits run Winograd: all of them from 6x6 output planes on; on smaller planes (one
 * or two 4x4 tiles per image) only backward-weights, whose transformed tiles sum over the whole batch — the
 * forward and backward-data kernels lose to the direct ones there. Measured per pass with DNNL_VERBOSE=2 on
 * ResNet-18 (batch 32, one thread), ms direct -> Winograd: 256 channels on 4x4: forward 2.25 -> 2.25,
 * backward-data 1.66 -> 2.44, backward-weights 2.77 -> 1.47; 512 on 4x4: 9.16 -> 9.29, 7.77 -> 9.23,
 * 11.63 -> 6.54; 128 on 8x8: 2.26 -> 1.56, 2.21 -> 1.44, 2.40 -> 1.06. */
static bool wino_pass(const ts_conv2d_geom *g, int pass) {
    return pass == PASS_BWD_WEIGHTS || g->OH * g->OW >= 36;
}

/* The cached entry for this call (a copy: its primitives live as long as the cache slot, and a replaced
 * slot's primitives are never destroyed while another thread may run them: they are kept); false when
 * oneDNN has none (no Winograd kernel for a conv asked to run Winograd, no bfloat16 kernels on CPUs without
 * AVX-512): remembered, a failed primitive creation costs ~10 us on every call of every step. */
static bool entry_get(const ts_conv2d_geom *g, int pass, bool bf16, bool act16, bool bias, conv_entry *out) {
    bool found = false, known = false;
    const dnnl_alg_kind_t wino = ts_get_conv_algo() == TS_CONV_WINOGRAD && wino_fits(g, bf16) && wino_pass(g, pass)
                                     ? dnnl_convolution_winograd
                                     : dnnl_convolution_direct;
    const bool eng_ok = ts__dnnl_engine() != NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; eng_ok && i < ncache && !known; i++) {
        conv_entry *e = &cache[i];
        if (e->pass == pass && e->bf16 == bf16 && e->act16 == act16 && e->bias == bias && e->alg == wino &&
            same_geom(&e->g, g)) {
            e->used = ++clock_;
            *out = *e;
            found = !e->none;
            known = true;
        }
    }
    if (!known && eng_ok && ncache < CONV_CACHE) { /* a full cache runs the rest through the fallback */
        conv_entry e = {.g = *g, .pass = pass, .bf16 = bf16, .act16 = act16, .bias = bias, .used = ++clock_,
                        .alg = wino};
        bool made = entry_make(&e);
        if (made) {
            cache[ncache++] = e;
            *out = e;
            found = true;
        } else {
            ts_log(TS_LOG_DEBUG, "oneDNN has no convolution for %lldx%lldx%lldx%lld -> %lld channels, %dx%d kernel, "
                                 "pass %d: own algorithm", (long long)g->N, (long long)g->C, (long long)g->H,
                   (long long)g->W, (long long)g->K, g->kh, g->kw, pass);
            entry_destroy(&e);
            cache[ncache++] = (conv_entry){.g = *g, .pass = pass, .bf16 = bf16, .act16 = act16, .bias = bias,
                                           .used = clock_, .alg = wino, .none = true};
        }
    }
    pthread_mutex_unlock(&mu);
    return found;
}

static dnnl_status_t run(dnnl_primitive_t p, dnnl_stream_t s, int n, const dnnl_exec_arg_t *args) {
    dnnl_status_t st = dnnl_primitive_execute(p, s, n, args);
    return st == dnnl_success ? dnnl_stream_wait(s) : st;
}

/* Runs entry e on user buffers u[0], u[1] (inputs) and u[2] (output), bias (the forward's bias, the bias
 * gradient backward-weights writes, or NULL). pre (may be NULL):
 * pre[i] already holds input i reordered into the primitive's layout (borrowed; no reorder then); keep (may be
 * NULL): keep[i] receives input i's reordered buffer when one was made (a new reference), for another pass
 * that takes the same layout. */
static ts_status execute(const conv_entry *e, ts_device *dev, void *const u[3], float *bias,
                         ts_tensor *const pre[2], ts_tensor *keep[2]) {
    dnnl_engine_t eng = ts__dnnl_engine();
    static const int fwd_args[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
    static const int bd_args[3] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
    static const int bw_args[3] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS};
    const int *ids = e->pass == PASS_FWD ? fwd_args : e->pass == PASS_BWD_DATA ? bd_args : bw_args;
    ts_tensor *buf[4] = {NULL, NULL, NULL, NULL};
    dnnl_memory_t um[3] = {NULL, NULL, NULL}, pm[3] = {NULL, NULL, NULL}, bm = NULL, sm = NULL;
    dnnl_stream_t s = NULL;
    dnnl_status_t ds = dnnl_success;
    ts_status st = TS_OK;
    ds = dnnl_stream_create(&s, eng, dnnl_stream_default_flags);
    for (int i = 0; i < 3 && ds == dnnl_success && st == TS_OK; i++) {
        ds = dnnl_memory_create(&um[i], &e->user_md[i], eng, u[i]);
        if (ds != dnnl_success) break;
        if (!reordered(e, i)) { /* the primitive takes our layout */
            ds = dnnl_memory_create(&pm[i], &e->prim_md[i], eng, u[i]);
            continue;
        }
        if (i < 2 && pre && pre[i]) { /* reordered already, by the other pass */
            ds = dnnl_memory_create(&pm[i], &e->prim_md[i], eng, ts__ptr(pre[i]));
            continue;
        }
        size_t bytes = dnnl_memory_desc_get_size(&e->prim_md[i]);
        if ((st = ts__scratch_bytes(dev, bytes, &buf[i])) != TS_OK) break;
        ds = dnnl_memory_create(&pm[i], &e->prim_md[i], eng, ts__ptr(buf[i]));
        if (ds == dnnl_success && i < 2 && e->own[i].what != OWN_NONE) {
            const int64_t *d = e->user_md[i].dims;
            if (e->own[i].what == OWN_ACT)
                ts__cpu_to_blocked16(u[i], ts__ptr(buf[i]), d[0], d[1], d[2] * d[3], e->own[i].es);
            else
                ts__cpu_weights_to_blocked(u[i], ts__ptr(buf[i]), d[0], d[1], d[2] * d[3], e->own[i].kind);
            if (keep) keep[i] = ts_tensor_retain(buf[i]);
        } else if (ds == dnnl_success && i < 2) {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, um[i]}, {DNNL_ARG_TO, pm[i]}};
            ds = run(e->reorder[i], s, 2, ra);
            if (ds == dnnl_success && keep) keep[i] = ts_tensor_retain(buf[i]);
        }
    }
    if (ds == dnnl_success && st == TS_OK && bias) {
        dnnl_memory_desc_t bmd;
        dnnl_dims_t bd = {e->g.K};
        ds = dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_a);
        if (ds == dnnl_success) ds = dnnl_memory_create(&bm, &bmd, eng, (void *)bias);
    }
    if (ds == dnnl_success && st == TS_OK && e->scratch) {
        st = ts__scratch_bytes(dev, e->scratch, &buf[3]);
        if (st == TS_OK && !ts__dnnl_bytes_memory(ts__ptr(buf[3]), e->scratch, &sm)) ds = dnnl_out_of_memory;
    }
    if (ds == dnnl_success && st == TS_OK) {
        dnnl_exec_arg_t args[5];
        int n = 0;
        for (int i = 0; i < 3; i++) args[n++] = (dnnl_exec_arg_t){ids[i], pm[i]};
        if (bm) args[n++] = (dnnl_exec_arg_t){e->pass == PASS_FWD ? DNNL_ARG_BIAS : DNNL_ARG_DIFF_BIAS, bm};
        if (sm) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, sm};
        ds = run(e->conv, s, n, args);
    }
    if (ds == dnnl_success && st == TS_OK && e->own[2].what != OWN_NONE) {
        const int64_t *d = e->user_md[2].dims;
        if (e->own[2].what == OWN_ACT)
            ts__cpu_from_blocked16(ts__ptr(buf[2]), u[2], d[0], d[1], d[2] * d[3], e->own[2].es);
        else
            ts__cpu_weights_from_blocked(ts__f32(buf[2]), u[2], d[0], d[1], d[2] * d[3], e->own[2].kind);
    } else if (ds == dnnl_success && st == TS_OK && e->reorder[2]) {
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, pm[2]}, {DNNL_ARG_TO, um[2]}};
        ds = run(e->reorder[2], s, 2, ra);
    }
    for (int i = 0; i < 3; i++) {
        if (um[i]) dnnl_memory_destroy(um[i]);
        if (pm[i]) dnnl_memory_destroy(pm[i]);
    }
    if (bm) dnnl_memory_destroy(bm);
    if (sm) dnnl_memory_destroy(sm);
    if (s) dnnl_stream_destroy(s);
    for (int i = 0; i < 4; i++) ts_tensor_release(buf[i]);
    if (st == TS_OK && ds != dnnl_success)
        st = ts_error(TS_ERR_UNSUPPORTED, "conv2d through oneDNN (pass %d, %lldx%lldx%lldx%lld -> %lld channels): oneDNN "
                      "status %d", e->pass, (long long)e->g.N, (long long)e->g.C, (long long)e->g.H, (long long)e->g.W,
                      (long long)e->g.K, (int)ds);
    return st;
}

bool ts__cpu_dnnl_conv2d(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                         const ts_tensor *b, ts_status *st) {
    conv_entry e;
    const bool act16 = x->dtype == TS_BF16; /* bfloat16 activations: bfloat16 products too */
    if (!entry_get(g, PASS_FWD, act16 || ts_get_matmul_precision() == TS_BF16, act16, b != NULL, &e)) return false;
    void *u[3] = {ts__ptr(x), ts__ptr(w), ts__ptr(out)};
    *st = execute(&e, out->storage->device, u, b ? (float *)ts__f32(b) : NULL, NULL, NULL);
    return true;
}

bool ts__cpu_dnnl_conv2d_backward(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                  const ts_tensor *w, ts_tensor *gx, ts_tensor *gw, ts_tensor **gb, ts_status *st) {
    const bool act16 = x->dtype == TS_BF16, bf16 = act16 || ts_get_matmul_precision() == TS_BF16;
    const bool with_bias = gw && *gb;
    conv_entry ed, ew;
    if ((gx && !entry_get(g, PASS_BWD_DATA, bf16, act16, false, &ed)) ||
        (gw && !entry_get(g, PASS_BWD_WEIGHTS, bf16, act16, with_bias, &ew)))
        return false;
    ts_device *dev = gout->storage->device;
    /* gout goes into both passes: reordered once when they take the same layout */
    const bool share =
        gx && gw && reordered(&ed, 0) && reordered(&ew, 1) && dnnl_memory_desc_equal(&ed.prim_md[0], &ew.prim_md[1]);
    ts_tensor *kept[2] = {NULL, NULL};
    *st = TS_OK;
    if (gx) {
        void *u[3] = {ts__ptr(gout), ts__ptr(w), ts__ptr(gx)};
        *st = execute(&ed, dev, u, NULL, NULL, share ? kept : NULL);
    }
    if (gw && *st == TS_OK) {
        void *u[3] = {ts__ptr(x), ts__ptr(gout), ts__ptr(gw)};
        ts_tensor *pre[2] = {NULL, kept[0]};
        *st = execute(&ew, dev, u, with_bias ? ts__f32(*gb) : NULL, pre, NULL);
        if (with_bias) *gb = NULL; /* written */
    }
    ts_tensor_release(kept[0]);
    ts_tensor_release(kept[1]);
    return true;
}
#endif
