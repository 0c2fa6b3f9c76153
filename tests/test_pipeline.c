/*
 * tests/test_pipeline.c — the DALI-style pipeline: reader order against golden
 * streams DALI's own fn.readers.file produced (scripts/gen_dali_golden.py ->
 * tests/golden/dali_reader.txt), sharding invariants,
 * decoders against libjpeg's own API, corrupt/truncated/empty files, the ops,
 * and the executor (epochs, padding, reproducibility, seek, shutdown).
 * All images are made here, in a temporary folder.
 */
#include "test_util.h"

#include "pipeline/pipeline_internal.h"
#include "device/device.h"
#include "device/k_image.h"
#include "device/k_image_px.h"
#include "pipeline_epoch.h"

#include <dirent.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#ifdef TS_HAVE_LIBJPEG
#include <jpeglib.h>
#include <setjmp.h>
#endif

static char tmpdir[256];

static void rm_rf(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_rf(sub);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static const char *tpath(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *tpath(const char *fmt, ...) {
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ % 8];
    int n = snprintf(b, 1024, "%s/", tmpdir);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + n, (size_t)(1024 - n), fmt, ap);
    va_end(ap);
    return b;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static uint8_t *read_bytes(const char *path, size_t *n) {
    uint8_t *buf = NULL;
    size_t cap = 0;
    if (ts__read_file(path, false, &buf, &cap, n) != TS_OK) abort();
    return buf;
}

/* A w x h x c test picture: smooth gradients, edges and some noise (JPEG-unfriendly enough to matter). */
static void make_picture(ts_image *im, int w, int h, int c, uint32_t seed) {
    if (ts_image_alloc(im, w, h, c) != TS_OK) abort();
    uint32_t s = seed * 2654435761u + 1;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++) {
                s = s * 1664525u + 1013904223u;
                int v = x * 200 / w + k * 20 + y * 30 / h + ((x / 9 + y / 7) % 2) * 16;
                v += (int)(s >> 29) - 4;
                im->data[((size_t)y * w + x) * c + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
}

/* ---- std random streams --------------------------------------------------------------------------- */
static void test_std_engines(void) {
    /* [rand.predef]: the 10000th output of a default-constructed engine */
    ts__mt19937 g;
    ts__mt19937_seed(&g, 5489u);
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++) v = ts__mt19937_next(&g);
    CHECK(v == 4123659995u);
    ts__mt19937_64 g64;
    ts__mt19937_64_seed(&g64, 5489u);
    uint64_t v64 = 0;
    for (int i = 0; i < 10000; i++) v64 = ts__mt19937_64_next(&g64);
    CHECK(v64 == 9981545732273789042ull);
    ts__minstd m = {1};
    int last = 0;
    for (int i = 0; i < 10000; i++) last = (int)((m.x = m.x * 16807u % 2147483647u));
    CHECK(last == 1043618065);
    /* uniform picks stay in range */
    ts__minstd_seed_seq(&m, 42);
    for (int i = 0; i < 1000; i++) {
        int r = ts__minstd_uniform_int(&m, 0, i % 7);
        CHECK(r >= 0 && r <= i % 7);
    }
}

static void test_shard_start(void) {
    for (int64_t n = 1; n <= 300; n++)
        for (int64_t s = 1; s <= 17 && s <= n; s++) {
            CHECK(ts_shard_start(0, s, n) == 0 && ts_shard_start(s, s, n) == n);
            for (int64_t i = 0; i < s; i++) {
                int64_t a = ts_shard_start(i, s, n), b = ts_shard_start(i + 1, s, n);
                CHECK(a == (n * i) / s); /* floor(N i / S) */
                CHECK(b - a == n / s || b - a == n / s + 1);
            }
        }
    CHECK(ts_shard_start(3, 7, 1281167) == 549071); /* ImageNet's train set, 7 shards */
}

/* A file list of n entries "f<i>.png <i % 5>" (the reader never opens them). */
static const char *write_list(int64_t n) {
    const char *path = tpath("list_%lld.txt", (long long)n);
    FILE *f = fopen(path, "w");
    for (int64_t i = 0; i < n; i++) fprintf(f, "f%lld.png %lld\n", (long long)i, (long long)(i % 5));
    fclose(f);
    return path;
}

static void test_reader_golden(void) {
    const char *gpath = TS_TEST_DIR "/golden/dali_reader.txt";
    FILE *f = fopen(gpath, "r");
    CHECK(f != NULL);
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    int lines = 0, bad_lines = 0;
    int64_t compared = 0;
    while (getline(&line, &cap, f) > 0) {
        long long n, seed;
        int S, shard, B, stick, pad, shuffle, fill, sae, count, off = 0;
        if (sscanf(line, "%lld %d %d %d %d %d %d %d %d %lld %d :%n", &n, &S, &shard, &B, &stick, &pad, &shuffle, &fill,
                   &sae, &seed, &count, &off) != 11)
            continue;
        lines++;
        ts_reader_opts o = TS_READER_OPTS_INIT;
        o.file_list = write_list(n);
        o.num_shards = S;
        o.shard_id = shard;
        o.batch_size = B;
        o.stick_to_shard = stick && !sae;
        o.pad_last_batch = pad;
        o.random_shuffle = shuffle;
        o.initial_fill = fill;
        o.shuffle_after_epoch = sae;
        if (sae)
            o.shuffle_after_epoch_seed = seed; /* the seed column is shuffle_after_epoch_seed there */
        else
            o.seed = seed;
        ts_reader *r = NULL;
        CHECK_OK(ts_reader_new(&o, &r));
        if (!r) continue;
        const char *p = line + off;
        bool ok = true;
        int64_t epoch = 0;
        for (int i = 0; i < count && ok; i++) {
            char *end;
            long long want = strtoll(p, &end, 10);
            bool want_end = *end == '|';
            p = end + want_end;
            ts_reader_sample s;
            ts_reader_next(r, i % B == 0, i % B == B - 1, &s);
            ok = s.index == want && s.epoch_end == want_end && s.epoch == epoch && s.label == want % 5;
            if (s.epoch_end) epoch++;
            compared++;
        }
        if (!ok) {
            if (++bad_lines <= 5) fprintf(stderr, "golden mismatch: %.120s\n", line);
            tu_failures++;
        }
        /* reset gives the same stream again */
        ts_reader_reset(r);
        ts_reader_sample s0;
        long long first = strtoll(line + off, NULL, 10);
        ts_reader_next(r, true, B == 1, &s0);
        CHECK(s0.index == first);
        ts_reader_free(r);
        if (n > 1000) unlink(o.file_list);
    }
    free(line);
    fclose(f);
    CHECK(lines > 2000);
    CHECK(bad_lines == 0);
    fprintf(stderr, "  %d golden streams, %lld samples compared\n", lines, (long long)compared);
}

/* Every sample exactly once per epoch across the shards, without padding. */
static void test_every_sample_once(void) {
    const int64_t Ns[] = {1, 5, 13, 64, 101};
    for (size_t a = 0; a < TS_ARRAY_LEN(Ns); a++)
        for (int S = 1; S <= 5 && S <= Ns[a]; S++)
            for (int mode = 0; mode < 4; mode++) { /* plain, stick, random_shuffle, shuffle_after_epoch */
                int64_t n = Ns[a];
                int *seen = calloc((size_t)n, sizeof *seen);
                ts_reader *rs[5] = {0};
                for (int sh = 0; sh < S; sh++) {
                    ts_reader_opts o = TS_READER_OPTS_INIT;
                    o.file_list = write_list(n);
                    o.num_shards = S;
                    o.shard_id = sh;
                    o.batch_size = 4;
                    o.stick_to_shard = mode == 1;
                    o.random_shuffle = mode == 2;
                    o.initial_fill = 7;
                    o.shuffle_after_epoch = mode == 3;
                    o.seed = 100 + sh; /* shards may have different buffer seeds */
                    CHECK_OK(ts_reader_new(&o, &rs[sh]));
                }
                for (int epoch = 0; epoch < S + 2; epoch++) {
                    memset(seen, 0, sizeof *seen * (size_t)n);
                    for (int sh = 0; sh < S; sh++) {
                        if (!rs[sh]) continue;
                        ts_reader_sample s;
                        int64_t got = 0;
                        do {
                            ts_reader_next(rs[sh], got % 4 == 0, got % 4 == 3, &s);
                            CHECK(s.epoch == epoch && !s.pad);
                            seen[s.index]++;
                            got++;
                        } while (!s.epoch_end);
                        CHECK(got == ts_reader_shard_size(rs[sh], epoch));
                    }
                    int64_t once = 0;
                    for (int64_t i = 0; i < n; i++) once += seen[i] == 1;
                    if (mode != 1) CHECK(once == n); /* stick_to_shard: each shard keeps its own part */
                }
                for (int sh = 0; sh < S; sh++) ts_reader_free(rs[sh]);
                free(seen);
            }
}

static void test_reader_errors(void) {
    ts_reader *r = NULL;
    ts_reader_opts o = TS_READER_OPTS_INIT;
    o.file_list = write_list(3);
    o.num_shards = 4;
    o.shard_id = 0;
    CHECK_STATUS(ts_reader_new(&o, &r), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("3 samples cannot make 4 shards");
    o.num_shards = 2;
    o.shard_id = 2;
    CHECK_STATUS(ts_reader_new(&o, &r), TS_ERR_INVALID_ARG);
    o = TS_READER_OPTS_INIT;
    o.file_list = write_list(3);
    o.shuffle_after_epoch = o.stick_to_shard = true;
    CHECK_STATUS(ts_reader_new(&o, &r), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("shuffle_after_epoch and stick_to_shard");
    o = TS_READER_OPTS_INIT;
    o.file_root = tpath("no/such/dir");
    CHECK_STATUS(ts_reader_new(&o, &r), TS_ERR_IO);
    CHECK_ERR_MENTIONS("no/such/dir");
    const char *bad = tpath("bad_list.txt");
    write_bytes(bad, "a.png 1\n\nb.png 2\nc.png\n", 23);
    o = TS_READER_OPTS_INIT;
    o.file_list = bad;
    CHECK_STATUS(ts_reader_new(&o, &r), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("bad_list.txt:4");
    mkdir(tpath("emptyroot"), 0755);
    mkdir(tpath("emptyroot/cls"), 0755);
    o = TS_READER_OPTS_INIT;
    o.file_root = tpath("emptyroot");
    CHECK_STATUS(ts_reader_new(&o, &r), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("no samples");
    CHECK(r == NULL);
}

/* ---- test folders ------------------------------------------------------------------------------------- */
/* n gray 4x4 PNGs in nclass folders; every pixel of sample k (in listing order) is k % 256, plus
 * (k / 256) in pixel 0. Returns the root. */
static const char *make_index_folder(const char *name, int n, int nclass) {
    const char *root = tpath("%s", name);
    mkdir(root, 0755);
    ts_image im = TS_IMAGE_INIT;
    ts_image_alloc(&im, 4, 4, 1);
    int k = 0;
    for (int c = 0; c < nclass; c++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/class_%02d", root, c);
        mkdir(dir, 0755);
        int per = n / nclass + (c < n % nclass);
        for (int j = 0; j < per; j++, k++) {
            memset(im.data, k % 256, 16);
            im.data[0] = (uint8_t)(k / 256);
            char f[1100];
            snprintf(f, sizeof f, "%s/img_%05d.png", dir, j);
            if (ts_image_write_png(&im, f) != TS_OK) abort();
        }
    }
    ts_image_free(&im);
    return root;
}

static int64_t decoded_index(const float *x) { /* x: 1x4x4 floats in [0, 1] */
    return (int64_t)lroundf(x[0] * 255.0f) * 256 + lroundf(x[5] * 255.0f);
}

static ts_pipeline_opts index_opts(const char *root) {
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    o.reader.file_root = root;
    o.color = TS_COLOR_GRAY;
    o.out_width = o.out_height = 4;
    o.batch_size = 8;
    return o;
}

/* ---- decoders --------------------------------------------------------------------------------------- */
#ifdef TS_HAVE_LIBJPEG
typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
} ref_err;
static void ref_error_exit(j_common_ptr c) { longjmp(((ref_err *)c->err)->jb, 1); }

/* libjpeg's own decode with its defaults (islow DCT, fancy upsampling), optionally DCT-scaled. */
static uint8_t *libjpeg_decode(const uint8_t *buf, size_t n, bool gray, int denom, int *w, int *h) {
    struct jpeg_decompress_struct d;
    ref_err err;
    d.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = ref_error_exit;
    uint8_t *out = NULL;
    if (setjmp(err.jb)) {
        jpeg_destroy_decompress(&d);
        free(out);
        return NULL;
    }
    jpeg_create_decompress(&d);
    jpeg_mem_src(&d, buf, (unsigned long)n);
    jpeg_read_header(&d, TRUE);
    d.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
    d.scale_num = 1;
    d.scale_denom = (unsigned)denom;
    jpeg_start_decompress(&d);
    *w = (int)d.output_width;
    *h = (int)d.output_height;
    size_t stride = (size_t)d.output_width * (size_t)d.output_components;
    out = malloc(stride * d.output_height);
    while (d.output_scanline < d.output_height) {
        JSAMPROW row = out + stride * d.output_scanline;
        jpeg_read_scanlines(&d, &row, 1);
    }
    jpeg_finish_decompress(&d);
    jpeg_destroy_decompress(&d);
    return out;
}
#endif

static void test_decode_vs_libjpeg(void) {
#ifndef TS_HAVE_LIBJPEG
    fprintf(stderr, "  (libjpeg API not found: compared with TurboJPEG only)\n");
#endif
    const int sizes[][2] = {{97, 61}, {320, 240}, {17, 33}};
    for (size_t si = 0; si < TS_ARRAY_LEN(sizes); si++)
        for (int c = 1; c <= 3; c += 2)
            for (int q = 50; q <= 95; q += 45) {
                ts_image pic = TS_IMAGE_INIT, got = TS_IMAGE_INIT;
                make_picture(&pic, sizes[si][0], sizes[si][1], c, (uint32_t)(si * 7 + c + q));
                const char *path = tpath("pic_%zu_%d_%d.jpg", si, c, q);
                CHECK_OK(ts_image_write_jpeg(&pic, path, q));
                size_t n;
                uint8_t *buf = read_bytes(path, &n);
                for (int gray = 0; gray < 2; gray++) {
                    CHECK_OK(ts_image_read(path, gray ? TS_COLOR_GRAY : TS_COLOR_RGB, &got));
                    CHECK(got.width == pic.width && got.height == pic.height && got.channels == (gray ? 1 : 3));
                    /* close to the original: JPEG is lossy, but not that lossy */
                    if (gray == (c == 1)) {
                        double err = 0;
                        size_t m = (size_t)pic.width * pic.height * pic.channels;
                        for (size_t i = 0; i < m; i++) err += fabs((double)got.data[i] - pic.data[i]);
                        if (!(err / (double)m < (q < 90 ? 8.0 : 4.0))) fprintf(stderr, "  mean error %.2f\n", err / (double)m);
                        CHECK(err / (double)m < (q < 90 ? 8.0 : 4.0));
                    }
#ifdef TS_HAVE_LIBJPEG
                    for (int denom = 1; denom <= 8; denom *= 2) {
                        ts__decoder *d = NULL;
                        ts_image sc = TS_IMAGE_INIT;
                        CHECK_OK(ts__decoder_new(&d));
                        CHECK_OK(ts__decode(d, buf, n, gray ? TS_COLOR_GRAY : TS_COLOR_RGB, path, denom, &sc));
                        int rw = 0, rh = 0;
                        uint8_t *ref = libjpeg_decode(buf, n, gray, denom, &rw, &rh);
                        CHECK(ref != NULL && rw == sc.width && rh == sc.height);
                        if (ref && rw == sc.width && rh == sc.height)
                            CHECK(memcmp(ref, sc.data, (size_t)rw * rh * (gray ? 1 : 3)) == 0);
                        free(ref);
                        ts_image_free(&sc);
                        ts__decoder_free(d);
                    }
#endif
                }
                free(buf);
                ts_image_free(&pic);
                ts_image_free(&got);
            }
}

/* Window decoding gives libjpeg's pixels of the window: equal to the same region of a whole decode
 * (at the same DCT scale). */
static void test_decode_window(void) {
    ts_image pic = TS_IMAGE_INIT, full = TS_IMAGE_INIT, part = TS_IMAGE_INIT;
    ts__decoder *d = NULL;
    CHECK_OK(ts__decoder_new(&d));
    ts_rng r;
    ts_rng_seed(&r, 3);
    for (int t = 0; t < 24; t++) {
        int w = 40 + (int)ts_rng_below(&r, 300), h = 30 + (int)ts_rng_below(&r, 200), c = t % 5 ? 3 : 1;
        make_picture(&pic, w, h, c, (uint32_t)t);
        if (t % 2) /* colours that change from pixel to pixel: chroma upsampling reads the neighbours */
            for (size_t k = 0; k < (size_t)w * h * c; k++) pic.data[k] = (uint8_t)(pic.data[k] * 7 + (k % 3) * 85 + k / 5);
        const char *path = tpath("win_%d.jpg", t);
        CHECK_OK(ts_image_write_jpeg(&pic, path, 80));
        size_t n;
        uint8_t *buf = read_bytes(path, &n);
        ts_color col = t % 2 ? TS_COLOR_RGB : TS_COLOR_GRAY;
        int denom = 1 << (t % 3);
        CHECK_OK(ts__decode(d, buf, n, col, path, denom, &full));
        ts_roi win = {(int)ts_rng_below(&r, (uint64_t)w / 2), (int)ts_rng_below(&r, (uint64_t)h / 2), 0, 0}, roi;
        win.w = 1 + (int)ts_rng_below(&r, (uint64_t)(w - win.x));
        win.h = 1 + (int)ts_rng_below(&r, (uint64_t)(h - win.y));
        CHECK_OK(ts__decode_window(d, buf, n, col, path, denom, &win, &part, &roi));
        CHECK(roi.x >= 0 && roi.x + roi.w <= part.width && roi.h == part.height && roi.w >= 1);
        /* the window's pixels (roi in part) equal the same pixels of the whole image */
        int fx = win.x / denom, fy = win.y / denom;
        bool same = true;
        for (int y = 0; y < roi.h; y++)
            same &= memcmp(part.data + ((size_t)y * part.width + roi.x) * col,
                           full.data + ((size_t)(fy + y) * full.width + fx) * col, (size_t)roi.w * col) == 0;
        if (!same)
            fprintf(stderr, "window (%d, %d) %d x %d of %s (%d x %d, %d channels, 1/%d) differs from the whole decode\n",
                    win.x, win.y, win.w, win.h, path, w, h, (int)col, denom);
        CHECK(same);
        free(buf);
    }
    ts__decoder_free(d);
    ts_image_free(&pic);
    ts_image_free(&full);
    ts_image_free(&part);
}

static void test_png_roundtrip(void) {
    for (int c = 1; c <= 3; c += 2) {
        ts_image pic = TS_IMAGE_INIT, got = TS_IMAGE_INIT;
        make_picture(&pic, 37, 23, c, (uint32_t)c);
        const char *path = tpath("round_%d.png", c);
        CHECK_OK(ts_image_write_png(&pic, path));
        CHECK_OK(ts_image_read(path, c == 3 ? TS_COLOR_RGB : TS_COLOR_GRAY, &got));
        CHECK(got.width == 37 && got.height == 23 && got.channels == c);
        CHECK(memcmp(got.data, pic.data, (size_t)37 * 23 * c) == 0);
        /* the other channel count */
        CHECK_OK(ts_image_read(path, c == 3 ? TS_COLOR_GRAY : TS_COLOR_RGB, &got));
        bool ok = true;
        for (int i = 0; i < 37 * 23; i++) {
            if (c == 1) {
                ok &= got.data[3 * i] == pic.data[i] && got.data[3 * i + 2] == pic.data[i];
            } else {
                const uint8_t *p = pic.data + 3 * i;
                int y = (int)((19595u * p[0] + 38470u * p[1] + 7471u * p[2] + 32768u) >> 16);
                ok &= got.data[i] == y;
            }
        }
        CHECK(ok);
        ts_image_free(&pic);
        ts_image_free(&got);
    }
}

static void test_corrupt_files(void) {
    ts_image pic = TS_IMAGE_INIT, got = TS_IMAGE_INIT;
    make_picture(&pic, 64, 48, 3, 9);
    const char *jpg = tpath("good.jpg"), *png = tpath("good.png");
    CHECK_OK(ts_image_write_jpeg(&pic, jpg, 90));
    CHECK_OK(ts_image_write_png(&pic, png));
    size_t nj, np;
    uint8_t *bj = read_bytes(jpg, &nj), *bp = read_bytes(png, &np);
    struct {
        const char *name;
        const void *data;
        size_t n;
        const char *needle;
    } cases[] = {
        {"empty.jpg", "", 0, "empty file"},
        {"trunc_half.jpg", bj, nj / 2, "Premature end"},
        {"trunc_header.jpg", bj, 40, "JPEG"},
        {"trunc.png", bp, np / 2, "corrupt PNG"},
        {"trunc_sig.png", bp, 12, "corrupt PNG"},
        {"text.jpg", "hello, world\n", 13, "not a JPEG or PNG"},
    };
    for (size_t i = 0; i < TS_ARRAY_LEN(cases); i++) {
        const char *path = tpath("%s", cases[i].name);
        write_bytes(path, cases[i].data, cases[i].n);
        CHECK_STATUS(ts_image_read(path, TS_COLOR_RGB, &got), TS_ERR_FORMAT);
        CHECK_ERR_MENTIONS(cases[i].name);
        CHECK_ERR_MENTIONS(cases[i].needle);
    }
    /* a flipped byte in the JPEG header (the frame's dimensions) and in a PNG's IDAT (CRC) */
    uint8_t *cj = malloc(nj), *cp = malloc(np);
    memcpy(cj, bj, nj);
    memcpy(cp, bp, np);
    for (size_t i = 2; i + 9 < nj; i++)
        if (cj[i] == 0xff && cj[i + 1] == 0xc0) { /* SOF0: precision 8 -> 0 */
            cj[i + 4] = 0;
            break;
        }
    for (size_t i = 8; i + 4 < np; i++)
        if (!memcmp(cp + i, "IDAT", 4)) {
            cp[i + 10] ^= 0x5a;
            break;
        }
    write_bytes(tpath("badsof.jpg"), cj, nj);
    write_bytes(tpath("badcrc.png"), cp, np);
    CHECK_STATUS(ts_image_read(tpath("badsof.jpg"), TS_COLOR_RGB, &got), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("badsof.jpg");
    CHECK_STATUS(ts_image_read(tpath("badcrc.png"), TS_COLOR_RGB, &got), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("badcrc.png");
    CHECK_STATUS(ts_image_read(tpath("missing.jpg"), TS_COLOR_RGB, &got), TS_ERR_IO);
    CHECK_ERR_MENTIONS("missing.jpg");
    mkdir(tpath("adir.jpg"), 0755);
    CHECK_STATUS(ts_image_read(tpath("adir.jpg"), TS_COLOR_RGB, &got), TS_ERR_IO);
    /* random garbage after a JPEG signature never crashes */
    ts_rng r;
    ts_rng_seed(&r, 5);
    for (int t = 0; t < 200; t++) {
        size_t n = 3 + ts_rng_below(&r, 2000);
        uint8_t *g = malloc(n);
        memcpy(g, bj, n < nj ? n : nj);
        for (int k = 0; k < 1 + t % 20; k++) g[3 + ts_rng_below(&r, n - 3)] = (uint8_t)ts_rng_u32(&r);
        ts_status st = ts_image_decode(g, n, TS_COLOR_RGB, "fuzz.jpg", &got);
        CHECK(st == TS_OK || st == TS_ERR_FORMAT);
        free(g);
    }
    free(cj);
    free(cp);
    free(bj);
    free(bp);
    ts_image_free(&pic);
    ts_image_free(&got);
}

/* ---- ops --------------------------------------------------------------------------------------------- */
static void test_ops(void) {
    ts_image a = TS_IMAGE_INIT, b = TS_IMAGE_INIT;
    make_picture(&a, 30, 20, 3, 1);
    /* identity resize is exact */
    CHECK_OK(ts_image_resize(&a, 30, 20, &b));
    CHECK(memcmp(a.data, b.data, 30 * 20 * 3) == 0);
    /* 2x2 -> 4x4: half-pixel bilinear, edges clamped */
    ts_image s = TS_IMAGE_INIT;
    ts_image_alloc(&s, 2, 2, 1);
    s.data[0] = 0;
    s.data[1] = 100;
    s.data[2] = 200;
    s.data[3] = 40;
    CHECK_OK(ts_image_resize(&s, 4, 4, &b));
    const uint8_t want[16] = {0, 25, 75, 100, 50, 59, 76, 85, 150, 126, 79, 55, 200, 160, 80, 40};
    bool ok = true;
    for (int i = 0; i < 16; i++) ok &= abs((int)b.data[i] - want[i]) <= 1;
    CHECK(ok);
    /* shrinking a 1-pixel checkerboard by 2 averages it (antialiasing) */
    ts_image_alloc(&s, 16, 16, 1);
    for (int i = 0; i < 256; i++) s.data[i] = (uint8_t)(((i % 16) + (i / 16)) % 2 ? 255 : 0);
    CHECK_OK(ts_image_resize(&s, 8, 8, &b));
    ok = true;
    for (int i = 0; i < 64; i++) ok &= abs((int)b.data[i] - 128) <= 40;
    CHECK(ok);
    /* crop_mirror_normalize: exact copy of the window, mirrored, normalised, CHW */
    float out[3 * 5 * 4];
    const float mean[3] = {10, 20, 30}, std[3] = {2, 4, 8};
    CHECK_OK(ts_image_crop_mirror_normalize(&a, 3, 2, 4, 5, true, mean, std, out));
    ok = true;
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 5; y++)
            for (int x = 0; x < 4; x++) {
                float v = a.data[((size_t)(2 + y) * 30 + (3 + 3 - x)) * 3 + c];
                ok &= fabsf(out[(c * 5 + y) * 4 + x] - (v - mean[c]) / std[c]) < 1e-4f;
            }
    CHECK(ok);
    ts_roi bad = {25, 0, 10, 10};
    CHECK_STATUS(ts_image_crop_resize_normalize(&a, &bad, 4, 4, false, mean, std, out), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("not inside");
    /* flip twice = identity; flip moves pixels */
    ts_image c = TS_IMAGE_INIT;
    ts_image_alloc(&c, 30, 20, 3);
    memcpy(c.data, a.data, 30 * 20 * 3);
    ts_image_flip(&c, true, false);
    CHECK(c.data[0] == a.data[29 * 3] && c.data[2] == a.data[29 * 3 + 2]);
    ts_image_flip(&c, true, true);
    CHECK(c.data[0] == a.data[19 * 30 * 3]);
    ts_image_flip(&c, false, true);
    CHECK(memcmp(c.data, a.data, 30 * 20 * 3) == 0);
    /* random resized crop windows: inside, reproducible, area in range unless the fallback */
    ts_rng r1, r2;
    ts_rng_seed(&r1, 7);
    ts_rng_seed(&r2, 7);
    const float sc[2] = {0.08f, 1.0f}, ra[2] = {0.75f, 4.0f / 3.0f};
    ok = true;
    for (int i = 0; i < 2000; i++) {
        int w = 1 + (int)ts_rng_below(&r1, 500), h = 1 + (int)ts_rng_below(&r1, 500);
        (void)ts_rng_below(&r2, 500);
        (void)ts_rng_below(&r2, 500);
        ts_roi q = ts_random_resized_crop_roi(&r1, w, h, sc, ra), q2 = ts_random_resized_crop_roi(&r2, w, h, sc, ra);
        ok &= q.x == q2.x && q.y == q2.y && q.w == q2.w && q.h == q2.h;
        ok &= q.x >= 0 && q.y >= 0 && q.w >= 1 && q.h >= 1 && q.x + q.w <= w && q.y + q.h <= h;
    }
    CHECK(ok);
    ts_image_free(&a);
    ts_image_free(&b);
    ts_image_free(&c);
    ts_image_free(&s);
}

/* ---- executor ------------------------------------------------------------------------------------------ */
/* Across S pipelines (shards) one epoch delivers every sample exactly once; batches never mix epochs. */
static void test_pipeline_shards(void) {
    const char *root = make_index_folder("idx41", 41, 3);
    for (int S = 1; S <= 4; S++) {
        int seen[41] = {0};
        for (int sh = 0; sh < S; sh++) {
            ts_pipeline_opts o = index_opts(root);
            o.reader.num_shards = S;
            o.reader.shard_id = sh;
            o.reader.random_shuffle = true;
            o.reader.initial_fill = 5;
            o.num_threads = 1 + sh % 3;
            ts_pipeline *p = NULL;
            CHECK_OK(ts_pipeline_new(&o, &p));
            if (!p) continue;
            int64_t nb = ts_pipeline_num_batches(p, 1), got = 0, batches = 0;
            for (int epoch = 0; epoch < 2; epoch++) {
                for (;;) {
                    ts_tensor *x, *y;
                    ts_batch_info bi;
                    CHECK_OK(ts_pipeline_next(p, &x, &y, &bi));
                    if (!x) {
                        CHECK(bi.epoch_end && bi.epoch == epoch);
                        break;
                    }
                    CHECK(bi.epoch == epoch && bi.size == ts_tensor_dim(x, 0) && bi.real == bi.size);
                    CHECK(ts_tensor_dim(x, 1) == 1 && ts_tensor_dim(x, 2) == 4 && ts_tensor_dim(x, 3) == 4);
                    const float *px = ts_tensor_data_f32(x);
                    const int64_t *py = ts_tensor_data(y);
                    for (int64_t i = 0; i < bi.size; i++) {
                        int64_t k = decoded_index(px + i * 16);
                        CHECK(k >= 0 && k < 41);
                        if (k < 0 || k >= 41) continue;
                        CHECK(py[i] == (k < 14 ? 0 : k < 28 ? 1 : 2)); /* 14, 14, 13 per class folder */
                        if (epoch == 1) {
                            seen[k]++;
                            got++;
                        }
                    }
                    if (epoch == 1) batches++;
                }
            }
            CHECK(batches == nb);
            CHECK(got == ts_reader_shard_size(ts_pipeline_reader(p), 1));
            ts_pipeline_free(p);
        }
        int once = 0;
        for (int k = 0; k < 41; k++) once += seen[k] == 1;
        CHECK(once == 41);
    }
}

/* pad_last_batch: every shard has the same number of full batches; `real` counts the unpadded rows. */
static void test_pipeline_padding(void) {
    const char *root = make_index_folder("idx23", 23, 2);
    int64_t nb[3] = {0}, real_total = 0;
    for (int sh = 0; sh < 3; sh++) {
        ts_pipeline_opts o = index_opts(root);
        o.batch_size = 4;
        o.reader.num_shards = 3;
        o.reader.shard_id = sh;
        o.reader.pad_last_batch = true;
        ts_pipeline *p = NULL;
        CHECK_OK(ts_pipeline_new(&o, &p));
        if (!p) return;
        int64_t last_real = -1;
        for (;;) {
            ts_tensor *x, *y;
            ts_batch_info bi;
            CHECK_OK(ts_pipeline_next(p, &x, &y, &bi));
            if (!x) break;
            nb[sh]++;
            CHECK(bi.size == 4);
            real_total += bi.real;
            if (bi.real < bi.size) { /* the padding repeats the last real sample */
                const float *px = ts_tensor_data_f32(x);
                for (int64_t i = bi.real > 0 ? bi.real : 1; i < bi.size; i++)
                    CHECK(decoded_index(px + i * 16) == decoded_index(px + (i - 1) * 16));
            }
            last_real = bi.last ? bi.real : last_real;
        }
        CHECK(nb[sh] == ts_pipeline_num_batches(p, 0));
        CHECK(last_real >= 0);
        ts_pipeline_free(p);
    }
    CHECK(nb[0] == 2 && nb[1] == 2 && nb[2] == 2); /* ceil(ceil(23 / 3) / 4) */
    CHECK(real_total == 23);
}

static bool same_batches(ts_pipeline *a, ts_pipeline *b, int nbatches) {
    bool same = true;
    for (int i = 0; i < nbatches; i++) {
        ts_tensor *xa, *ya, *xb, *yb;
        ts_batch_info ia, ib;
        if (ts_pipeline_next(a, &xa, &ya, &ia) != TS_OK || ts_pipeline_next(b, &xb, &yb, &ib) != TS_OK) return false;
        if (!xa || !xb) {
            same &= !xa && !xb;
            continue;
        }
        same &= ia.epoch == ib.epoch && ia.batch == ib.batch && ia.size == ib.size;
        same &= ts_tensor_numel(xa) == ts_tensor_numel(xb) &&
                memcmp(ts_tensor_data(xa), ts_tensor_data(xb), ts_tensor_nbytes(xa)) == 0 &&
                memcmp(ts_tensor_data(ya), ts_tensor_data(yb), ts_tensor_nbytes(ya)) == 0;
    }
    return same;
}

/* Seeds make runs reproducible regardless of threads and prefetch depth; seek lands on the same batch. */
static void test_pipeline_reproducible(void) {
    const char *root = tpath("photos");
    mkdir(root, 0755);
    for (int c = 0; c < 2; c++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/cls%d", root, c);
        mkdir(dir, 0755);
        for (int i = 0; i < 9; i++) {
            ts_image pic = TS_IMAGE_INIT;
            make_picture(&pic, 40 + 7 * i, 30 + 5 * c, 3, (uint32_t)(c * 10 + i));
            char f[1100];
            snprintf(f, sizeof f, "%s/p%d.%s", dir, i, i % 2 ? "png" : "jpg");
            CHECK_OK(i % 2 ? ts_image_write_png(&pic, f) : ts_image_write_jpeg(&pic, f, 85));
            ts_image_free(&pic);
        }
    }
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    o.reader.file_root = root;
    o.reader.random_shuffle = true;
    o.reader.initial_fill = 6;
    o.reader.seed = 1234;
    o.batch_size = 4;
    o.out_width = 16;
    o.out_height = 12;
    o.random_resized_crop = true;
    o.flip_prob = 0.5f;
    o.mean[0] = 120;
    o.std[0] = 60;
    ts_pipeline_opts o2 = o;
    o2.num_threads = 3;
    o2.prefetch_queue_depth = 1;
    ts_pipeline *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(ts_pipeline_new(&o, &a));
    CHECK_OK(ts_pipeline_new(&o2, &b));
    o2.reader.seed = 99;
    CHECK_OK(ts_pipeline_new(&o2, &c));
    if (!a || !b || !c) return;
    CHECK(same_batches(a, b, 17)); /* 3 epochs of 5 batches + their 2 ends, and one more */
    CHECK(!same_batches(a, c, 3));
    /* seek: batch 2 of epoch 1 equals what an uninterrupted run gives there */
    ts_pipeline_free(b);
    o2.reader.seed = 1234;
    CHECK_OK(ts_pipeline_new(&o2, &b));
    CHECK_OK(ts_pipeline_seek(a, 1, 2));
    for (int i = 0; i < 6 + 2; i++) {
        ts_tensor *x, *y;
        CHECK_OK(ts_pipeline_next(b, &x, &y, NULL));
    }
    CHECK(ts_pipeline_epoch(a) == 1 && ts_pipeline_batch_index(a) == 2);
    CHECK(same_batches(a, b, 8));
    /* seek to the end of an epoch: the next call reports it */
    CHECK_OK(ts_pipeline_seek(a, 0, ts_pipeline_num_batches(a, 0)));
    ts_tensor *x, *y;
    ts_batch_info bi;
    CHECK_OK(ts_pipeline_next(a, &x, &y, &bi));
    CHECK(!x && bi.epoch_end && bi.epoch == 0);
    CHECK_OK(ts_pipeline_next(a, &x, &y, &bi));
    CHECK(x && bi.epoch == 1 && bi.batch == 0);
    CHECK_STATUS(ts_pipeline_seek(a, 0, 99), TS_ERR_INVALID_ARG);
    ts_pipeline_free(a);
    ts_pipeline_free(b);
    ts_pipeline_free(c);
}

/* last_batch: partial, drop (a short last batch is left out, the epoch ends without it), fill (pad_last_batch). */
static void test_pipeline_last_batch(void) {
    const char *root = make_index_folder("idx23lb", 23, 2);
    const int64_t want_batches[3] = {6, 5, 6}, want_last[3] = {3, 4, 4}, want_real[3] = {23, 20, 23};
    for (int mode = 0; mode < 3; mode++) {
        ts_pipeline_opts o = index_opts(root);
        o.batch_size = 4;
        o.last_batch = (ts_last_batch)mode;
        ts_pipeline *p = NULL;
        CHECK_OK(ts_pipeline_new(&o, &p));
        if (!p) return;
        CHECK(ts_pipeline_num_batches(p, 0) == want_batches[mode]);
        for (int epoch = 0; epoch < 2; epoch++) {
            int64_t nb = 0, real = 0, last_size = 0, next_index = 0;
            for (;;) {
                ts_tensor *x, *y;
                ts_batch_info bi;
                CHECK_OK(ts_pipeline_next(p, &x, &y, &bi));
                if (!x) {
                    CHECK(bi.epoch_end && bi.epoch == epoch && bi.batch == want_batches[mode]);
                    break;
                }
                CHECK(bi.epoch == epoch && bi.batch == nb);
                const float *px = ts_tensor_data_f32(x);
                for (int64_t i = 0; i < bi.real; i++) CHECK(decoded_index(px + i * 16) == next_index++);
                nb++;
                real += bi.real;
                last_size = bi.size;
                CHECK(bi.last == (nb == want_batches[mode]));
            }
            CHECK(nb == want_batches[mode] && real == want_real[mode] && last_size == want_last[mode]);
        }
        /* a seek to the end of epoch 0 (after its 5 whole batches when dropping): the end comes next */
        CHECK_OK(ts_pipeline_seek(p, 0, want_batches[mode]));
        ts_tensor *x, *y;
        ts_batch_info bi;
        CHECK_OK(ts_pipeline_next(p, &x, &y, &bi));
        CHECK(!x && bi.epoch_end && bi.epoch == 0);
        CHECK_OK(ts_pipeline_next(p, &x, &y, &bi));
        CHECK(x && bi.epoch == 1 && bi.batch == 0 && decoded_index(ts_tensor_data_f32(x)) == 0);
        ts_pipeline_free(p);
    }
    /* an epoch without a whole batch: nothing but its end */
    ts_pipeline_opts o = index_opts(make_index_folder("idx3lb", 3, 1));
    o.batch_size = 4;
    o.last_batch = TS_LAST_BATCH_DROP;
    ts_pipeline *p = NULL;
    CHECK_OK(ts_pipeline_new(&o, &p));
    for (int e = 0; p && e < 3; e++) {
        ts_tensor *x, *y;
        ts_batch_info bi;
        CHECK_OK(ts_pipeline_next(p, &x, &y, &bi));
        CHECK(!x && bi.epoch_end && bi.epoch == e && bi.batch == 0);
    }
    ts_pipeline_free(p);
    p = NULL;
    o = index_opts(root);
    o.last_batch = (ts_last_batch)7;
    CHECK_STATUS(ts_pipeline_new(&o, &p), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("last_batch 7");
    ts_pipeline_free(p);
}

/* Option names: each parser takes its names and names the choices when given another. */
static void test_option_names(void) {
    ts_shuffle sh;
    ts_last_batch lb;
    ts_color c;
    ts_decode_device d;
    const char *shn[] = {"none", "buffer", "epoch"}, *lbn[] = {"partial", "drop", "fill"};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(ts_shuffle_parse(shn[i], &sh));
        CHECK((int)sh == i && !strcmp(ts_shuffle_name(sh), shn[i]));
        CHECK_OK(ts_last_batch_parse(lbn[i], &lb));
        CHECK((int)lb == i && !strcmp(ts_last_batch_name(lb), lbn[i]));
    }
    CHECK_OK(ts_color_parse("gray", &c));
    CHECK(c == TS_COLOR_GRAY && !strcmp(ts_color_name(c), "gray"));
    CHECK_OK(ts_color_parse("rgb", &c));
    CHECK(c == TS_COLOR_RGB && !ts_color_name((ts_color)2));
    CHECK_OK(ts_decode_device_parse("mixed", &d));
    CHECK(d == TS_DECODE_MIXED && !strcmp(ts_decode_device_name(d), "mixed"));
    CHECK_STATUS(ts_shuffle_parse("yes", &sh), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("shuffle 'yes': expected none, buffer or epoch");
    CHECK_STATUS(ts_last_batch_parse(NULL, &lb), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("expected partial, drop or fill");
    CHECK_STATUS(ts_color_parse("RGB", &c), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("color 'RGB': expected gray or rgb");
    CHECK(!ts_shuffle_name((ts_shuffle)3) && !ts_last_batch_name((ts_last_batch)-1));
    ts_reader_opts ro = TS_READER_OPTS_INIT;
    ts_reader_opts_set_shuffle(&ro, TS_SHUFFLE_EPOCH);
    CHECK(ro.shuffle_after_epoch && !ro.random_shuffle);
    ts_reader_opts_set_shuffle(&ro, TS_SHUFFLE_BUFFER);
    CHECK(!ro.shuffle_after_epoch && ro.random_shuffle);
    ts_reader_opts_set_shuffle(&ro, TS_SHUFFLE_NONE);
    CHECK(!ro.shuffle_after_epoch && !ro.random_shuffle);
}

/* Batches the caller keeps (a retained handle, a view) are never written again; ts_pipeline_wait. */
static void test_pipeline_kept_batches(void) {
    const char *root = make_index_folder("idx37", 37, 3);
    ts_pipeline_opts o = index_opts(root);
    o.batch_size = 4;
    o.prefetch_queue_depth = 1;
    ts_pipeline *p = NULL;
    CHECK_OK(ts_pipeline_new(&o, &p));
    if (!p) return;
    bool ready = false;
    CHECK_OK(ts_pipeline_wait(p, 60, &ready));
    CHECK(ready);
    enum { KEEP = 12 };
    ts_tensor *kx[KEEP] = {0}, *ky[KEEP] = {0};
    int64_t first[KEEP], n[KEEP];
    for (int b = 0; b < KEEP; b++) { /* 10 batches, an epoch end, the next epoch's first */
        ts_tensor *x, *y;
        ts_batch_info bi;
        CHECK_OK(ts_pipeline_next(p, &x, &y, &bi));
        if (!x) {
            CHECK(bi.epoch_end);
            continue;
        }
        if (b % 2) {
            kx[b] = ts_tensor_retain(x);
            ky[b] = ts_tensor_retain(y);
        } else {
            CHECK_OK(ts_tensor_detach(x, &kx[b])); /* a view of the same memory */
            CHECK_OK(ts_tensor_detach(y, &ky[b]));
        }
        first[b] = decoded_index(ts_tensor_data_f32(x));
        n[b] = bi.size;
    }
    for (int b = 0; b < KEEP; b++) {
        if (!kx[b]) continue;
        const float *px = ts_tensor_data_f32(kx[b]);
        const int64_t *py = ts_tensor_data(ky[b]);
        for (int64_t i = 0; i < n[b]; i++) {
            int64_t k = decoded_index(px + i * 16);
            CHECK(k == first[b] + i);
            CHECK(py[i] == (k < 13 ? 0 : k < 25 ? 1 : 2));
        }
        ts_tensor_release(kx[b]);
        ts_tensor_release(ky[b]);
    }
    CHECK_OK(ts_pipeline_seek(p, 0, 9)); /* the last batch (1 sample), then the end: wait says so */
    ts_tensor *x, *y;
    CHECK_OK(ts_pipeline_next(p, &x, &y, NULL));
    CHECK(x && ts_tensor_shape(x)[0] == 1);
    CHECK_OK(ts_pipeline_wait(p, 0, &ready));
    CHECK(ready);
    CHECK_STATUS(ts_pipeline_wait(p, -1, &ready), TS_ERR_INVALID_ARG);
    ts_pipeline_free(p);
}

/* A corrupt file: an error naming it when its batch is reached, or skipped and counted. */
static void test_pipeline_corrupt(void) {
    const char *root = make_index_folder("corrupt", 20, 2);
    write_bytes(tpath("corrupt/class_01/img_00004.png"), "\x89PNG\r\n\x1a\n garbage", 17);
    for (int skip = 0; skip < 2; skip++) {
        ts_pipeline_opts o = index_opts(root);
        o.skip_corrupt = skip;
        o.num_threads = 2;
        ts_pipeline *p = NULL;
        CHECK_OK(ts_pipeline_new(&o, &p));
        if (!p) return;
        ts_status st = TS_OK;
        int64_t total = 0, skipped = 0;
        for (;;) {
            ts_tensor *x, *y;
            ts_batch_info bi;
            if ((st = ts_pipeline_next(p, &x, &y, &bi)) != TS_OK || !x) break;
            total += bi.size;
            skipped += bi.skipped;
        }
        if (skip) {
            CHECK(st == TS_OK && total == 19 && skipped == 1);
            int64_t dec = 0, sk = 0;
            ts_pipeline_counts(p, &dec, &sk);
            CHECK(sk >= 1 && dec + sk >= 20); /* later epochs may be prefetched (and skipped) already */
        } else {
            CHECK(st == TS_ERR_FORMAT);
            CHECK_ERR_MENTIONS("class_01/img_00004.png");
            ts_tensor *x, *y;
            CHECK_STATUS(ts_pipeline_next(p, &x, &y, NULL), TS_ERR_FORMAT); /* sticky */
        }
        ts_pipeline_free(p);
    }
}

/* Freeing in the middle of an epoch stops the workers cleanly. */
static void test_pipeline_shutdown(void) {
    const char *root = make_index_folder("idx300", 300, 4);
    for (int t = 0; t < 20; t++) {
        ts_pipeline_opts o = index_opts(root);
        o.num_threads = 1 + t % 4;
        o.prefetch_queue_depth = 1 + t % 3;
        ts_pipeline *p = NULL;
        CHECK_OK(ts_pipeline_new(&o, &p));
        for (int i = 0; i < t % 4; i++) {
            ts_tensor *x, *y;
            CHECK_OK(ts_pipeline_next(p, &x, &y, NULL));
        }
        ts_pipeline_free(p);
    }
}

/* The IDX reader behind the same interface, RGB output, an explicit device, the in-memory dataset. */
static void test_pipeline_idx(void) {
    const char *dir = tpath("idx");
    mkdir(dir, 0755);
    const int n = 11, h = 6, w = 5;
    uint8_t img[16 + 11 * 30], lab[8 + 11];
    const uint8_t ih[16] = {0, 0, 8, 3, 0, 0, 0, (uint8_t)n, 0, 0, 0, (uint8_t)h, 0, 0, 0, (uint8_t)w};
    const uint8_t lh[8] = {0, 0, 8, 1, 0, 0, 0, (uint8_t)n};
    memcpy(img, ih, 16);
    memcpy(lab, lh, 8);
    for (int i = 0; i < n * h * w; i++) img[16 + i] = (uint8_t)(i * 7);
    for (int i = 0; i < n; i++) lab[8 + i] = (uint8_t)(i % 4);
    write_bytes(tpath("idx/train-images-idx3-ubyte"), img, sizeof img);
    write_bytes(tpath("idx/train-labels-idx1-ubyte"), lab, sizeof lab);
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    o.reader.idx_dir = dir;
    o.out_width = w;
    o.out_height = h;
    o.batch_size = 4;
    o.device = ts_device_cpu();
    ts_pipeline *p = NULL;
    CHECK_OK(ts_pipeline_new(&o, &p));
    if (!p) return;
    CHECK(ts_reader_size(ts_pipeline_reader(p)) == n && ts_reader_num_classes(ts_pipeline_reader(p)) == 4);
    int64_t k = 0;
    bool ok = true;
    for (;;) {
        ts_tensor *x, *y;
        CHECK_OK(ts_pipeline_next(p, &x, &y, NULL));
        if (!x) break;
        CHECK(ts_tensor_device(x) == ts_device_cpu() && ts_tensor_dim(x, 1) == 3);
        const float *px = ts_tensor_data_f32(x);
        const int64_t *py = ts_tensor_data(y);
        for (int64_t i = 0; i < ts_tensor_dim(x, 0); i++, k++) {
            ok &= py[i] == k % 4;
            for (int c = 0; c < 3; c++)
                for (int j = 0; j < h * w; j++)
                    ok &= fabsf(px[(i * 3 + c) * h * w + j] - (float)(uint8_t)((k * h * w + j) * 7) / 255.0f) < 1e-6f;
        }
    }
    CHECK(ok && k == n);
    ts_pipeline_free(p);
    ts_dataset *ds = NULL;
    o.color = TS_COLOR_GRAY;
    CHECK_OK(ts_dataset_load_images(&o, &ds));
    if (ds) {
        int64_t shape[4];
        CHECK(ts_dataset_size(ds) == n && ts_dataset_sample_shape(ds, shape) == 3 && shape[0] == 1 && shape[1] == h);
        float xs[30];
        int64_t ys;
        CHECK_OK(ts_dataset_get(ds, 3, xs, &ys));
        CHECK(ys == 3 && fabsf(xs[2] - (float)(uint8_t)((3 * 30 + 2) * 7) / 255.0f) < 1e-6f);
    }
    ts_dataset_free(ds);
    ts_device *d = NULL;
    if (ts_device_get("cpu:1", &d) == TS_OK && d) { /* virtual CPU devices, where the build has them */
        o.device = d;
        CHECK_OK(ts_pipeline_new(&o, &p));
        ts_tensor *x, *y;
        CHECK_OK(ts_pipeline_next(p, &x, &y, NULL));
        CHECK(x && ts_tensor_device(x) == d && ts_tensor_device(y) == d);
        ts_pipeline_free(p);
    }
}


/* ---- hostile images ---------------------------------------------------------------------------------- */
static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* A PNG signature, an IHDR of w x h gray 8-bit (valid CRC) and an empty IEND: a header only. */
static size_t png_header_only(uint8_t *b, uint32_t w, uint32_t h) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memcpy(b, sig, 8);
    put_be32(b + 8, 13);
    memcpy(b + 12, "IHDR", 4);
    put_be32(b + 16, w);
    put_be32(b + 20, h);
    b[24] = 8, b[25] = 0, b[26] = 0, b[27] = 0, b[28] = 0;
    put_be32(b + 29, (uint32_t)crc32(0, b + 12, 17));
    put_be32(b + 33, 0);
    memcpy(b + 37, "IEND", 4);
    put_be32(b + 41, (uint32_t)crc32(0, b + 37, 4));
    return 45;
}

/* Headers promising more pixels than the limit are refused before anything is allocated; the limit
 * comes from ts_pipeline_opts.max_pixels or TS_MAX_IMAGE_PIXELS (default 64 Mpixel). */
static void test_pixel_limit(void) {
    uint8_t b[64];
    size_t n = png_header_only(b, 16384, 16384);
    ts_image im = TS_IMAGE_INIT;
    CHECK_STATUS(ts_image_decode(b, n, TS_COLOR_GRAY, "huge.png", &im), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("huge.png: PNG of 16384 x 16384 = 268435456 pixels is over the limit of 67108864 pixels");
    CHECK(im.data == NULL);
    n = png_header_only(b, 8192, 8193);
    CHECK_STATUS(ts_image_decode(b, n, TS_COLOR_GRAY, "big.png", &im), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("over the limit");
    ts_image pic = TS_IMAGE_INIT;
    make_picture(&pic, 40, 30, 3, 1);
    CHECK_OK(ts_image_write_jpeg(&pic, tpath("limit.jpg"), 90));
    setenv("TS_MAX_IMAGE_PIXELS", "1000", 1);
    CHECK_STATUS(ts_image_read(tpath("limit.jpg"), TS_COLOR_RGB, &im), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("JPEG of 40 x 30 = 1200 pixels is over the limit of 1000 pixels");
    setenv("TS_MAX_IMAGE_PIXELS", "1M", 1);
    CHECK_OK(ts_image_read(tpath("limit.jpg"), TS_COLOR_RGB, &im));
    unsetenv("TS_MAX_IMAGE_PIXELS");
    /* the pipeline's option: one large image among small ones is an error, or a counted skip */
    const char *root = make_index_folder("pixlimit", 12, 2);
    CHECK_OK(ts_image_write_jpeg(&pic, tpath("pixlimit/class_01/img_00002.png"), 90)); /* a JPEG named .png */
    for (int skip = 0; skip < 2; skip++) {
        ts_pipeline_opts o = index_opts(root);
        o.max_pixels = 100;
        o.skip_corrupt = skip;
        o.random_resized_crop = true;
        ts_pipeline *p = NULL;
        CHECK_OK(ts_pipeline_new(&o, &p));
        ts_status st = TS_OK;
        int64_t total = 0, skipped = 0;
        for (;;) {
            ts_tensor *x, *y;
            ts_batch_info bi;
            if ((st = ts_pipeline_next(p, &x, &y, &bi)) != TS_OK || !x) break;
            total += bi.size;
            skipped += bi.skipped;
        }
        if (skip) {
            CHECK(st == TS_OK && total == 11 && skipped == 1);
        } else {
            CHECK(st == TS_ERR_FORMAT);
            CHECK_ERR_MENTIONS("img_00002.png: JPEG of 40 x 30 = 1200 pixels is over the limit of 100 pixels");
        }
        ts_pipeline_free(p);
    }
    ts_pipeline_opts o = index_opts(root);
    o.max_pixels = -1;
    ts_pipeline *p = NULL;
    CHECK_STATUS(ts_pipeline_new(&o, &p), TS_ERR_INVALID_ARG);
    ts_image_free(&im);
    ts_image_free(&pic);
}

/* A truncated JPEG fails (or is skipped and counted) whatever crop window the seed draws: window
 * decoding stops at the window's last row, so it checks the rest of the file for the end marker. */
static void test_truncated_jpeg_any_seed(void) {
    ts_image pic = TS_IMAGE_INIT, im = TS_IMAGE_INIT;
    make_picture(&pic, 320, 240, 3, 5);
    const char *root = tpath("trunc");
    mkdir(root, 0755);
    mkdir(tpath("trunc/a"), 0755);
    const char *path = tpath("trunc/a/cut.jpg");
    CHECK_OK(ts_image_write_jpeg(&pic, path, 90));
    size_t n = 0;
    uint8_t *buf = read_bytes(path, &n);
    for (int cut = 0; cut < 2; cut++) {
        size_t len = cut ? n - 2 : n * 6 / 10; /* the end marker alone, or the lower 40% */
        write_bytes(path, buf, len);
        /* the decoders directly: whole, scaled, a window in the top rows */
        ts__decoder *d = NULL;
        CHECK_OK(ts__decoder_new(&d));
        CHECK_STATUS(ts__decode(d, buf, len, TS_COLOR_RGB, "cut.jpg", 1, &im), TS_ERR_FORMAT);
        ts_roi win = {10, 0, 50, 20}, roi;
        CHECK_STATUS(ts__decode_window(d, buf, len, TS_COLOR_RGB, "cut.jpg", 1, &win, &im, &roi), TS_ERR_FORMAT);
        CHECK_ERR_MENTIONS("cut.jpg: corrupt JPEG: Premature end of JPEG file");
        win = (ts_roi){0, 0, 320, 240};
        CHECK_STATUS(ts__decode_window(d, buf, len, TS_COLOR_GRAY, "cut.jpg", 2, &win, &im, &roi), TS_ERR_FORMAT);
        ts__decoder_free(d);
        int failed = 0, skipped = 0;
        for (int seed = 0; seed < 24; seed++) {
            ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
            o.reader.file_root = root;
            o.reader.seed = seed;
            o.batch_size = 1;
            o.num_threads = 1;
            o.out_width = o.out_height = 32;
            o.random_resized_crop = true;
            o.skip_corrupt = seed % 2;
            ts_pipeline *p = NULL;
            CHECK_OK(ts_pipeline_new(&o, &p));
            if (!p) break;
            ts_tensor *x, *y;
            ts_batch_info bi;
            ts_status st = ts_pipeline_next(p, &x, &y, &bi);
            if (o.skip_corrupt) {
                int64_t dec = 0, sk = 0;
                ts_pipeline_counts(p, &dec, &sk);
                skipped += st == TS_OK && sk >= 1 && dec == 0; /* >= 1: later epochs may be prefetched */
            } else {
                failed += st == TS_ERR_FORMAT && strstr(ts_last_error(), "cut.jpg") != NULL;
            }
            ts_pipeline_free(p);
        }
        CHECK(failed == 12 && skipped == 12);
    }
    write_bytes(path, buf, n); /* the whole file decodes through every path */
    ts__decoder *d = NULL;
    CHECK_OK(ts__decoder_new(&d));
    ts_roi win = {10, 0, 50, 20}, roi;
    CHECK_OK(ts__decode_window(d, buf, n, TS_COLOR_RGB, "whole.jpg", 1, &win, &im, &roi));
    win = (ts_roi){0, 200, 320, 40};
    CHECK_OK(ts__decode_window(d, buf, n, TS_COLOR_RGB, "whole.jpg", 4, &win, &im, &roi));
    ts__decoder_free(d);
    free(buf);
    ts_image_free(&pic);
    ts_image_free(&im);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_pipeline: blocked on a FIFO\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

/* A FIFO as an image or as the file list is refused at once, never waited on. */
static void test_fifo_inputs(void) {
    signal(SIGALRM, on_alarm);
    alarm(20);
    const char *fifo = tpath("pipe.png");
    CHECK(mkfifo(fifo, 0600) == 0);
    ts_image im = TS_IMAGE_INIT;
    CHECK_STATUS(ts_image_read(fifo, TS_COLOR_GRAY, &im), TS_ERR_IO);
    CHECK_ERR_MENTIONS("pipe.png: is a FIFO (named pipe), expected an image file");
    const char *list = tpath("fifo_list.txt");
    FILE *f = fopen(list, "w");
    fprintf(f, "%s 0\n", fifo);
    fclose(f);
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    o.reader.file_list = list;
    o.color = TS_COLOR_GRAY;
    o.out_width = o.out_height = 4;
    o.batch_size = 1;
    o.skip_corrupt = true;
    ts_pipeline *p = NULL;
    CHECK_OK(ts_pipeline_new(&o, &p));
    if (p) {
        ts_tensor *x, *y;
        ts_batch_info bi;
        CHECK_OK(ts_pipeline_next(p, &x, &y, &bi)); /* the only sample skipped: the epoch ends */
        int64_t dec = 0, sk = 0;
        ts_pipeline_counts(p, &dec, &sk);
        CHECK(sk >= 1 && dec == 0 && !x); /* later epochs may be prefetched (and skipped) already */
        ts_pipeline_free(p);
    }
    const char *fifo_list = tpath("list_fifo.txt");
    CHECK(mkfifo(fifo_list, 0600) == 0);
    o.reader.file_list = fifo_list;
    CHECK_STATUS(ts_pipeline_new(&o, &p), TS_ERR_IO);
    CHECK_ERR_MENTIONS("list_fifo.txt: is a FIFO (named pipe), expected a file list");

    /* Files a listing saw as regular (d_type DT_REG) are opened without a stat first
     * (ts__open_listed_regular); one replaced since by a FIFO, or by a link to one, is still refused
     * at once, and one replaced by a link to an image is still read. */
    mkdir(tpath("swap"), 0755);
    mkdir(tpath("swap/c"), 0755);
    make_picture(&im, 8, 8, 1, 3);
    const char *names[] = {"a.png", "b.png", "c.png", "d.png"};
    for (int i = 0; i < 4; i++) CHECK_OK(ts_image_write_png(&im, tpath("swap/c/%s", names[i])));
    CHECK(symlink(tpath("swap/c/a.png"), tpath("swap/c/d.png.tmp")) == 0 &&
          rename(tpath("swap/c/d.png.tmp"), tpath("swap/c/d.png")) == 0); /* d.png: listed as a link */
    ts_reader_opts ro = TS_READER_OPTS_INIT;
    ro.file_root = tpath("swap");
    ts_reader *r = NULL;
    CHECK_OK(ts_reader_new(&ro, &r));
    if (r) {
        CHECK(ts_reader_size(r) == 4);
        for (int i = 0; i < 3; i++) CHECK(ts__reader_listed_regular(r, i));
        CHECK(!ts__reader_listed_regular(r, 3));
        CHECK(unlink(tpath("swap/c/a.png")) == 0 && mkfifo(tpath("swap/c/a.png"), 0600) == 0);
        CHECK(unlink(tpath("swap/c/b.png")) == 0 && symlink(tpath("swap/c/a.png"), tpath("swap/c/b.png")) == 0);
        CHECK(ts_image_write_png(&im, tpath("swap/c/img.png")) == TS_OK && unlink(tpath("swap/c/c.png")) == 0 &&
              symlink(tpath("swap/c/img.png"), tpath("swap/c/c.png")) == 0);
        uint8_t *buf = NULL;
        size_t cap = 0, n = 0;
        CHECK_STATUS(ts__read_file(ts_reader_path(r, 0), true, &buf, &cap, &n), TS_ERR_IO);
        CHECK_ERR_MENTIONS("a.png: is a FIFO (named pipe), expected an image file");
        CHECK_STATUS(ts__read_file(ts_reader_path(r, 1), true, &buf, &cap, &n), TS_ERR_IO);
        CHECK_ERR_MENTIONS("b.png: is a FIFO (named pipe), expected an image file");
        CHECK_OK(ts__read_file(ts_reader_path(r, 2), true, &buf, &cap, &n));
        CHECK(n > 8 && buf[1] == 'P' && buf[2] == 'N' && buf[3] == 'G');
        free(buf);
        ts_reader_free(r);
    }
    ts_image_free(&im);
    alarm(0);
}

/* ts_data_open on image folders: test/'s class folders must be train/'s, in the same order. */
static void test_data_open_classes(void) {
    char root[1024];
    snprintf(root, sizeof root, "%s", tpath("classes"));
    mkdir(root, 0755);
    ts_image im = TS_IMAGE_INIT;
    make_picture(&im, 8, 8, 1, 2);
    const char *train[] = {"ant", "bee", "cat"}, *test_bad[] = {"ant", "cat"}, *test_ok[] = {"ant", "bee"};
    for (int split = 0; split < 2; split++) {
        const char *sp = split ? "test" : "train";
        mkdir(tpath("classes/%s", sp), 0755);
        const char **names = split ? test_bad : train;
        for (int c = 0; c < (split ? 2 : 3); c++) {
            mkdir(tpath("classes/%s/%s", sp, names[c]), 0755);
            CHECK_OK(ts_image_write_png(&im, tpath("classes/%s/%s/0.png", sp, names[c])));
        }
    }
    ts_data_opts d = TS_DATA_OPTS_INIT;
    d.path = root;
    d.batch_size = 2;
    d.threads = 1;
    ts_batch_source *tr = NULL, *te = NULL;
    CHECK_STATUS(ts_data_open(&d, &tr, &te), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("classes/test: class folder 1 is 'cat', but");
    CHECK_ERR_MENTIONS("'bee' (3 classes)");
    CHECK(!tr && !te);
    rm_rf(tpath("classes/test/cat"));
    mkdir(tpath("classes/test/%s", test_ok[1]), 0755);
    CHECK_OK(ts_image_write_png(&im, tpath("classes/test/%s/0.png", test_ok[1])));
    CHECK_OK(ts_data_open(&d, &tr, &te)); /* a prefix of the training classes is fine */
    ts_batch_source_free(tr);
    ts_batch_source_free(te);
    ts_image_free(&im);
}

/* Mixed decoding's host half: the resampling plan a device decoder gets, replayed with the per-pixel
 * arithmetic the CUDA kernel runs (device/k_image_px.h), equals the CPU pipeline's resampling bit for bit
 * (RGB and gray, shrinking and enlarging, windows at the edges, mirrored or not). */
static void test_resample_plan_replay(void) {
    ts_rng r;
    ts_rng_seed(&r, 17);
    const float mean[3] = {120, 110, 100}, std[3] = {58, 57, 59};
    int cases = 0;
    for (int C = 1; C <= 3; C += 2)
        for (int k = 0; k < 12; k++) {
            const int w = 5 + (int)(ts_rng_uniform(&r) * 90), h = 4 + (int)(ts_rng_uniform(&r) * 70);
            ts_image im = TS_IMAGE_INIT;
            CHECK_OK(ts_image_alloc(&im, w, h, C));
            for (size_t i = 0; i < (size_t)w * h * C; i++) im.data[i] = (uint8_t)(ts_rng_uniform(&r) * 256);
            ts_roi roi = {(int)(ts_rng_uniform(&r) * w / 2), (int)(ts_rng_uniform(&r) * h / 2), 1, 1};
            roi.w = 1 + (int)(ts_rng_uniform(&r) * (w - roi.x - 1) + 0.5);
            roi.h = 1 + (int)(ts_rng_uniform(&r) * (h - roi.y - 1) + 0.5);
            if (k == 0) roi = (ts_roi){0, 0, w, h};
            const int ow = k % 3 == 0 ? 3 * w / 2 : 7 + k, oh = k % 3 == 0 ? h + 5 : 5 + 2 * k; /* up and down */
            const bool mirror = k % 2;
            float *want = malloc(sizeof(float) * (size_t)C * ow * oh), *got = malloc(sizeof(float) * (size_t)C * ow * oh);
            CHECK_OK(ts_image_crop_resize_normalize(&im, &roi, ow, oh, mirror, mean, std, want));
            ts__resample_ws ws = {NULL, 0};
            ts_resample_plan pl;
            CHECK_OK(ts__resample_plan_ws(&ws, w, h, C, &roi, ow, oh, mirror, mean, std, &pl));
            CHECK(pl.ow == ow && pl.oh == oh && pl.channels == C && pl.kx >= 1 && pl.ky >= 1);
            double worst = 0;
            for (int c = 0; c < C; c++)
                for (int oy = 0; oy < oh; oy++)
                    for (int ox = 0; ox < ow; ox++) {
                        const size_t i = ((size_t)c * oh + oy) * ow + ox;
                        got[i] = ts_resample_px(im.data, w, C, c, pl.x0[ox], pl.y0[oy], pl.wx + (size_t)ox * pl.kx,
                                                pl.kx, pl.wy + (size_t)oy * pl.ky, pl.ky, pl.scale[c], pl.bias[c]);
                        worst = fmax(worst, fabs((double)got[i] - want[i]));
                    }
            if (worst != 0)
                fprintf(stderr, "plan replay C=%d %dx%d window (%d,%d) %dx%d -> %dx%d mirror %d: max diff %g\n", C, w, h,
                        roi.x, roi.y, roi.w, roi.h, ow, oh, mirror, worst);
            CHECK(worst == 0);
            cases++;
            ts__resample_ws_free(&ws);
            ts_image_free(&im);
            free(want);
            free(got);
        }
    CHECK(cases == 24);
    /* a window outside the image is refused */
    ts__resample_ws ws = {NULL, 0};
    ts_resample_plan pl;
    ts_roi bad = {10, 0, 8, 8};
    CHECK_STATUS(ts__resample_plan_ws(&ws, 16, 16, 3, &bad, 4, 4, false, mean, std, &pl), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("is not inside the 16 x 16 image");
    ts__resample_ws_free(&ws);
}

/* ts__jpeg_has_end (mixed decoding sends files without it to the host decoder), the decode option's
 * parsing, and "mixed" on a device without an image decoder. */
static void test_mixed_decode_host_side(void) {
    ts_image pic = TS_IMAGE_INIT;
    CHECK_OK(ts_image_alloc(&pic, 40, 30, 3));
    for (size_t i = 0; i < 40 * 30 * 3; i++) pic.data[i] = (uint8_t)(i * 7);
    const char *path = tpath("end.jpg");
    CHECK_OK(ts_image_write_jpeg(&pic, path, 90));
    ts_image_free(&pic);
    FILE *f = fopen(path, "rb");
    uint8_t buf[65536];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CHECK(n > 100 && n < sizeof buf - 8);
    CHECK(ts__jpeg_has_end(buf, n));
    CHECK(!ts__jpeg_has_end(buf, n - 2)); /* the marker cut off */
    CHECK(!ts__jpeg_has_end(buf, n / 2)); /* half the scan */
    memcpy(buf + n, "\0junk", 5); /* bytes after the marker are allowed */
    CHECK(ts__jpeg_has_end(buf, n + 5));
    /* a thumbnail's end marker before the image's scan does not count */
    const uint8_t thumb[] = {0xff, 0xd8, 0xff, 0xe1, 0x00, 0x06, 0xff, 0xd9, 0x00, 0x00, 0xff, 0xda, 0x00, 0x02, 0x12, 0x34};
    CHECK(!ts__jpeg_has_end(thumb, sizeof thumb));
    CHECK(!ts__jpeg_has_end(buf, 0));
    ts_decode_device d = TS_DECODE_MIXED;
    CHECK_OK(ts_decode_device_parse("cpu", &d));
    CHECK(d == TS_DECODE_CPU);
    CHECK_OK(ts_decode_device_parse("mixed", &d));
    CHECK(d == TS_DECODE_MIXED);
    CHECK_STATUS(ts_decode_device_parse("gpu", &d), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("decode device 'gpu': expected cpu or mixed");
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    o.reader.file_list = path;
    o.out_width = o.out_height = 8;
    o.decode = TS_DECODE_MIXED;
    ts_device *cpu1 = NULL;
    CHECK_OK(ts_device_get("cpu:1", &cpu1));
    o.device = cpu1;
    ts_pipeline *p = NULL;
    CHECK_STATUS(ts_pipeline_new(&o, &p), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("decode \"mixed\" decodes on the batches' device, and cpu:1 has no image decoder");
    CHECK(p == NULL);
}

/* A decoder whose TurboJPEG call failed (a header cut short) reads the next file right: it used to report
 * 0 x 0 or an earlier file's size, and the pipeline then cropped the files after a corrupt one wrong. */
static void test_decoder_after_corrupt_header(void) {
    ts_image pic = TS_IMAGE_INIT, got = TS_IMAGE_INIT;
    ts__decoder *d = NULL;
    CHECK_OK(ts__decoder_new(&d));
    const int sizes[3][2] = {{85, 26}, {41, 44}, {63, 62}};
    uint8_t *bufs[3];
    size_t ns[3];
    for (int i = 0; i < 3; i++) {
        make_picture(&pic, sizes[i][0], sizes[i][1], 3, (uint32_t)i);
        const char *path = tpath("hdr_%d.jpg", i);
        CHECK_OK(ts_image_write_jpeg(&pic, path, 90));
        bufs[i] = read_bytes(path, &ns[i]);
    }
    ns[1] = 300; /* cut inside its tables: no start of scan */
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 3; i++) {
            ts__fmt fmt;
            int w = 0, h = 0;
            ts_status st = ts__decode_header(d, bufs[i], ns[i], "hdr", &fmt, &w, &h);
            if (i == 1) {
                CHECK(st == TS_ERR_FORMAT);
                if (round == 1) CHECK_STATUS(ts__decode(d, bufs[i], ns[i], TS_COLOR_RGB, "hdr", 1, &got), TS_ERR_FORMAT);
                continue;
            }
            CHECK(st == TS_OK && w == sizes[i][0] && h == sizes[i][1]);
            CHECK_OK(ts__decode(d, bufs[i], ns[i], TS_COLOR_RGB, "hdr", 1, &got));
            CHECK(got.width == sizes[i][0] && got.height == sizes[i][1]);
        }
    for (int i = 0; i < 3; i++) free(bufs[i]);
    ts__decoder_free(d);
    ts_image_free(&pic);
    ts_image_free(&got);
}

/* ---- mixed decoding through a stand-in device decoder ------------------------------------------- */
/* An image family for a virtual CPU device (the test puts it in cpu:1's table): it decodes the whole JPEG
 * on the host and resamples it by the plan with ts_resample_px, as the CUDA kernel does, and refuses every
 * third file (TS_ERR_UNSUPPORTED: the pipeline then decodes it on its worker). */
struct ts_image_decoder {
    ts__decoder *dec;
    ts_image img;
};
static _Atomic int fake_calls, fake_refused, marks_made, marks_gone, marks_waited_on;
static ts_status fake_new(ts_device *d, ts_image_decoder **out) {
    (void)d;
    ts_image_decoder *f = calloc(1, sizeof *f);
    if (!f) return TS_ERR_NOMEM;
    ts_status st = ts__decoder_new(&f->dec);
    if (st != TS_OK) {
        free(f);
        return st;
    }
    *out = f;
    return TS_OK;
}
static void fake_free(ts_image_decoder *f) {
    if (!f) return;
    ts__decoder_free(f->dec);
    ts_image_free(&f->img);
    free(f);
}
/* Markers of the stand-in device: tokens counted when made and when released (device_wait, marker_free). */
static ts_status mark_record(ts_device *d, void **m) {
    (void)d;
    *m = malloc(1);
    atomic_fetch_add(&marks_made, 1);
    return TS_OK;
}
static void mark_free(ts_device *d, void *m) {
    (void)d;
    if (!m) return;
    atomic_fetch_add(&marks_gone, 1);
    free(m);
}
static ts_status mark_device_wait(ts_device *d, void *m) {
    mark_free(d, m);
    return TS_OK;
}
static ts_status fake_decode(ts_image_decoder *f, const uint8_t *jpeg, size_t n, const char *name,
                             const ts_resample_plan *pl, void *out, void *out_free, void **written) {
    *written = NULL;
    if (out_free) atomic_fetch_add(&marks_waited_on, 1); /* a live token (ASan would see a freed one) */
    if (out_free) *(volatile char *)out_free = 1;
    if (atomic_fetch_add(&fake_calls, 1) % 3 == 2) {
        atomic_fetch_add(&fake_refused, 1);
        return ts_error(TS_ERR_UNSUPPORTED, "%s: the stand-in decoder refuses it", name);
    }
    TS_TRY(ts__decode(f->dec, jpeg, n, (ts_color)pl->channels, name, 1, &f->img));
    float *o = out;
    const size_t plane = (size_t)pl->ow * pl->oh;
    for (int c = 0; c < pl->channels; c++)
        for (int oy = 0; oy < pl->oh; oy++)
            for (int ox = 0; ox < pl->ow; ox++)
                o[c * plane + (size_t)oy * pl->ow + ox] =
                    ts_resample_px(f->img.data, f->img.width, pl->channels, c, pl->x0[ox], pl->y0[oy],
                                   pl->wx + (size_t)ox * pl->kx, pl->kx, pl->wy + (size_t)oy * pl->ky, pl->ky,
                                   pl->scale[c], pl->bias[c]);
    return mark_record(NULL, written);
}
static const struct ts_kernels_image fake_image = {fake_new, fake_free, fake_decode};

/* The executor's mixed path on a virtual CPU device with the stand-in decoder: the same batches as the
 * workers' own decoding, bit for bit (the window decode's pixels are the whole image's there), with a PNG,
 * a truncated JPEG (skipped: its row's successors move up) and refused files among the JPEGs. */
static void test_mixed_decode_pipeline(void) {
    const char *root = tpath("mixed");
    mkdir(root, 0755);
    ts_rng r;
    ts_rng_seed(&r, 8);
    for (int i = 0; i < 17; i++) {
        char dir[600], f[700];
        snprintf(dir, sizeof dir, "%s/c%d", root, i % 3);
        mkdir(dir, 0755);
        const int w = 30 + 11 * (i % 6), h = 26 + 9 * (i % 5);
        ts_image pic = TS_IMAGE_INIT;
        CHECK_OK(ts_image_alloc(&pic, w, h, 3));
        for (size_t k = 0; k < (size_t)w * h * 3; k++) pic.data[k] = (uint8_t)(128 + 100 * sin(0.05 * k * (i + 1)) + 20 * ts_rng_uniform(&r));
        snprintf(f, sizeof f, "%s/img%02d.%s", dir, i, i == 4 ? "png" : "jpg");
        CHECK_OK(i == 4 ? ts_image_write_png(&pic, f) : ts_image_write_jpeg(&pic, f, 90));
        ts_image_free(&pic);
        if (i == 7) CHECK(truncate(f, 300) == 0);
    }
    ts_device *cpu1 = NULL;
    CHECK_OK(ts_device_get("cpu:1", &cpu1));
    if (!cpu1) return;
    const struct ts_kernels_image *keep = cpu1->k_image;
    for (int color = 1; color <= 3; color += 2) {
        ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
        o.reader.file_root = root;
        o.reader.random_shuffle = true;
        o.reader.seed = 4;
        o.batch_size = 5;
        o.num_threads = 3;
        o.device = cpu1;
        o.color = (ts_color)color;
        o.skip_corrupt = true;
        o.out_width = 13;
        o.out_height = 11;
        o.random_resized_crop = true;
        o.flip_prob = 0.5f;
        o.jpeg_scaled_decode = false;
        for (int c = 0; c < 3; c++) {
            o.mean[c] = 110.0f + c;
            o.std[c] = 50.0f + c;
        }
        const size_t cap = 17 * 3 * 13 * 11;
        float *a = calloc(cap, sizeof(float)), *b = calloc(cap, sizeof(float));
        int64_t la[17] = {0}, lb[17] = {0}, ia[17] = {0}, ib[17] = {0}, sa = 0, sb = 0;
        int64_t na = tp_epoch(&o, a, la, ia, &sa);
        const ts_device_ops *keep_ops = cpu1->ops;
        ts_device_ops marked = *keep_ops; /* markers, as a GPU has them */
        marked.marker_record = mark_record;
        marked.device_wait = mark_device_wait;
        marked.marker_free = mark_free;
        char why[256];
        CHECK(!ts_mixed_decode_available(cpu1, why, sizeof why) && strstr(why, "cpu:1 has no image decoder"));
        cpu1->k_image = &fake_image;
        CHECK(ts_mixed_decode_available(cpu1, why, sizeof why) && why[0] == 0);
        cpu1->ops = &marked;
        fake_calls = fake_refused = marks_made = marks_gone = marks_waited_on = 0;
        o.decode = TS_DECODE_MIXED;
        int64_t nb = tp_epoch(&o, b, lb, ib, &sb);
        cpu1->k_image = keep;
        cpu1->ops = keep_ops;
        /* every row's marker and every slot's "released" marker made and let go; decodes into reused slots
         * waited for one */
        CHECK(marks_made > 10 && marks_made == marks_gone && marks_waited_on > 0);
        CHECK(na == 16 && nb == 16 && sa == 1 && sb == 1);
        CHECK(fake_calls >= 15 && fake_refused >= 4); /* the truncated JPEG never reaches it */
        CHECK(memcmp(la, lb, sizeof la) == 0 && memcmp(ia, ib, sizeof ia) == 0);
        double worst = 0;
        size_t wi = 0;
        for (size_t k = 0; k < cap; k++)
            if (fabs((double)a[k] - b[k]) > worst) worst = fabs((double)a[k] - b[k]), wi = k;
        if (worst > 0) fprintf(stderr, "mixed vs cpu, %d channels: max diff %g at %zu (row %zu)\n", color, worst, wi, wi / ((size_t)color * 13 * 11));
        for (int64_t row = 0; row < 16 && worst > 0; row++) {
            double m = 0;
            for (size_t k = 0; k < (size_t)color * 143; k++) m = fmax(m, fabs((double)a[row * color * 143 + k] - b[row * color * 143 + k]));
            if (m > 0) {
                double mm = 0;
                for (int c = 0; c < color; c++) for (int yy = 0; yy < 11; yy++) for (int xx = 0; xx < 13; xx++)
                    mm = fmax(mm, fabs((double)a[row * color * 143 + c * 143 + yy * 13 + xx] - b[row * color * 143 + c * 143 + yy * 13 + 12 - xx]));
                fprintf(stderr, "  row %lld sample %lld: %g (mirrored: %g)\n", (long long)row, (long long)ia[row], m, mm);
                for (int xx = 0; xx < 13; xx++) fprintf(stderr, " %.2f/%.2f", a[row * color * 143 + xx], b[row * color * 143 + xx]);
                fprintf(stderr, "\n");
            }
        }
        CHECK(memcmp(a, b, sizeof(float) * cap) == 0);
        free(a);
        free(b);
    }
}

/* ---- uploads from pinned staging, on a stand-in device ------------------------------------------ */
/* cpu:1 made to look like a device whose memory is not the host's, with "pinned" host memory whose
 * uploads are queued (memcpy here, counted): the executor's staging and upload bookkeeping. */
static _Atomic int pin_allocs, pin_frees, pin_copies, pin_marks, pin_waits, pin_fail_alloc;
static void *pin_alloc(ts_device *d, size_t n) {
    (void)d;
    if (pin_fail_alloc) return NULL;
    atomic_fetch_add(&pin_allocs, 1);
    return malloc(n);
}
static void pin_free(ts_device *d, void *p) {
    (void)d;
    atomic_fetch_add(&pin_frees, 1);
    free(p);
}
static ts_status pin_copy(ts_device *d, void *dst, const void *src, size_t n, void **done) {
    (void)d;
    atomic_fetch_add(&pin_copies, 1);
    memcpy(dst, src, n);
    if (done) {
        atomic_fetch_add(&pin_marks, 1);
        *done = malloc(1); /* a marker host_wait must release (LeakSanitizer counts them) */
    }
    return TS_OK;
}
static ts_status pin_wait(ts_device *d, void *done) {
    (void)d;
    atomic_fetch_add(&pin_waits, 1);
    free(done);
    return TS_OK;
}

static void test_pipeline_pinned_staging(void) {
    const char *root = tpath("pinned");
    mkdir(root, 0755);
    for (int i = 0; i < 11; i++) {
        char dir[600], f[700];
        snprintf(dir, sizeof dir, "%s/c%d", root, i % 2);
        mkdir(dir, 0755);
        ts_image pic = TS_IMAGE_INIT;
        make_picture(&pic, 40 + 3 * i, 30 + 2 * i, 3, (uint32_t)i);
        snprintf(f, sizeof f, "%s/p%02d.jpg", dir, i);
        CHECK_OK(ts_image_write_jpeg(&pic, f, 85));
        ts_image_free(&pic);
    }
    ts_device *cpu1 = NULL;
    CHECK_OK(ts_device_get("cpu:1", &cpu1));
    if (!cpu1) return;
    const ts_device_ops *keep = cpu1->ops;
    ts_device_ops fake = *keep;
    fake.host_alloc = pin_alloc;
    fake.host_free = pin_free;
    fake.copy_h2d_async = pin_copy;
    fake.host_wait = pin_wait;
    for (int fail = 0; fail < 2; fail++) {
        ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
        o.reader.file_root = root;
        o.reader.random_shuffle = true;
        o.batch_size = 4;
        o.num_threads = 2;
        o.device = cpu1;
        o.out_width = o.out_height = 12;
        o.random_resized_crop = true;
        o.flip_prob = 0.5f;
        const size_t cap = 2 * 12 * 3 * 144 + 64;
        float *a = calloc(cap, sizeof(float)), *b = calloc(cap, sizeof(float));
        int64_t la[32] = {0}, lb[32] = {0}, ia[32] = {0}, ib[32] = {0}, sa = 0, sb = 0;
        int64_t na = tp_epoch(&o, a, la, ia, &sa);
        pin_allocs = pin_frees = pin_copies = pin_marks = pin_waits = 0;
        pin_fail_alloc = fail;
        cpu1->ops = &fake;
        cpu1->host_accessible = false; /* the pipeline stages in host memory and uploads */
        int64_t nb = tp_epoch(&o, b, lb, ib, &sb);
        /* a seek in the middle of an epoch, with a batch handed out and prefetched ones pending */
        ts_pipeline *p = NULL;
        CHECK_OK(ts_pipeline_new(&o, &p));
        ts_tensor *x = NULL, *y = NULL;
        for (int k = 0; p && k < 2; k++) CHECK_OK(ts_pipeline_next(p, &x, &y, NULL));
        if (p) CHECK_OK(ts_pipeline_seek(p, 0, 1));
        float *c = calloc(4 * 3 * 144, sizeof(float));
        if (p) CHECK_OK(ts_pipeline_next(p, &x, &y, NULL));
        if (x) CHECK_OK(ts_tensor_to_host(x, c, ts_tensor_nbytes(x)));
        CHECK(x && memcmp(c, a + 4 * 3 * 144, sizeof(float) * 4 * 3 * 144) == 0); /* batch 1 again */
        ts_pipeline_free(p);
        cpu1->ops = keep;
        cpu1->host_accessible = true;
        CHECK(na == 11 && nb == 11 && sa == 0 && sb == 0);
        CHECK(memcmp(la, lb, sizeof la) == 0 && memcmp(ia, ib, sizeof ia) == 0);
        CHECK(memcmp(a, b, sizeof(float) * cap) == 0);
        if (fail) { /* no pinned memory: waiting copies from malloc'd staging */
            CHECK(pin_allocs == 0 && pin_copies == 0 && pin_marks == 0);
        } else { /* x and y per batch, every marker waited for, every buffer freed */
            CHECK(pin_copies >= 2 * 3 && pin_marks >= 3 && pin_marks == pin_waits);
            CHECK(pin_allocs > 0 && pin_allocs == pin_frees);
        }
        free(a);
        free(b);
        free(c);
    }
}

int main(int argc, char **argv) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ts_pipeline_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    static const tu_test tests[] = {
        T(test_std_engines),      T(test_shard_start),      T(test_reader_golden),       T(test_every_sample_once),
        T(test_reader_errors),    T(test_decode_vs_libjpeg), T(test_decode_window), T(test_png_roundtrip),       T(test_corrupt_files),
        T(test_ops),              T(test_pipeline_shards),  T(test_pipeline_padding),    T(test_pipeline_reproducible),
        T(test_pipeline_corrupt), T(test_pipeline_shutdown), T(test_pipeline_idx),
        T(test_pixel_limit),      T(test_truncated_jpeg_any_seed), T(test_fifo_inputs), T(test_data_open_classes),
        T(test_resample_plan_replay), T(test_mixed_decode_host_side), T(test_mixed_decode_pipeline),
        T(test_decoder_after_corrupt_header), T(test_pipeline_pinned_staging),
        T(test_pipeline_last_batch), T(test_option_names), T(test_pipeline_kept_batches),
    };
    int rc = tu_run(tests, (int)TS_ARRAY_LEN(tests), argc, argv);
    rm_rf(tmpdir);
    return rc;
}
