/*
 * tests/fuzz/fuzz_image.c — libFuzzer target: the image decoders (src/pipeline/
 * decode.c: TurboJPEG whole and scaled decodes, libjpeg window decodes with
 * jpeg_crop_scanline / jpeg_skip_scanlines, libspng) and the pipeline's
 * crop-resize-normalize on whatever decodes. Input: 6 parameter bytes, then
 * the file:
 *   p[0] bit 0: gray or RGB; bits 1-2: path — 0 ts_image_decode (whole),
 *        1 ts__decode at 1/denom, 2 ts__decode_window with a window in pixels
 *        from p[2..5], 3 ts__decode_window_chosen with the window as fractions
 *        of the header's size (the pipeline's fused decode + random crop);
 *   p[1] bits 0-1: denom 1, 2, 4, 8; p[2..5]: x, y, w, h.
 * The pixel limit is 4 Mpixel here (TS_MAX_IMAGE_PIXELS), so a header may not
 * make the target allocate more than ~12 MB per image.
 * Seeds: tests/fuzz/corpus/image (small JPEGs, baseline and progressive, gray
 * and RGB, and PNGs of several color types).
 */
#include "pipeline/pipeline_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static ts__decoder *dec;
static ts_image img;
static ts__resample_ws ws;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    ts_log_set_level(TS_LOG_OFF);
    setenv("TS_MAX_IMAGE_PIXELS", "4194304", 1);
    if (ts__decoder_new(&dec) != TS_OK) {
        fprintf(stderr, "fuzz_image: %s\n", ts_last_error());
        return 1;
    }
    ts__decoder_set_max_pixels(dec, 4 << 20);
    return 0;
}

typedef struct frac {
    uint8_t x, y, w, h;
} frac;

static void choose(void *ctx, int width, int height, ts_roi *win, int *denom) {
    const frac *f = ctx;
    win->x = (int)((int64_t)width * f->x / 256);
    win->y = (int)((int64_t)height * f->y / 256);
    win->w = 1 + (int)((int64_t)(width - win->x) * f->w / 256);
    win->h = 1 + (int)((int64_t)(height - win->y) * f->h / 256);
    if (win->x + win->w > width) win->w = width - win->x;
    if (win->y + win->h > height) win->h = height - win->y;
    *denom = 1 << (f->x & 3);
}

static void augment(const ts_image *im, const ts_roi *roi) {
    if (!im->data || roi->w < 1 || roi->h < 1 || roi->x < 0 || roi->y < 0 || roi->x + roi->w > im->width ||
        roi->y + roi->h > im->height)
        return;
    float out[3 * 7 * 5], mean[3] = {0, 0, 0}, std[3] = {255, 255, 255};
    if (ts__crop_resize_normalize_ws(&ws, im, roi, 7, 5, roi->x & 1, mean, std, out) != TS_OK) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 6 || !dec) return 0;
    ts_color color = data[0] & 1 ? TS_COLOR_RGB : TS_COLOR_GRAY;
    int path = (data[0] >> 1) & 3, denom = 1 << (data[1] & 3);
    frac f = {data[2], data[3], data[4], data[5]};
    const uint8_t *buf = data + 6;
    size_t n = size - 6;
    ts_roi roi = {0, 0, 0, 0};
    ts_status st;
    switch (path) {
    case 0:
        st = ts_image_decode(buf, n, color, "fuzz", &img);
        roi = (ts_roi){0, 0, img.width, img.height};
        break;
    case 1:
        st = ts__decode(dec, buf, n, color, "fuzz", denom, &img);
        roi = (ts_roi){0, 0, img.width, img.height};
        break;
    case 2: {
        ts_roi win = {f.x, f.y, 1 + f.w, 1 + f.h};
        st = ts__decode_window(dec, buf, n, color, "fuzz", denom, &win, &img, &roi);
        break;
    }
    default:
        st = ts__decode_window_chosen(dec, buf, n, color, "fuzz", choose, &f, &img, &roi);
        break;
    }
    if (st == TS_OK) {
        if (img.channels != (int)color || img.width < 1 || img.height < 1) __builtin_trap();
        volatile unsigned sink = 0;
        for (size_t i = 0; i < (size_t)img.width * (size_t)img.height * (size_t)img.channels; i++) sink += img.data[i];
        (void)sink;
        augment(&img, &roi);
    }
    return 0;
}
