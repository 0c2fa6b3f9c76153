/*
 * pipeline/resize_pil.c — torchvision's evaluation transform, bit for bit:
 *
 *     Resize(R) -> CenterCrop((crop_h, crop_w)) -> ToTensor -> Normalize(mean, std)
 *
 * on a PIL image (what ImageFolder loads), so the resize is Pillow's: Image.resize(size, BILINEAR)
 * with no reducing_gap (Pillow's Resample.c, ImagingResampleInner):
 *   - per axis, output i of in -> out samples has centre (i + 0.5) * scale, scale = in / out; its
 *     taps are the pixels [(int)(centre - support + 0.5), (int)(centre + support + 0.5)) clipped to
 *     the image, support = max(scale, 1), weighted by the triangle 1 - |x + 0.5 - centre| / support
 *     (x the pixel), normalised in double, then rounded to 22-bit fixed point (PRECISION_BITS = 32 - 8 - 2,
 *     away from zero at .5);
 *   - the horizontal pass runs first, over the rows the vertical pass will read, and is stored as
 *     8-bit pixels: each value is (2^21 + sum pixel * weight) >> 22, clipped to [0, 255]; the vertical
 *     pass reads those and rounds the same way.
 * Resize(R) makes the shorter side R and the longer int(R * longer / shorter) (torchvision's
 * _compute_resized_output_size), and does nothing when that is the image's size. CenterCrop takes
 * the window at round((size - crop) / 2) (Python's round: ties to even); a crop larger than the
 * resized image pads it with zeros first, (crop - size) // 2 before. Only the crop's pixels are
 * computed: each depends on its own row and column only, so they are the full resize's.
 * ToTensor + Normalize: (v / 255 - mean) / std in float32; here one table per channel of
 * (v - mean) / std in pixel units, rounded once from double (within 2 ulp of torchvision's
 * float32 sequence).
 */
#include "pipeline/pipeline_internal.h"

#include <math.h>

#define PIL_PRECISION_BITS (32 - 8 - 2)

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for outputs first .. first + n - 1 of an axis of
 * in_size pixels resized to out_size: x0[i], len[i] and k[i * ksize ..] (fixed point, zero-padded). */
static void pil_coeffs(int in_size, int out_size, int first, int n, int ksize, int *x0, int *len, int32_t *k) {
    const double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = filterscale, ss = 1.0 / filterscale;
    double w[1024];
    for (int i = 0; i < n; i++) {
        const double center = (first + i + 0.5) * scale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        if (xmax > ksize) xmax = ksize; /* cannot happen: ksize = 2 ceil(support) + 1 */
        double ww = 0.0;
        for (int x = 0; x < xmax; x++) {
            double d = fabs((x + xmin - center + 0.5) * ss);
            w[x] = d < 1.0 ? 1.0 - d : 0.0;
            ww += w[x];
        }
        int32_t *ki = k + (size_t)i * ksize;
        for (int x = 0; x < ksize; x++) {
            double v = x < xmax && ww != 0.0 ? w[x] / ww : 0.0;
            ki[x] = (int32_t)(v < 0 ? -0.5 + v * (1 << PIL_PRECISION_BITS) : 0.5 + v * (1 << PIL_PRECISION_BITS));
        }
        x0[i] = xmin;
        len[i] = xmax;
    }
}

static inline uint8_t pil_clip8(int64_t v) {
    if (v >= (int64_t)1 << PIL_PRECISION_BITS << 8) return 255;
    if (v <= 0) return 0;
    return (uint8_t)(v >> PIL_PRECISION_BITS);
}

/* The offset of the crop in the resized axis: output i is resized pixel i + off (outside [0, size): zero
 * padding). CenterCrop's round((size - crop) / 2), ties to even, or the padding's -(crop - size) // 2. */
static int crop_offset(int size, int crop) {
    if (crop > size) return -((crop - size) / 2);
    return (int)nearbyint((size - crop) / 2.0);
}

void ts_resize_shorter_side(int width, int height, int resize, int *out_w, int *out_h) {
    const int shorter = width <= height ? width : height, longer = width <= height ? height : width;
    const int nl = (int)((double)resize * longer / shorter);
    *out_w = width <= height ? resize : nl;
    *out_h = width <= height ? nl : resize;
}

/* One axis's taps for the crop's outputs that fall inside the resized axis. */
typedef struct pil_axis {
    int first, n; /* resized outputs [first, first + n) inside [0, out) */
    int ksize;
    int *x0, *len;
    int32_t *k;
} pil_axis;

static void *carve(char **p, size_t n) {
    void *r = *p;
    *p += (n + 63) & ~(size_t)63;
    return r;
}

static void axis_plan(int in_size, int out_size, int off, int crop, pil_axis *a) {
    const double scale = (double)in_size / out_size;
    a->ksize = (int)ceil(scale < 1.0 ? 1.0 : scale) * 2 + 1;
    a->first = off < 0 ? 0 : off;
    int last = off + crop < out_size ? off + crop : out_size;
    a->n = last - a->first;
}

static size_t axis_bytes(const pil_axis *a) {
    return 3 * 64 + sizeof(int) * 2 * (size_t)a->n + sizeof(int32_t) * (size_t)a->n * (size_t)a->ksize;
}

static void axis_carve(char **mem, pil_axis *a) {
    a->x0 = carve(mem, sizeof(int) * (size_t)a->n);
    a->len = carve(mem, sizeof(int) * (size_t)a->n);
    a->k = carve(mem, sizeof(int32_t) * (size_t)a->n * (size_t)a->ksize);
}

/* Pillow's two passes over the crop's window of the resized image: into u8 HWC (ax.n x ay.n). */
static void pil_passes(const ts_image *src, const pil_axis *ax, const pil_axis *ay, bool hpass, bool vpass,
                       uint8_t *tmp, uint8_t *win) {
    const int C = src->channels;
    const size_t stride = (size_t)src->width * C;
    /* the source rows the vertical pass reads (all of them when there is no vertical pass) */
    const int r0 = vpass ? ay->x0[0] : ay->first, r1 = vpass ? ay->x0[ay->n - 1] + ay->len[ay->n - 1] : ay->first + ay->n;
    const size_t trow = (size_t)ax->n * C;
    for (int y = r0; y < r1; y++) {
        const uint8_t *s = src->data + (size_t)y * stride;
        uint8_t *t = tmp + (size_t)(y - r0) * trow;
        if (!hpass) {
            memcpy(t, s + (size_t)ax->first * C, trow);
            continue;
        }
        for (int i = 0; i < ax->n; i++) {
            const int32_t *k = ax->k + (size_t)i * ax->ksize;
            const uint8_t *p = s + (size_t)ax->x0[i] * C;
            for (int c = 0; c < C; c++) {
                int64_t acc = (int64_t)1 << (PIL_PRECISION_BITS - 1);
                for (int j = 0; j < ax->len[i]; j++) acc += (int64_t)p[(size_t)j * C + c] * k[j];
                t[(size_t)i * C + c] = pil_clip8(acc);
            }
        }
    }
    for (int i = 0; i < ay->n; i++) {
        uint8_t *o = win + (size_t)i * trow;
        if (!vpass) {
            memcpy(o, tmp + (size_t)(ay->first + i - r0) * trow, trow);
            continue;
        }
        const int32_t *k = ay->k + (size_t)i * ay->ksize;
        const uint8_t *t0 = tmp + (size_t)(ay->x0[i] - r0) * trow;
        for (size_t j = 0; j < trow; j++) {
            int64_t acc = (int64_t)1 << (PIL_PRECISION_BITS - 1);
            for (int r = 0; r < ay->len[i]; r++) acc += (int64_t)t0[(size_t)r * trow + j] * k[r];
            o[j] = pil_clip8(acc);
        }
    }
}

ts_status ts__resize_center_crop_normalize_ws(ts__resample_ws *ws, const ts_image *src, int resize, int crop_w,
                                              int crop_h, const float *mean, const float *std, float *out) {
    TS_ARG(src && src->data && mean && std && out, "ts_image_resize_center_crop_normalize: NULL argument");
    TS_ARG(src->channels == 1 || src->channels == 3, "ts_image_resize_center_crop_normalize: %d channels "
           "(expected 1 or 3)", src->channels);
    TS_ARG(src->width >= 1 && src->height >= 1, "ts_image_resize_center_crop_normalize: a %d x %d image",
           src->width, src->height);
    TS_ARG(resize >= 1 && resize <= 65536 && crop_w >= 1 && crop_h >= 1 && crop_w <= 65536 && crop_h <= 65536,
           "ts_image_resize_center_crop_normalize: resize %d, crop %d x %d", resize, crop_w, crop_h);
    const int C = src->channels;
    float lut[3][256];
    for (int c = 0; c < C; c++) {
        TS_ARG(std[c] != 0 && isfinite(std[c]) && isfinite(mean[c]),
               "ts_image_resize_center_crop_normalize: bad mean %g / std %g", mean[c], std[c]);
        for (int v = 0; v < 256; v++) lut[c][v] = (float)(((double)v - mean[c]) / std[c]);
    }
    int rw, rh;
    ts_resize_shorter_side(src->width, src->height, resize, &rw, &rh); /* the image's size: no resize */
    TS_ARG((int64_t)rw * rh <= (int64_t)1 << 31, "ts_image_resize_center_crop_normalize: resizing %d x %d to "
           "%d x %d", src->width, src->height, rw, rh);
    const bool hpass = rw != src->width, vpass = rh != src->height;
    const int offx = crop_offset(rw, crop_w), offy = crop_offset(rh, crop_h);
    pil_axis ax, ay;
    axis_plan(src->width, rw, offx, crop_w, &ax);
    axis_plan(src->height, rh, offy, crop_h, &ay);
    TS_ARG(ax.ksize <= 1024 && ay.ksize <= 1024, "ts_image_resize_center_crop_normalize: shrinking %d x %d to "
           "%d x %d (more than 512:1)", src->width, src->height, rw, rh);
    /* the rows of the source the vertical pass reads: at most n * (scale + 2) + ksize */
    const size_t rows = (size_t)(vpass ? (int64_t)ay.n * ((src->height + rh - 1) / rh + 2) + ay.ksize : ay.n);
    const size_t need = axis_bytes(&ax) + axis_bytes(&ay) + 2 * 64 + rows * (size_t)ax.n * C +
                        (size_t)ax.n * ay.n * C;
    if (need > ws->cap) {
        void *b = malloc(need);
        if (!b) return ts_error(TS_ERR_NOMEM, "out of memory for an evaluation resize (%zu bytes)", need);
        free(ws->buf);
        ws->buf = b;
        ws->cap = need;
    }
    char *mem = ws->buf;
    axis_carve(&mem, &ax);
    axis_carve(&mem, &ay);
    pil_coeffs(src->width, rw, ax.first, ax.n, ax.ksize, ax.x0, ax.len, ax.k);
    pil_coeffs(src->height, rh, ay.first, ay.n, ay.ksize, ay.x0, ay.len, ay.k);
    uint8_t *tmp = carve(&mem, rows * (size_t)ax.n * C), *win = carve(&mem, (size_t)ax.n * ay.n * C);
    if (ax.n > 0 && ay.n > 0) pil_passes(src, &ax, &ay, hpass, vpass, tmp, win);
    const size_t plane = (size_t)crop_w * crop_h;
    for (int y = 0; y < crop_h; y++) {
        const int ry = y + offy - ay.first; /* row of win, outside [0, ay.n): padding */
        for (int x = 0; x < crop_w; x++) {
            const int rx = x + offx - ax.first;
            const bool in = ry >= 0 && ry < ay.n && rx >= 0 && rx < ax.n;
            for (int c = 0; c < C; c++)
                out[c * plane + (size_t)y * crop_w + x] = lut[c][in ? win[((size_t)ry * ax.n + rx) * C + c] : 0];
        }
    }
    return TS_OK;
}

ts_status ts_image_resize_center_crop_normalize(const ts_image *src, int resize, int crop_w, int crop_h,
                                                const float *mean, const float *std, float *out) {
    ts__resample_ws ws = {NULL, 0};
    ts_status st = ts__resize_center_crop_normalize_ws(&ws, src, resize, crop_w, crop_h, mean, std, out);
    ts__resample_ws_free(&ws);
    return st;
}
