/*
 * pipeline/decode.c — JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libspng)
 * decoding and encoding of 8-bit gray / RGB images.
 *
 * A bad file never crashes and never yields made-up pixels: every codec
 * failure, including libjpeg's warnings ("Premature end of JPEG file" for a
 * truncated file: libjpeg would pad it with gray), is TS_ERR_FORMAT with the
 * file's name and the codec's message. Decoders are not shared between
 * threads: each pipeline worker owns a ts__decoder.
 *
 * Bounded work for hostile files: an image whose header promises more than
 * max_pixels (ts_pipeline_opts.max_pixels, TS_MAX_IMAGE_PIXELS, default 64
 * Mpixel) is refused before anything is allocated; progressive JPEGs with more
 * than 500 scans are refused (TurboJPEG's TJFLAG_LIMITSCANS, and the same limit
 * through a progress monitor on the window path); PNG ancillary chunks may use
 * at most 8 MiB. A window decode reads only the rows down to the window, so it
 * also checks that the rest of the entropy-coded data ends with an EOI marker:
 * a truncated file fails whatever window the seed draws, as a whole decode does.
 */
#include "core/env.h"
#include "pipeline/pipeline_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <spng.h>
#include <stdio.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <jpeglib.h> /* after stdio.h; libjpeg-turbo's libjpeg API: partial (window) decoding */

#define MAX_SCANS 500                    /* progressive JPEG scans, as TurboJPEG's TJFLAG_LIMITSCANS */

int64_t ts__image_max_pixels(int64_t opt) {
    if (opt > 0) return opt;
    return ts_env_int(TS_ENV_MAX_IMAGE_PIXELS); /* refuse larger headers before allocating; 64M when unset */
}

/* libjpeg error handling: errors and warnings both end the decode (as TJFLAG_STOPONWARNING). */
typedef struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jerr;

static void jerr_exit(j_common_ptr c) {
    jerr *e = (jerr *)c->err;
    e->pub.format_message(c, e->msg);
    longjmp(e->jb, 1);
}

static void jerr_emit(j_common_ptr c, int level) {
    if (level < 0) jerr_exit(c); /* a warning: corrupt data */
}

static void scan_limit(j_common_ptr c) {
    if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > MAX_SCANS) {
        jerr *e = (jerr *)c->err;
        snprintf(e->msg, sizeof e->msg, "progressive JPEG with more than %d scans", MAX_SCANS);
        longjmp(e->jb, 1);
    }
}

struct ts__decoder {
    tjhandle tj;                         /* whole images (TurboJPEG) */
    struct jpeg_decompress_struct dinfo; /* windows (libjpeg API) */
    jerr err;
    struct jpeg_progress_mgr progress;   /* refuses more than MAX_SCANS scans */
    int64_t max_pixels;
    bool dinfo_ready;
    JSAMPROW *rows;
    int nrows;
};

ts_status ts__decoder_new(ts__decoder **out) {
    ts__decoder *d = ts__calloc(1, sizeof *d);
    if (!d) return TS_ERR_NOMEM;
    if (!(d->tj = tjInitDecompress())) {
        free(d);
        return ts_error(TS_ERR_NOMEM, "cannot start a TurboJPEG decompressor: %s", tjGetErrorStr2(NULL));
    }
    d->max_pixels = ts__image_max_pixels(0);
    d->dinfo.err = jpeg_std_error(&d->err.pub);
    d->err.pub.error_exit = jerr_exit;
    d->err.pub.emit_message = jerr_emit;
    d->progress.progress_monitor = scan_limit;
    if (setjmp(d->err.jb)) {
        tjDestroy(d->tj);
        free(d);
        return ts_error(TS_ERR_NOMEM, "cannot start a libjpeg decompressor");
    }
    jpeg_create_decompress(&d->dinfo);
    d->dinfo.progress = &d->progress;
    d->dinfo_ready = true;
    *out = d;
    return TS_OK;
}

void ts__decoder_set_max_pixels(ts__decoder *d, int64_t max_pixels) { d->max_pixels = ts__image_max_pixels(max_pixels); }

void ts__decoder_free(ts__decoder *d) {
    if (!d) return;
    tjDestroy(d->tj);
    if (d->dinfo_ready) jpeg_destroy_decompress(&d->dinfo);
    free(d->rows);
    free(d);
}

ts_status ts_image_alloc(ts_image *im, int width, int height, int channels) {
    TS_ARG(im && width > 0 && height > 0 && (channels == 1 || channels == 3),
           "ts_image_alloc: bad size %d x %d x %d", width, height, channels);
    size_t need = (size_t)width * (size_t)height * (size_t)channels;
    if (need > im->cap) {
        uint8_t *p = malloc(need);
        if (!p) return ts_error(TS_ERR_NOMEM, "out of memory for a %d x %d x %d image", width, height, channels);
        free(im->data);
        im->data = p;
        im->cap = need;
    }
    im->width = width;
    im->height = height;
    im->channels = channels;
    return TS_OK;
}

void ts_image_free(ts_image *im) {
    if (!im) return;
    free(im->data);
    *im = TS_IMAGE_INIT;
}

static ts__fmt sniff(const uint8_t *p, size_t n) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) return TS__FMT_JPEG;
    if (n >= 8 && memcmp(p, png_sig, 8) == 0) return TS__FMT_PNG;
    return TS__FMT_UNKNOWN;
}

static ts_status check_size(const char *name, const char *what, int w, int h, int64_t max_pixels) {
    if (w < 1 || h < 1)
        return ts_error(TS_ERR_FORMAT, "%s: %s header says %d x %d pixels: an empty image", name, what, w, h);
    if ((int64_t)w * h > max_pixels)
        return ts_error(TS_ERR_FORMAT, "%s: %s of %d x %d = %lld pixels is over the limit of %lld pixels "
                                       "(ts_pipeline_opts.max_pixels or TS_MAX_IMAGE_PIXELS)",
                        name, what, w, h, (long long)w * h, (long long)max_pixels);
    return TS_OK;
}

static ts_status unknown_format(const char *name, const uint8_t *p, size_t n) {
    if (n == 0) return ts_error(TS_ERR_FORMAT, "%s: empty file (0 bytes), expected a JPEG or PNG image", name);
    return ts_error(TS_ERR_FORMAT, "%s: not a JPEG or PNG image (starts with %02x %02x %02x %02x)", name, p[0],
                    n > 1 ? p[1] : 0, n > 2 ? p[2] : 0, n > 3 ? p[3] : 0);
}

/* ---- PNG ------------------------------------------------------------------------------------------ */
static spng_ctx *png_open(const void *buf, size_t n) {
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) return NULL;
    spng_set_image_limits(ctx, 1u << 16, 1u << 16);
    spng_set_chunk_limits(ctx, (uint32_t)TS_MIN(n, (size_t)1 << 26), 8u << 20); /* ancillary chunks: 8 MiB */
    if (spng_set_png_buffer(ctx, buf, n) != 0) {
        spng_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

static ts_status png_header(const void *buf, size_t n, const char *name, int64_t max_pixels, struct spng_ihdr *ihdr) {
    spng_ctx *ctx = png_open(buf, n);
    if (!ctx) return ts_error(TS_ERR_NOMEM, "%s: cannot start a PNG decoder", name);
    int e = spng_get_ihdr(ctx, ihdr);
    spng_ctx_free(ctx);
    if (e) return ts_error(TS_ERR_FORMAT, "%s: corrupt PNG: %s", name, spng_strerror(e));
    return check_size(name, "PNG", (int)ihdr->width, (int)ihdr->height, max_pixels);
}

/* Y = 0.299 R + 0.587 G + 0.114 B with libjpeg's 16-bit fixed-point constants and rounding. */
static void rgb_to_gray(const uint8_t *src, uint8_t *dst, size_t npix) {
    for (size_t i = 0; i < npix; i++)
        dst[i] = (uint8_t)((19595u * src[3 * i] + 38470u * src[3 * i + 1] + 7471u * src[3 * i + 2] + 32768u) >> 16);
}

static void gray_to_rgb_inplace(uint8_t *p, size_t npix) { /* back to front: p holds npix gray bytes */
    for (size_t i = npix; i-- > 0;) p[3 * i] = p[3 * i + 1] = p[3 * i + 2] = p[i];
}

static ts_status png_decode(const void *buf, size_t n, ts_color color, const char *name, int64_t max_pixels,
                            ts_image *out) {
    struct spng_ihdr ihdr;
    TS_TRY(png_header(buf, n, name, max_pixels, &ihdr));
    int w = (int)ihdr.width, h = (int)ihdr.height;
    size_t npix = (size_t)w * (size_t)h;
    bool gray_src = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr.bit_depth <= 8;
    int fmt = gray_src ? SPNG_FMT_G8 : SPNG_FMT_RGB8;
    /* decode into out when the result has the decoded layout, else into a scratch RGB buffer */
    uint8_t *scratch = NULL;
    uint8_t *dst;
    if (gray_src) {
        TS_TRY(ts_image_alloc(out, w, h, (int)color)); /* gray fits at the front, expanded in place */
        dst = out->data;
    } else if (color == TS_COLOR_RGB) {
        TS_TRY(ts_image_alloc(out, w, h, 3));
        dst = out->data;
    } else {
        if (!(scratch = malloc(npix * 3))) return ts_error(TS_ERR_NOMEM, "%s: out of memory", name);
        dst = scratch;
    }
    spng_ctx *ctx = png_open(buf, n);
    if (!ctx) {
        free(scratch);
        return ts_error(TS_ERR_NOMEM, "%s: cannot start a PNG decoder", name);
    }
    size_t need = 0;
    int e = spng_decoded_image_size(ctx, fmt, &need);
    if (!e && need != npix * (gray_src ? 1 : 3)) e = SPNG_EINTERNAL;
    if (!e) e = spng_decode_image(ctx, dst, need, fmt, 0);
    spng_ctx_free(ctx);
    if (e) {
        free(scratch);
        return ts_error(TS_ERR_FORMAT, "%s: corrupt PNG: %s", name, spng_strerror(e));
    }
    if (scratch) {
        ts_status st = ts_image_alloc(out, w, h, 1);
        if (st == TS_OK) rgb_to_gray(scratch, out->data, npix);
        free(scratch);
        return st;
    }
    if (gray_src && color == TS_COLOR_RGB) gray_to_rgb_inplace(out->data, npix);
    return TS_OK;
}

/* ---- JPEG ------------------------------------------------------------------------------------------ */
/* The error of d's TurboJPEG handle, which is then replaced: after a failed call (a header cut short, say)
 * TurboJPEG 2.1's handle keeps a half-read state, and its next header read reports the wrong size (0 x 0,
 * or an earlier file's) — with skip_corrupt, the files after a corrupt one came out cropped wrong. */
static ts_status jpeg_error(ts__decoder *d, const char *name) {
    ts_status st = ts_error(TS_ERR_FORMAT, "%s: corrupt JPEG: %s", name, tjGetErrorStr2(d->tj));
    tjhandle fresh = tjInitDecompress();
    if (fresh) { /* else the old one stays: better than none */
        tjDestroy(d->tj);
        d->tj = fresh;
    }
    return st;
}

ts_status ts__decode_header(ts__decoder *d, const void *buf, size_t n, const char *name, ts__fmt *fmt, int *w,
                            int *h) {
    *fmt = sniff(buf, n);
    if (*fmt == TS__FMT_JPEG) {
        int sub, cs;
        if (tjDecompressHeader3(d->tj, buf, (unsigned long)n, w, h, &sub, &cs) != 0) return jpeg_error(d, name);
        return check_size(name, "JPEG", *w, *h, d->max_pixels);
    }
    if (*fmt == TS__FMT_PNG) {
        struct spng_ihdr ihdr;
        TS_TRY(png_header(buf, n, name, d->max_pixels, &ihdr));
        *w = (int)ihdr.width;
        *h = (int)ihdr.height;
        return TS_OK;
    }
    return unknown_format(name, buf, n);
}

ts_status ts__decode(ts__decoder *d, const void *buf, size_t n, ts_color color, const char *name, int denom,
                     ts_image *out) {
    TS_ARG(color == TS_COLOR_GRAY || color == TS_COLOR_RGB, "ts_image_decode: color %d is not gray or RGB",
           (int)color);
    ts__fmt fmt = sniff(buf, n);
    if (fmt == TS__FMT_PNG) return png_decode(buf, n, color, name, d->max_pixels, out);
    if (fmt != TS__FMT_JPEG) return unknown_format(name, buf, n);
    int w, h, sub, cs;
    if (tjDecompressHeader3(d->tj, buf, (unsigned long)n, &w, &h, &sub, &cs) != 0) return jpeg_error(d, name);
    TS_TRY(check_size(name, "JPEG", w, h, d->max_pixels));
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) denom = 1;
    int sw = (w + denom - 1) / denom, sh = (h + denom - 1) / denom; /* TJSCALED(w, {1, denom}) */
    TS_TRY(ts_image_alloc(out, sw, sh, (int)color));
    int pf = color == TS_COLOR_RGB ? TJPF_RGB : TJPF_GRAY;
    if (tjDecompress2(d->tj, buf, (unsigned long)n, out->data, sw, 0, sh, pf, TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0)
        return jpeg_error(d, name);
    return TS_OK;
}

typedef struct window_args {
    const void *buf;
    size_t n;
    ts_color color;
    const char *name;
    int denom;
    const ts_roi *win;
    ts__window_fn choose; /* when set: picks win and denom from the header's size */
    void *ctx;
    ts_image *out;
    ts_roi *roi;
} window_args;

/* The libjpeg calls of ts__decode_window; a libjpeg error longjmps out of here to window_guarded. */
static ts_status window_decode(ts__decoder *d, const window_args *a) {
    struct jpeg_decompress_struct *c = &d->dinfo;
    int denom = a->denom;
    ts_roi chosen;
    const ts_roi *win = a->win;
    ts_status st;
    jpeg_mem_src(c, a->buf, (unsigned long)a->n);
    jpeg_read_header(c, TRUE);
    if ((st = check_size(a->name, "JPEG", (int)c->image_width, (int)c->image_height, d->max_pixels)) != TS_OK)
        return st;
    if (a->choose) {
        a->choose(a->ctx, (int)c->image_width, (int)c->image_height, &chosen, &denom);
        if (denom != 2 && denom != 4 && denom != 8) denom = 1;
        win = &chosen;
    }
    c->out_color_space = a->color == TS_COLOR_RGB ? JCS_RGB : JCS_GRAYSCALE;
    c->scale_num = 1;
    c->scale_denom = (unsigned)denom;
    jpeg_start_decompress(c);
    const int W = (int)c->output_width, H = (int)c->output_height;
    /* the window in output pixels, rounded outwards */
    int x0 = win->x / denom, y0 = win->y / denom;
    int x1 = TS_MIN((win->x + win->w + denom - 1) / denom, W), y1 = TS_MIN((win->y + win->h + denom - 1) / denom, H);
    if (x0 >= x1 || y0 >= y1)
        return ts_error(TS_ERR_INVALID_ARG, "%s: window (%d, %d) %d x %d is outside the %d x %d image", a->name, win->x,
                        win->y, win->w, win->h, (int)c->image_width, (int)c->image_height);
    /* one column more on either side: a chroma-subsampled image's fancy upsampling reads the neighbouring
     * chroma sample, so the first and last columns libjpeg-turbo crops to come out unlike a whole decode's
     * (by up to 27 levels on noisy 4:2:0 pictures); the window's own columns are then exact */
    const int cx0 = TS_MAX(x0 - 1, 0), cx1 = TS_MIN(x1 + 1, W);
    JDIMENSION xoff = (JDIMENSION)cx0, cw = (JDIMENSION)(cx1 - cx0);
    if (cx0 > 0 || cx1 < W) jpeg_crop_scanline(c, &xoff, &cw); /* widens to iMCU boundaries */
    const int ow = (int)c->output_width, oh = y1 - y0;
    TS_TRY(ts_image_alloc(a->out, ow, oh, (int)a->color));
    if (y0 > 0 && jpeg_skip_scanlines(c, (JDIMENSION)y0) != (JDIMENSION)y0)
        return ts_error(TS_ERR_FORMAT, "%s: corrupt JPEG: cannot skip to row %d", a->name, y0);
    const size_t stride = (size_t)ow * (size_t)a->color;
    while ((int)c->output_scanline < y1) {
        JSAMPROW r = a->out->data + stride * (size_t)((int)c->output_scanline - y0);
        if (jpeg_read_scanlines(c, &r, 1) != 1)
            return ts_error(TS_ERR_FORMAT, "%s: corrupt JPEG: no data at row %d", a->name, (int)c->output_scanline);
    }
    /* The rows below the window are never decoded: a file cut there must still fail, as it does in a
     * whole decode ("Premature end of JPEG file"). The rest of the data is entropy-coded bytes (0xFF is
     * stuffed as FF 00; restart markers are FF D0..D7), further scans, then FF D9: an EOI after the
     * decoder's position means the file is whole. */
    if (!jpeg_input_complete(c) && c->unread_marker != 0xd9) { /* EOI not reached, nor read by the entropy decoder */
        const uint8_t *p = c->src->next_input_byte, *base = a->buf;
        size_t left = c->src->bytes_in_buffer;
        bool eoi = false;
        if (p >= base && p <= base + a->n && left <= (size_t)(base + a->n - p)) {
            for (const uint8_t *q = p, *end = p + left; !eoi && (q = memchr(q, 0xff, (size_t)(end - q))) && q + 1 < end;
                 q++)
                eoi = q[1] == 0xd9;
        }
        if (!eoi)
            return ts_error(TS_ERR_FORMAT, "%s: corrupt JPEG: Premature end of JPEG file (no end-of-image marker after "
                                           "offset %zu of %zu bytes)",
                            a->name, (size_t)(p >= base && p <= base + a->n ? p - base : 0), a->n);
    }
    a->roi->x = x0 - (int)xoff;
    a->roi->y = 0;
    a->roi->w = x1 - x0;
    a->roi->h = oh;
    return TS_OK;
}

static ts_status window_guarded(ts__decoder *d, const window_args *a) {
    ts__decoder *volatile vd = d; /* what the error path uses after longjmp */
    const window_args *volatile va = a;
    if (setjmp(d->err.jb)) {
        jpeg_abort_decompress(&vd->dinfo);
        return ts_error(TS_ERR_FORMAT, "%s: corrupt JPEG: %s", va->name, vd->err.msg);
    }
    ts_status st = window_decode(vd, va);
    jpeg_abort_decompress(&vd->dinfo); /* the rows below the window are never decoded */
    return st;
}

ts_status ts__decode_window(ts__decoder *d, const void *buf, size_t n, ts_color color, const char *name,
                            int scale_denom, const ts_roi *win, ts_image *out, ts_roi *roi) {
    if (sniff(buf, n) != TS__FMT_JPEG) return unknown_format(name, buf, n);
    const window_args a = {buf,  n,    color, name, scale_denom == 2 || scale_denom == 4 || scale_denom == 8 ? scale_denom : 1,
                           win,  NULL, NULL,  out,  roi};
    return window_guarded(d, &a);
}

ts_status ts__decode_window_chosen(ts__decoder *d, const void *buf, size_t n, ts_color color, const char *name,
                                   ts__window_fn choose, void *ctx, ts_image *out, ts_roi *roi) {
    if (sniff(buf, n) != TS__FMT_JPEG) return unknown_format(name, buf, n);
    const window_args a = {buf, n, color, name, 1, NULL, choose, ctx, out, roi};
    return window_guarded(d, &a);
}

ts_status ts_image_decode(const void *buf, size_t n, ts_color color, const char *name, ts_image *out) {
    TS_ARG(out && (buf || n == 0), "ts_image_decode: NULL argument");
    if (!name) name = "<buffer>";
    if (sniff(buf, n) != TS__FMT_JPEG) { /* no TurboJPEG handle needed */
        if (sniff(buf, n) == TS__FMT_PNG) {
            TS_ARG(color == TS_COLOR_GRAY || color == TS_COLOR_RGB, "ts_image_decode: color %d is not gray or RGB",
                   (int)color);
            return png_decode(buf, n, color, name, ts__image_max_pixels(0), out);
        }
        return unknown_format(name, buf, n);
    }
    ts__decoder *d = NULL;
    TS_TRY(ts__decoder_new(&d));
    ts_status st = ts__decode(d, buf, n, color, name, 1, out);
    ts__decoder_free(d);
    return st;
}

/* ---- files ------------------------------------------------------------------------------------------- */
#define MAX_FILE_BYTES ((uint64_t)1 << 30) /* no image file we can decode within max_pixels is larger */

ts_status ts__read_file(const char *path, bool listed_regular, uint8_t **buf, size_t *cap, size_t *n) {
    int fd = -1;
    uint64_t size = 0;
    TS_TRY((listed_regular ? ts__open_listed_regular : ts__open_regular)(path, "an image file", &fd, &size));
    if (size > MAX_FILE_BYTES) {
        close(fd);
        return ts_error(TS_ERR_FORMAT, "%s: %llu bytes, more than the %llu an image file may have", path,
                        (unsigned long long)size, (unsigned long long)MAX_FILE_BYTES);
    }
    size_t want = (size_t)size, got = 0;
    if (want + 1 > *cap) {
        size_t c = want + 1 > 2 * *cap ? want + 1 : 2 * *cap;
        uint8_t *p = realloc(*buf, c);
        if (!p) {
            close(fd);
            return ts_error(TS_ERR_NOMEM, "%s: out of memory for %zu bytes", path, want);
        }
        *buf = p;
        *cap = c;
    }
    while (got < want) {
        ssize_t r = read(fd, *buf + got, want - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) { /* O_NONBLOCK left by ts__open_listed_regular: wait after all */
            int fl = fcntl(fd, F_GETFL);
            if (fl >= 0 && (fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0) continue;
        }
        if (r < 0) {
            int e = errno;
            close(fd);
            return ts_error(TS_ERR_IO, "%s: read error: %s", path, strerror(e));
        }
        if (r == 0) break; /* shrank while reading: decode what is there */
        got += (size_t)r;
    }
    close(fd);
    *n = got;
    return TS_OK;
}

ts_status ts_image_read(const char *path, ts_color color, ts_image *out) {
    TS_ARG(path && out, "ts_image_read: NULL argument");
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0;
    ts_status st = ts__read_file(path, false, &buf, &cap, &n);
    if (st == TS_OK) st = ts_image_decode(buf, n, color, path, out);
    free(buf);
    return st;
}

ts_status ts_image_write_png(const ts_image *im, const char *path) {
    TS_ARG(im && im->data && path && (im->channels == 1 || im->channels == 3), "ts_image_write_png: bad argument");
    spng_ctx *enc = spng_ctx_new(SPNG_CTX_ENCODER);
    if (!enc) return ts_error(TS_ERR_NOMEM, "%s: cannot start a PNG encoder", path);
    struct spng_ihdr ihdr = {(uint32_t)im->width, (uint32_t)im->height, 8,
                             im->channels == 3 ? SPNG_COLOR_TYPE_TRUECOLOR : SPNG_COLOR_TYPE_GRAYSCALE, 0, 0, 0};
    size_t len = (size_t)im->width * (size_t)im->height * (size_t)im->channels, pn = 0;
    int e = spng_set_option(enc, SPNG_ENCODE_TO_BUFFER, 1);
    if (!e) e = spng_set_ihdr(enc, &ihdr);
    if (!e) e = spng_encode_image(enc, im->data, len, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    void *png = e ? NULL : spng_get_png_buffer(enc, &pn, &e);
    spng_ctx_free(enc);
    if (e || !png) {
        free(png);
        return ts_error(TS_ERR_INTERNAL, "%s: PNG encoding failed: %s", path, spng_strerror(e));
    }
    ts_status st = ts__write_file_atomic(path, "an image", png, pn);
    free(png);
    return st;
}

ts_status ts_image_write_jpeg(const ts_image *im, const char *path, int quality) {
    TS_ARG(im && im->data && path && (im->channels == 1 || im->channels == 3), "ts_image_write_jpeg: bad argument");
    TS_ARG(quality >= 1 && quality <= 100, "ts_image_write_jpeg: quality %d is out of range [1, 100]", quality);
    tjhandle tj = tjInitCompress();
    if (!tj) return ts_error(TS_ERR_NOMEM, "%s: cannot start a TurboJPEG compressor", path);
    unsigned char *jb = NULL;
    unsigned long jn = 0;
    int pf = im->channels == 3 ? TJPF_RGB : TJPF_GRAY, sub = im->channels == 3 ? TJSAMP_420 : TJSAMP_GRAY;
    ts_status st = TS_OK;
    if (tjCompress2(tj, im->data, im->width, 0, im->height, pf, &jb, &jn, sub, quality, 0) != 0)
        st = ts_error(TS_ERR_INTERNAL, "%s: JPEG encoding failed: %s", path, tjGetErrorStr2(tj));
    else
        st = ts__write_file_atomic(path, "an image", jb, jn);
    tjFree(jb);
    tjDestroy(tj);
    return st;
}

/* ts__jpeg_has_end: whether a JPEG's data holds an end-of-image marker after its last start-of-scan: a
 * file cut short is left to the host decoder (which names what is wrong; nvJPEG may decode what is there
 * without a word). Entropy-coded data never holds either marker (0xFF is stuffed), an embedded thumbnail's
 * come before the image's own scans, and trailing bytes after the marker are allowed. Scanning back from
 * the end, the first of the two markers decides: a whole file costs the trailing bytes only, a cut one the
 * rest of its last scan. */
bool ts__jpeg_has_end(const uint8_t *b, size_t n) {
    for (size_t i = n; i-- > 1;) {
        if (b[i - 1] != 0xff) continue;
        if (b[i] == 0xd9) return true;
        if (b[i] == 0xda) return false;
    }
    return false;
}
