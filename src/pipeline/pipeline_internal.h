/*
 * pipeline/pipeline_internal.h — what the files of src/pipeline share: C ports
 * of the C++ standard-library random streams DALI's reader uses, the reader's
 * sample source, and the decoder context each worker thread keeps.
 */
#ifndef TS_PIPELINE_INTERNAL_H
#define TS_PIPELINE_INTERNAL_H

#include "core/internal.h"
#include "tessera/pipeline.h"

/* ---- libstdc++ (GCC 12) random streams, bit for bit (stdrng.c) ------------------------------- */
/* std::mt19937 */
typedef struct ts__mt19937 {
    uint32_t mt[624];
    int i;
} ts__mt19937;
void ts__mt19937_seed(ts__mt19937 *g, uint32_t seed);
uint32_t ts__mt19937_next(ts__mt19937 *g);
/* std::shuffle(first, first + n, mt19937&) as libstdc++ does it (two swap positions per draw when
 * n * n fits the generator's range; uniform_int_distribution<unsigned long> by Lemire's method). */
void ts__std_shuffle_i64(int64_t *a, int64_t n, ts__mt19937 *g);
/* std::mt19937_64 and std::shuffle(first, first + n, mt19937_64&) (Lemire's method on 128 bits). */
typedef struct ts__mt19937_64 {
    uint64_t mt[312];
    int i;
} ts__mt19937_64;
void ts__mt19937_64_seed(ts__mt19937_64 *g, uint64_t seed);
uint64_t ts__mt19937_64_next(ts__mt19937_64 *g);
void ts__std_shuffle64_i64(int64_t *a, int64_t n, ts__mt19937_64 *g);

/* std::minstd_rand0 (libstdc++'s std::default_random_engine) seeded as
 * std::default_random_engine(std::seed_seq({seed})). */
typedef struct ts__minstd {
    uint64_t x;
} ts__minstd;
void ts__minstd_seed_seq(ts__minstd *g, int64_t seed);
/* std::uniform_int_distribution<int>(lo, hi)(g) (the two-division rejection path). */
int ts__minstd_uniform_int(ts__minstd *g, int lo, int hi);

/* ---- reader internals (reader.c) ---------------------------------------------------------------- */
typedef enum { TS__SRC_FILES, TS__SRC_IDX } ts__src_kind;
ts__src_kind ts__reader_kind(const ts_reader *r);
/* IDX source: the gray pixels of sample i (h x w, borrowed). */
const uint8_t *ts__reader_idx_pixels(const ts_reader *r, int64_t i, int *w, int *h);
/* Copy of the options the reader was made with (strings borrowed from the reader). */
const ts_reader_opts *ts__reader_opts(const ts_reader *r);
/* Whether sample i's file was listed as a regular file (readdir's DT_REG, file_root listings). */
bool ts__reader_listed_regular(const ts_reader *r, int64_t i);

/* ---- decoding (decode.c) ------------------------------------------------------------------------ */
typedef enum { TS__FMT_UNKNOWN = 0, TS__FMT_JPEG, TS__FMT_PNG } ts__fmt;

/* Codec handles one thread reuses (TurboJPEG decompressor, ...). */
typedef struct ts__decoder ts__decoder;
ts_status ts__decoder_new(ts__decoder **out);
void ts__decoder_free(ts__decoder *d);
/* The pixel limit of a decoder: images whose header promises more are TS_ERR_FORMAT before any
 * allocation. ts__image_max_pixels(v): v when > 0, else TS_MAX_IMAGE_PIXELS (pixels, or with an M
 * suffix Mpixels) when set, else 64 Mpixel. New decoders start at ts__image_max_pixels(0). */
int64_t ts__image_max_pixels(int64_t v);
void ts__decoder_set_max_pixels(ts__decoder *d, int64_t max_pixels);
/* Format and size from the header alone. */
ts_status ts__decode_header(ts__decoder *d, const void *buf, size_t n, const char *name, ts__fmt *fmt, int *w,
                            int *h);
/* Decodes into *out; for JPEG, at 1/denom of the size (denom 1, 2, 4 or 8: libjpeg-turbo's DCT
 * scaling; out gets ceil(w / denom) x ceil(h / denom)). */
ts_status ts__decode(ts__decoder *d, const void *buf, size_t n, ts_color color, const char *name, int denom,
                     ts_image *out);
/* Decodes only what covers the window `win` (full-size pixels) of a JPEG, at 1/denom of the size
 * (libjpeg-turbo's jpeg_crop_scanline / jpeg_skip_scanlines: rows below the window are not decoded,
 * rows above are skipped without the inverse DCT, columns outside are not converted). *out gets the
 * decoded region and *roi the window inside it (scaled, rounded outwards). The pixels are libjpeg's
 * own for that region. */
ts_status ts__decode_window(ts__decoder *d, const void *buf, size_t n, ts_color color, const char *name, int denom,
                            const ts_roi *win, ts_image *out, ts_roi *roi);
/* The same, with the window (in full-size pixels) and the DCT scale denominator chosen by `choose`
 * from the size in the header, which is parsed once. */
typedef void (*ts__window_fn)(void *ctx, int width, int height, ts_roi *win, int *denom);
ts_status ts__decode_window_chosen(ts__decoder *d, const void *buf, size_t n, ts_color color, const char *name,
                                   ts__window_fn choose, void *ctx, ts_image *out, ts_roi *roi);

/* Whether JPEG data b[0, n) holds an end-of-image marker after its last start-of-scan marker (a file cut
 * short does not; the mixed decoding leaves such files to the host decoder). */
bool ts__jpeg_has_end(const uint8_t *b, size_t n);

/* ---- resampling with reusable buffers (ops.c) ------------------------------------------------- */
struct ts_resample_plan; /* device/k_image.h */
typedef struct ts__resample_ws {
    void *buf;  /* one block, grown as needed */
    size_t cap;
} ts__resample_ws;
void ts__resample_ws_free(ts__resample_ws *ws);
/* ts_image_crop_resize_normalize with the scratch memory in ws (one per thread). */
ts_status ts__crop_resize_normalize_ws(ts__resample_ws *ws, const ts_image *src, const ts_roi *roi, int out_w,
                                       int out_h, bool mirror, const float *mean, const float *std, float *out);
/* ts_image_resize_center_crop_normalize with the scratch memory in ws (resize_pil.c). */
ts_status ts__resize_center_crop_normalize_ws(ts__resample_ws *ws, const ts_image *src, int resize, int crop_w,
                                              int crop_h, const float *mean, const float *std, float *out);
/* The same step as taps for a device decoder (device/k_image.h): *plan's arrays live in ws until its next
 * use. roi is in the coordinates of the whole width x height image. */
ts_status ts__resample_plan_ws(ts__resample_ws *ws, int width, int height, int channels, const ts_roi *roi,
                               int out_w, int out_h, bool mirror, const float *mean, const float *std,
                               struct ts_resample_plan *plan);

/* Reads a whole file into *buf (grown as needed; *cap is its size): open, fstat, one read of the size,
 * close. listed_regular: a directory listing reported the path as a regular file
 * (ts__open_listed_regular, no stat first); else ts__open_regular. */
ts_status ts__read_file(const char *path, bool listed_regular, uint8_t **buf, size_t *cap, size_t *n);

#endif /* TS_PIPELINE_INTERNAL_H */
