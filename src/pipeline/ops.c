/*
 * pipeline/ops.c — image operations: random resized crop windows, bilinear
 * resize, flip, and the fused crop -> resize -> mirror -> normalise -> CHW
 * float step that ends a pipeline.
 *
 * Resampling is separable with PIL's coefficient scheme: output sample i of a
 * window [r0, r0 + len) scaled by s = len / out has centre r0 + (i + 0.5) s;
 * its taps are the source pixels within `support` = max(s, 1) of it, weighted
 * by the triangle (1 - |d| / max(s, 1)) and normalised. Enlarging gives
 * plain bilinear with half-pixel centres; shrinking widens the triangle, which
 * antialiases. Taps stop at the window's edges (a crop, then a resize).
 * The vertical pass runs first, over contiguous rows (it vectorises); the
 * horizontal pass then reads one float row per output row.
 */
#include "pipeline/pipeline_internal.h"
#include "device/k_image.h"

#include <math.h>

typedef struct taps {
    int k;      /* taps per output sample (max) */
    int *start; /* first source index of each output sample */
    float *w;   /* out * k weights, zero-padded */
} taps;

/* Upper bound on the taps per output sample over a window of len scaled to out. */
static int taps_bound(int len, int out) {
    double scale = (double)len / out;
    return (int)ceil(scale > 1.0 ? scale : 1.0) * 2 + 1;
}

/* Taps for out samples over the window [lo, lo + len) of the source axis, into t->start (out ints)
 * and t->w (out * taps_bound floats, zeroed here). */
static void taps_make(int lo, int len, int out, taps *t) {
    double scale = (double)len / out, fs = scale > 1.0 ? scale : 1.0, support = fs;
    int k = taps_bound(len, out);
    memset(t->w, 0, sizeof(float) * (size_t)out * (size_t)k);
    int hi = lo + len, kmax = 1;
    for (int i = 0; i < out; i++) {
        double center = lo + (i + 0.5) * scale;
        int x0 = (int)floor(center - support + 0.5), x1 = (int)floor(center + support + 0.5);
        if (x0 < lo) x0 = lo;
        if (x1 > hi) x1 = hi;
        if (x1 - x0 > k) x1 = x0 + k;
        double ww[64], sum = 0;
        int n = 0;
        for (int x = x0; x < x1 && n < 64; x++) {
            double d = fabs((x + 0.5 - center) / fs);
            if (d >= 1.0) { /* zero weight: drop it (only at either end) */
                if (n == 0) x0 = x + 1;
                continue;
            }
            ww[n] = 1.0 - d;
            sum += ww[n++];
        }
        if (sum <= 0) { /* cannot happen with a non-empty window; nearest pixel then */
            x0 = (int)floor(center);
            if (x0 < lo) x0 = lo;
            if (x0 > hi - 1) x0 = hi - 1;
            n = 1;
            ww[0] = sum = 1.0;
        }
        t->start[i] = x0;
        for (int j = 0; j < n; j++) t->w[(size_t)i * k + j] = (float)(ww[j] / sum);
        if (n > kmax) kmax = n;
    }
    /* repack with the taps actually used (k was the bound) */
    for (int i = 1; i < out && kmax < k; i++)
        memmove(t->w + (size_t)i * kmax, t->w + (size_t)i * k, sizeof(float) * (size_t)kmax);
    t->k = kmax;
}

void ts__resample_ws_free(ts__resample_ws *ws) {
    free(ws->buf);
    ws->buf = NULL;
    ws->cap = 0;
}

/* Carves n bytes (64-byte aligned) from *p. */
static void *carve(char **p, size_t n) {
    void *r = *p;
    *p += (n + 63) & ~(size_t)63;
    return r;
}

/* ws's block grown to need bytes at least (what it held is not kept); its start for carve(). */
static ts_status ws_reserve(ts__resample_ws *ws, size_t need, const char *what, char **mem) {
    if (need > ws->cap) {
        void *b = malloc(need);
        if (!b) return ts_error(TS_ERR_NOMEM, "out of memory for %s (%zu bytes)", what, need);
        free(ws->buf);
        ws->buf = b;
        ws->cap = need;
    }
    *mem = ws->buf;
    return TS_OK;
}

/* The taps of `out` samples with room for k each, carved from *mem (taps_make fills them). */
static taps taps_carve(char **mem, int out, int k) {
    int *start = carve(mem, sizeof(int) * (size_t)out);
    return (taps){0, start, carve(mem, sizeof(float) * (size_t)out * k)};
}

/* Four floats: one RGB pixel (and a spare lane) in a 128-bit register (GCC/Clang vector extension). */
typedef float v4f __attribute__((vector_size(16)));

static inline v4f load4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The shared resampler. Output either float CHW (normalised: v * scale[c] + bias[c], mirrored when
 * `mirror`) into fout, or u8 HWC into uout.
 *
 * Per output row: the vertical pass makes one interleaved float row of the window (contiguous:
 * vectorises). The horizontal pass then computes each output pixel's channels together: for RGB,
 * a tap is one 4-float load (R, G, B and the next pixel's R) times the broadcast weight, so there
 * are no gathers; gray runs tap-major over the columns. Mirroring reverses the column taps up front,
 * so every write is forward. */
static ts_status resample(ts__resample_ws *ws, const ts_image *src, const ts_roi *roi, int ow, int oh, bool mirror,
                          const float *scale, const float *bias, float *fout, uint8_t *uout) {
    const int C = src->channels, rw = roi->w, kx = taps_bound(roi->w, ow), ky = taps_bound(roi->h, oh);
    /* the row is padded with zeros: a tap's 4-float load reads one float past the pixel, and gray's
     * tap-major loop reads up to K past the window for outputs with fewer taps (weight 0) */
    const size_t rlen = (size_t)(rw + kx + 2) * (size_t)C;
    const size_t need = 64 * 8 + sizeof(int) * ((size_t)ow + oh + ow) +
                        sizeof(float) * ((size_t)ow * kx + (size_t)oh * ky + rlen + (size_t)kx * ow + 4 * (size_t)ow);
    char *mem = NULL;
    TS_TRY(ws_reserve(ws, need, "a resize", &mem));
    taps tx = taps_carve(&mem, ow, kx), ty = taps_carve(&mem, oh, ky);
    float *row = carve(&mem, sizeof(float) * rlen), *wt = carve(&mem, sizeof(float) * (size_t)kx * ow);
    float *acc = carve(&mem, sizeof(float) * 4 * (size_t)ow);
    int *off = carve(&mem, sizeof(int) * (size_t)ow);
    taps_make(roi->x, roi->w, ow, &tx);
    taps_make(roi->y, roi->h, oh, &ty);
    const int K = tx.k;
    memset(row + (size_t)rw * C, 0, sizeof(float) * (rlen - (size_t)rw * C));
    memset(wt, 0, sizeof(float) * (size_t)K * ow);
    /* column taps in output order: RGB ox-major (w[ox * K + k]), gray tap-major (w[k * ow + ox]) */
    for (int ox = 0; ox < ow; ox++) {
        int from = mirror ? ow - 1 - ox : ox;
        off[ox] = tx.start[from] - roi->x;
        for (int k = 0; k < K; k++) {
            float w = tx.w[(size_t)from * K + k];
            if (C == 3)
                wt[(size_t)ox * K + k] = w;
            else
                wt[(size_t)k * ow + ox] = w;
        }
    }
    const size_t stride = (size_t)src->width * (size_t)C, plane = (size_t)ow * (size_t)oh;
    const int rwc = rw * C;
    for (int oy = 0; oy < oh; oy++) {
        /* vertical: row[j] = sum_k wy[k] * src[ys + k][x0 * C + j] */
        const float *wy = ty.w + (size_t)oy * ty.k;
        const uint8_t *s0 = src->data + (size_t)ty.start[oy] * stride + (size_t)roi->x * C;
        for (int j = 0; j < rwc; j++) row[j] = wy[0] * (float)s0[j];
        for (int k = 1; k < ty.k && wy[k] != 0.0f; k++) {
            const uint8_t *sk = s0 + (size_t)k * stride;
            const float wk = wy[k];
            for (int j = 0; j < rwc; j++) row[j] += wk * (float)sk[j];
        }
        if (C == 3) {
            /* horizontal: acc[4 ox .. 4 ox + 2] = sum_k w[ox][k] * row[3 (off + k) .. + 2] */
            for (int ox = 0; ox < ow; ox++) {
                const float *wx = wt + (size_t)ox * K, *r = row + 3 * (size_t)off[ox];
                v4f a = load4(r) * wx[0];
                for (int k = 1; k < K; k++) a += load4(r + 3 * k) * wx[k];
                memcpy(acc + 4 * (size_t)ox, &a, sizeof a);
            }
            if (fout) {
                float *o = fout + (size_t)oy * ow;
                for (int c = 0; c < 3; c++) {
                    const float sc = scale[c], bi = bias[c];
                    float *oc = o + c * plane;
                    for (int ox = 0; ox < ow; ox++) oc[ox] = acc[4 * ox + c] * sc + bi;
                }
            } else {
                uint8_t *o = uout + (size_t)oy * ow * 3;
                for (int j = 0; j < 3 * ow; j++) {
                    float a = acc[4 * (j / 3) + j % 3];
                    o[j] = (uint8_t)(a <= 0 ? 0 : a >= 255 ? 255 : (int)(a + 0.5f));
                }
            }
        } else {
            for (int ox = 0; ox < ow; ox++) acc[ox] = wt[ox] * row[off[ox]];
            for (int k = 1; k < K; k++) {
                const float *wk = wt + (size_t)k * ow, *pk = row + k;
                for (int ox = 0; ox < ow; ox++) acc[ox] += wk[ox] * pk[off[ox]];
            }
            if (fout) {
                float *o = fout + (size_t)oy * ow;
                for (int ox = 0; ox < ow; ox++) o[ox] = acc[ox] * scale[0] + bias[0];
            } else {
                uint8_t *o = uout + (size_t)oy * ow;
                for (int ox = 0; ox < ow; ox++) {
                    float a = acc[ox];
                    o[ox] = (uint8_t)(a <= 0 ? 0 : a >= 255 ? 255 : (int)(a + 0.5f));
                }
            }
        }
    }
    return TS_OK;
}

static ts_status check_roi(const char *op, const ts_image *src, const ts_roi *roi, int ow, int oh) {
    TS_ARG(src && src->data && roi, "%s: NULL argument", op);
    TS_ARG(src->channels == 1 || src->channels == 3, "%s: %d channels (expected 1 or 3)", op, src->channels);
    TS_ARG(ow >= 1 && oh >= 1 && ow <= 65536 && oh <= 65536, "%s: output size %d x %d", op, ow, oh);
    TS_ARG(roi->w >= 1 && roi->h >= 1 && roi->x >= 0 && roi->y >= 0 && roi->x + roi->w <= src->width &&
               roi->y + roi->h <= src->height,
           "%s: window (%d, %d) %d x %d is not inside the %d x %d image", op, roi->x, roi->y, roi->w, roi->h,
           src->width, src->height);
    return TS_OK;
}

ts_status ts_image_crop_resize_normalize(const ts_image *src, const ts_roi *roi, int out_w, int out_h, bool mirror,
                                         const float *mean, const float *std, float *out) {
    ts__resample_ws ws = {NULL, 0};
    ts_status st = ts__crop_resize_normalize_ws(&ws, src, roi, out_w, out_h, mirror, mean, std, out);
    ts__resample_ws_free(&ws);
    return st;
}

/* out = a * scale + bias for the normalisation (a - mean) / std, per channel. */
static ts_status norm_coeffs(int channels, const float *mean, const float *std, float *scale, float *bias) {
    for (int c = 0; c < channels; c++) {
        TS_ARG(std[c] != 0 && isfinite(std[c]) && isfinite(mean[c]), "ts_image_crop_resize_normalize: bad mean %g / std %g",
               mean[c], std[c]);
        scale[c] = 1.0f / std[c];
        bias[c] = -mean[c] / std[c];
    }
    return TS_OK;
}

ts_status ts__crop_resize_normalize_ws(ts__resample_ws *ws, const ts_image *src, const ts_roi *roi, int out_w,
                                       int out_h, bool mirror, const float *mean, const float *std, float *out) {
    TS_TRY(check_roi("ts_image_crop_resize_normalize", src, roi, out_w, out_h));
    TS_ARG(mean && std && out, "ts_image_crop_resize_normalize: NULL mean, std or out");
    float scale[3], bias[3];
    TS_TRY(norm_coeffs(src->channels, mean, std, scale, bias));
    return resample(ws, src, roi, out_w, out_h, mirror, scale, bias, out, NULL);
}

ts_status ts__resample_plan_ws(ts__resample_ws *ws, int width, int height, int channels, const ts_roi *roi,
                               int out_w, int out_h, bool mirror, const float *mean, const float *std,
                               ts_resample_plan *plan) {
    uint8_t px = 0; /* check_roi looks at the size only */
    ts_image im = {&px, width, height, channels, 0};
    TS_TRY(check_roi("ts__resample_plan_ws", &im, roi, out_w, out_h));
    TS_ARG(mean && std && plan, "ts__resample_plan_ws: NULL mean, std or plan");
    memset(plan, 0, sizeof *plan);
    TS_TRY(norm_coeffs(channels, mean, std, plan->scale, plan->bias));
    const int ow = out_w, oh = out_h, kx = taps_bound(roi->w, ow), ky = taps_bound(roi->h, oh);
    /* taps as resample() makes them, then the columns' reordered for the mirror into wxm / x0 */
    const size_t need =
        64 * 6 + sizeof(int) * (2 * (size_t)ow + oh) + sizeof(float) * (2 * (size_t)ow * kx + (size_t)oh * ky);
    char *mem = NULL;
    TS_TRY(ws_reserve(ws, need, "resampling taps", &mem));
    taps tx = taps_carve(&mem, ow, kx), ty = taps_carve(&mem, oh, ky);
    int *x0 = carve(&mem, sizeof(int) * (size_t)ow);
    float *wxm = carve(&mem, sizeof(float) * (size_t)ow * kx);
    taps_make(roi->x, roi->w, ow, &tx);
    taps_make(roi->y, roi->h, oh, &ty);
    for (int ox = 0; ox < ow; ox++) {
        int from = mirror ? ow - 1 - ox : ox;
        x0[ox] = tx.start[from];
        memcpy(wxm + (size_t)ox * tx.k, tx.w + (size_t)from * tx.k, sizeof(float) * (size_t)tx.k);
    }
    *plan = (ts_resample_plan){width, height, ow, oh, channels, tx.k, ty.k, x0, ty.start, wxm, ty.w,
                               {plan->scale[0], plan->scale[1], plan->scale[2]},
                               {plan->bias[0], plan->bias[1], plan->bias[2]}};
    return TS_OK;
}

ts_status ts_image_crop_mirror_normalize(const ts_image *src, int x, int y, int crop_w, int crop_h, bool mirror,
                                         const float *mean, const float *std, float *out) {
    ts_roi roi = {x, y, crop_w, crop_h};
    return ts_image_crop_resize_normalize(src, &roi, crop_w, crop_h, mirror, mean, std, out);
}

ts_status ts_image_resize(const ts_image *src, int out_w, int out_h, ts_image *dst) {
    TS_ARG(src && dst && src != dst, "ts_image_resize: NULL or aliased arguments");
    ts_roi roi = {0, 0, src->width, src->height};
    TS_TRY(check_roi("ts_image_resize", src, &roi, out_w, out_h));
    TS_TRY(ts_image_alloc(dst, out_w, out_h, src->channels));
    ts__resample_ws ws = {NULL, 0};
    ts_status st = resample(&ws, src, &roi, out_w, out_h, false, NULL, NULL, NULL, dst->data);
    ts__resample_ws_free(&ws);
    return st;
}

void ts_image_flip(ts_image *im, bool horizontal, bool vertical) {
    if (!im || !im->data) return;
    const int w = im->width, h = im->height, C = im->channels;
    const size_t stride = (size_t)w * C;
    if (horizontal)
        for (int y = 0; y < h; y++) {
            uint8_t *r = im->data + (size_t)y * stride;
            for (int a = 0, b = w - 1; a < b; a++, b--)
                for (int c = 0; c < C; c++) {
                    uint8_t t = r[a * C + c];
                    r[a * C + c] = r[b * C + c];
                    r[b * C + c] = t;
                }
        }
    if (vertical)
        for (int a = 0, b = h - 1; a < b; a++, b--) {
            uint8_t *ra = im->data + (size_t)a * stride, *rb = im->data + (size_t)b * stride;
            for (size_t j = 0; j < stride; j++) {
                uint8_t t = ra[j];
                ra[j] = rb[j];
                rb[j] = t;
            }
        }
}

ts_roi ts_random_resized_crop_roi(ts_rng *r, int width, int height, const float scale[2], const float ratio[2]) {
    const double area = (double)width * height, lr0 = log(ratio[0]), lr1 = log(ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (scale[0] + (scale[1] - scale[0]) * ts_rng_uniform(r));
        double aspect = exp(lr0 + (lr1 - lr0) * ts_rng_uniform(r));
        int w = (int)lround(sqrt(target * aspect)), h = (int)lround(sqrt(target / aspect));
        if (w > 0 && w <= width && h > 0 && h <= height) {
            int y = (int)ts_rng_below(r, (uint64_t)(height - h + 1));
            int x = (int)ts_rng_below(r, (uint64_t)(width - w + 1));
            return (ts_roi){x, y, w, h};
        }
    }
    double in_ratio = (double)width / height;
    int w = width, h = height;
    if (in_ratio < ratio[0]) {
        h = (int)lround(w / ratio[0]);
    } else if (in_ratio > ratio[1]) {
        w = (int)lround(h * ratio[1]);
    }
    if (w < 1) w = 1;
    if (h < 1) h = 1;
    if (w > width) w = width;
    if (h > height) h = height;
    return (ts_roi){(width - w) / 2, (height - h) / 2, w, h};
}
