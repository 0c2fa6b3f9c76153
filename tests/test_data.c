/* IDX reading, MNIST datasets and the batch loader. */
#include "test_util.h"

#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static int real_data_missing;

/* "<tmp>/<sub>" created as a directory; returns one of 8 rotating static buffers. */
static const char *subdir(const char *sub) {
    static char bufs[8][300];
    static int next;
    char *buf = bufs[next++ % 8];
    snprintf(buf, sizeof bufs[0], "%.255s/%.40s", tu_tmpdir(), sub);
    mkdir(buf, 0755);
    return buf;
}

/* Writes raw bytes to path, gzip-compressed when gz. */
static void write_bytes(const char *path, const void *data, size_t n, int gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (!f || (n && gzwrite(f, data, (unsigned)n) != (int)n) || gzclose(f) != Z_OK) abort();
    } else {
        FILE *f = fopen(path, "wb");
        if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) abort();
    }
}

static size_t put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
    return 4;
}

/* An IDX file: magic, dims, then `payload` bytes of data (pattern from data, which
 * must hold at least payload bytes). */
static void write_idx(const char *path, int gz, uint32_t magic, int ndim, const uint32_t *dims, const uint8_t *data,
                      size_t payload) {
    size_t n = 4 + 4 * (size_t)ndim + payload;
    unsigned char *buf = malloc(n);
    size_t o = put_be32(buf, magic);
    for (int i = 0; i < ndim; i++) o += put_be32(buf + o, dims[i]);
    memcpy(buf + o, data, payload);
    write_bytes(path, buf, n, gz);
    free(buf);
}

/* Synthetic MNIST-format pair in dir: n images of h x w, pixel (i, j) = (7 i + 3 j) % 256,
 * label i % 10. */
enum { SN = 5, SH = 3, SW = 4 };
static uint8_t syn_pix[SN * SH * SW], syn_lab[SN];

static void make_synthetic(const char *dir, const char *pre, int gz, const char *suffix) {
    for (int i = 0; i < SN; i++) {
        syn_lab[i] = (uint8_t)(i % 10);
        for (int j = 0; j < SH * SW; j++) syn_pix[i * SH * SW + j] = (uint8_t)((7 * i + 3 * j + 250 * (j == 0)) % 256);
    }
    char p[400];
    uint32_t idims[3] = {SN, SH, SW}, ldims[1] = {SN};
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte%s", dir, pre, suffix);
    write_idx(p, gz, 0x803, 3, idims, syn_pix, sizeof syn_pix);
    snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte%s", dir, pre, suffix);
    write_idx(p, gz, 0x801, 1, ldims, syn_lab, sizeof syn_lab);
}

static void check_synthetic(ts_dataset *ds) {
    CHECK(ts_dataset_size(ds) == SN);
    int64_t shape[TS_MAX_DIMS];
    CHECK(ts_dataset_sample_shape(ds, shape) == 3);
    CHECK(shape[0] == 1 && shape[1] == SH && shape[2] == SW);
    CHECK(ts_dataset_num_classes(ds) == 5);
    ts_tensor *x = NULL, *y = NULL;
    CHECK_OK(ts_dataset_tensors(ds, &x, &y));
    CHECK(ts_tensor_ndim(x) == 4 && ts_tensor_dim(x, 0) == SN && ts_tensor_dim(x, 1) == 1);
    CHECK(ts_tensor_dtype(y) == TS_I64);
    const float *xp = ts_tensor_data_f32(x);
    const int64_t *yp = ts_tensor_data(y);
    int bad = 0;
    for (int k = 0; k < SN * SH * SW; k++) {
        float want = ((float)syn_pix[k] / 255.0f - TS_FASHION_MNIST_MEAN) / TS_FASHION_MNIST_STD;
        bad += xp[k] != want;
    }
    CHECK(bad == 0);
    for (int i = 0; i < SN; i++) CHECK(yp[i] == syn_lab[i]);
    float s[SH * SW];
    int64_t lab = -1;
    CHECK_OK(ts_dataset_get(ds, 2, s, &lab));
    CHECK(lab == 2 && memcmp(s, xp + 2 * SH * SW, sizeof s) == 0);
    CHECK_STATUS(ts_dataset_get(ds, SN, s, &lab), TS_ERR_INVALID_ARG);
}

static void test_synthetic_gz_and_plain(void) {
    const char *d1 = subdir("gz");
    make_synthetic(d1, "train", 1, ".gz");
    ts_dataset *ds = NULL;
    CHECK_OK(ts_dataset_load_mnist(d1, "train", &ds));
    if (ds) check_synthetic(ds);
    ts_dataset_free(ds);

    const char *d2 = subdir("plain");
    make_synthetic(d2, "t10k", 0, "");
    ds = NULL;
    CHECK_OK(ts_dataset_load_mnist(d2, "test", &ds));
    if (ds) check_synthetic(ds);

    /* exact re-normalisation: to raw [0, 1] and back */
    if (ds) {
        CHECK_OK(ts_dataset_set_normalize(ds, 0.0f, 1.0f));
        ts_tensor *x = NULL;
        CHECK_OK(ts_dataset_tensors(ds, &x, NULL));
        int bad = 0;
        for (int k = 0; k < SN * SH * SW; k++) bad += ts_tensor_data_f32(x)[k] != (float)syn_pix[k] / 255.0f;
        CHECK(bad == 0);
        CHECK_OK(ts_dataset_set_normalize(ds, 0.5f, 0.25f));
        CHECK_OK(ts_dataset_set_normalize(ds, TS_FASHION_MNIST_MEAN, TS_FASHION_MNIST_STD));
        float m, s;
        ts_dataset_get_normalize(ds, &m, &s);
        CHECK(m == TS_FASHION_MNIST_MEAN && s == TS_FASHION_MNIST_STD);
        check_synthetic(ds);
        CHECK_STATUS(ts_dataset_set_normalize(ds, 0.0f, 0.0f), TS_ERR_INVALID_ARG);
    }
    ts_dataset_free(ds);

    /* gzip content under a plain name is still read (content decides) */
    const char *d3 = subdir("mixed");
    make_synthetic(d3, "train", 1, "");
    ds = NULL;
    CHECK_OK(ts_dataset_load_mnist(d3, "train", &ds));
    if (ds) check_synthetic(ds);
    ts_dataset_free(ds);

    /* ts_idx_read: raw bytes and shape */
    char p[400];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", d1);
    ts_tensor *t = NULL;
    CHECK_OK(ts_idx_read(p, 0, &t));
    if (t) {
        CHECK(ts_tensor_dtype(t) == TS_U8 && ts_tensor_ndim(t) == 3);
        CHECK(ts_tensor_dim(t, 0) == SN && ts_tensor_dim(t, 1) == SH && ts_tensor_dim(t, 2) == SW);
        CHECK(memcmp(ts_tensor_data(t), syn_pix, sizeof syn_pix) == 0);
    }
    ts_tensor_release(t);
    CHECK_STATUS(ts_dataset_load_mnist(d1, "valid", &ds), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("valid");
}

/* Expects ts_idx_read(path, nd) to fail with st and a message naming path and `what`. */
static void expect_idx_error(const char *path, int nd, ts_status st, const char *what) {
    ts_tensor *t = NULL;
    CHECK_STATUS(ts_idx_read(path, nd, &t), st);
    CHECK(t == NULL);
    CHECK_ERR_MENTIONS(path);
    CHECK_ERR_MENTIONS(what);
}

static void test_idx_errors(void) {
    const char *d = subdir("bad");
    char p[400];
    uint8_t data[64] = {0};
    uint32_t idims[3] = {SN, SH, SW};

    snprintf(p, sizeof p, "%s/missing-idx3-ubyte.gz", d);
    expect_idx_error(p, 3, TS_ERR_IO, "No such file");

    for (int gz = 0; gz <= 1; gz++) {
        /* truncated payload: the header promises 60 bytes, the file holds 36 */
        snprintf(p, sizeof p, "%s/trunc%d", d, gz);
        write_idx(p, gz, 0x803, 3, idims, data, 36);
        expect_idx_error(p, 3, TS_ERR_FORMAT, "truncated: expected 60 bytes of pixels, got 36");
        /* truncated header */
        write_idx(p, gz, 0x803, 1, idims, data, 0);
        expect_idx_error(p, 3, TS_ERR_FORMAT, "truncated header: expected 12 bytes of dimensions, got 4");
        unsigned char h[6] = {0, 0, 8, 3, 0, 0};
        write_bytes(p, h, sizeof h, gz);
        expect_idx_error(p, 3, TS_ERR_FORMAT, "truncated header");
        write_bytes(p, h, 2, gz);
        expect_idx_error(p, 3, TS_ERR_FORMAT, "truncated");
        /* labels where images are expected */
        write_idx(p, gz, 0x801, 1, idims, data, SN);
        expect_idx_error(p, 3, TS_ERR_FORMAT, "bad magic 0x00000801 (expected 0x00000803)");
        /* not an IDX file at all */
        write_bytes(p, "hello, world\n", 13, gz);
        expect_idx_error(p, 1, TS_ERR_FORMAT, "bad magic 0x68656c6c (expected 0x00000801)");
        /* float32 element type */
        write_idx(p, gz, 0xD03, 3, idims, data, 60);
        expect_idx_error(p, 3, TS_ERR_FORMAT, "element type 0x0d");
        /* trailing bytes */
        write_idx(p, gz, 0x803, 3, idims, data, 61);
        expect_idx_error(p, 3, TS_ERR_FORMAT, "trailing data");
        /* exact size is fine */
        write_idx(p, gz, 0x803, 3, idims, data, 60);
        ts_tensor *t = NULL;
        CHECK_OK(ts_idx_read(p, 3, &t));
        ts_tensor_release(t);
    }
    /* zero bytes */
    snprintf(p, sizeof p, "%s/empty-idx1-ubyte", d);
    write_bytes(p, "", 0, 0);
    expect_idx_error(p, 1, TS_ERR_FORMAT, "empty");
    /* a gzip stream cut in the middle */
    uint8_t big[4096];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
    uint32_t bd[3] = {4, 32, 32};
    snprintf(p, sizeof p, "%s/cut-idx3-ubyte.gz", d);
    write_idx(p, 1, 0x803, 3, bd, big, sizeof big);
    struct stat sb;
    CHECK(stat(p, &sb) == 0);
    CHECK(truncate(p, sb.st_size / 2) == 0);
    expect_idx_error(p, 3, TS_ERR_FORMAT, "truncated");
    /* a whole deflate stream without the gzip trailer (CRC-32 + length): unverified, so refused; a wrong
     * CRC-32 in the trailer is corrupt data */
    snprintf(p, sizeof p, "%s/notrailer-idx3-ubyte.gz", d);
    write_idx(p, 1, 0x803, 3, bd, big, sizeof big);
    CHECK(stat(p, &sb) == 0);
    CHECK(truncate(p, sb.st_size - 8) == 0);
    expect_idx_error(p, 3, TS_ERR_FORMAT, "without the gzip trailer (CRC-32 and length)");
    CHECK_ERR_MENTIONS("notrailer-idx3-ubyte.gz");
    write_idx(p, 1, 0x803, 3, bd, big, sizeof big);
    CHECK(truncate(p, sb.st_size - 4) == 0); /* the CRC-32 without the length */
    expect_idx_error(p, 3, TS_ERR_FORMAT, "without the gzip trailer");
    snprintf(p, sizeof p, "%s/badcrc-idx3-ubyte.gz", d);
    write_idx(p, 1, 0x803, 3, bd, big, sizeof big);
    CHECK(stat(p, &sb) == 0);
    {
        FILE *f = fopen(p, "r+b");
        unsigned char c = 0;
        CHECK(f && fseek(f, sb.st_size - 8, SEEK_SET) == 0 && fread(&c, 1, 1, f) == 1);
        if (f) {
            c ^= 1;
            fseek(f, sb.st_size - 8, SEEK_SET);
            fwrite(&c, 1, 1, f);
            fclose(f);
        }
    }
    expect_idx_error(p, 3, TS_ERR_FORMAT, "corrupt gzip data");
    /* a gzip header followed by garbage */
    unsigned char junk[40] = {0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 0x03};
    for (size_t i = 10; i < sizeof junk; i++) junk[i] = (unsigned char)(0xff - 7 * i);
    snprintf(p, sizeof p, "%s/junk-idx3-ubyte.gz", d);
    write_bytes(p, junk, sizeof junk, 0);
    expect_idx_error(p, 3, TS_ERR_FORMAT, "corrupt gzip data");
    /* a directory */
    expect_idx_error(d, 3, TS_ERR_IO, "directory");
}

static void test_mnist_errors(void) {
    ts_dataset *ds = NULL;
    const char *d = subdir("empty_dir");
    CHECK_STATUS(ts_dataset_load_mnist(d, "train", &ds), TS_ERR_IO);
    CHECK_ERR_MENTIONS("train-images-idx3-ubyte.gz");
    CHECK_ERR_MENTIONS("No such file");
    CHECK(ds == NULL);

    /* counts disagree: 5 images, 4 labels */
    const char *d2 = subdir("mismatch");
    make_synthetic(d2, "train", 1, ".gz");
    char p[400];
    uint32_t ld[1] = {4};
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", d2);
    write_idx(p, 1, 0x801, 1, ld, syn_lab, 4);
    CHECK_STATUS(ts_dataset_load_mnist(d2, "train", &ds), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("train-images-idx3-ubyte.gz has 5 images");
    CHECK_ERR_MENTIONS("train-labels-idx1-ubyte.gz has 4 labels");

    /* a truncated images file is reported through the dataset loader too */
    const char *d3 = subdir("trunc_ds");
    make_synthetic(d3, "t10k", 0, "");
    uint32_t idims[3] = {SN, SH, SW};
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", d3);
    write_idx(p, 0, 0x803, 3, idims, syn_pix, 10);
    CHECK_STATUS(ts_dataset_load_mnist(d3, "test", &ds), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("t10k-images-idx3-ubyte: truncated: expected 60 bytes of pixels, got 10");
}

static const char *real_dir(void) {
    const char *e = getenv("TS_FASHION_MNIST_DIR");
    return e ? e : "/usr/share/datasets/fashion-mnist";
}

static void test_real_fashion_mnist(void) {
    char p[400];
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte.gz", real_dir());
    if (access(p, R_OK) != 0) {
        fprintf(stderr, "skipping: %s not found\n", p);
        real_data_missing = 1;
        return;
    }
    ts_dataset *ds = NULL;
    double t0 = ts_time_now();
    CHECK_OK(ts_dataset_load_mnist(real_dir(), "test", &ds));
    if (!ds) return;
    fprintf(stderr, "  loaded the test split in %.3fs\n", ts_time_now() - t0);
    CHECK(ts_dataset_size(ds) == 10000);
    CHECK(ts_dataset_num_classes(ds) == 10);
    int64_t shape[TS_MAX_DIMS];
    CHECK(ts_dataset_sample_shape(ds, shape) == 3 && shape[0] == 1 && shape[1] == 28 && shape[2] == 28);
    ts_tensor *x = NULL, *y = NULL;
    CHECK_OK(ts_dataset_tensors(ds, &x, &y));
    const float *xp = ts_tensor_data_f32(x);
    const int64_t *yp = ts_tensor_data(y);
    int64_t counts[10] = {0}, out_of_range = 0;
    for (int i = 0; i < 10000; i++) {
        if (yp[i] < 0 || yp[i] > 9) out_of_range++;
        else counts[yp[i]]++;
    }
    CHECK(out_of_range == 0);
    for (int c = 0; c < 10; c++) CHECK(counts[c] == 1000);
    double s = 0, s2 = 0;
    int64_t n = ts_tensor_numel(x);
    for (int64_t i = 0; i < n; i++) {
        s += xp[i];
        s2 += (double)xp[i] * xp[i];
    }
    double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
    CHECK_NEAR(mean, 0.0, 0.02);
    CHECK_NEAR(sd, 1.0, 0.05);

    /* a full epoch through the loader is cheap */
    ts_loader_opts o = TS_LOADER_OPTS_INIT;
    o.batch_size = 128;
    o.seed = 42;
    ts_loader *ld = NULL;
    CHECK_OK(ts_loader_new(ds, &o, &ld));
    if (ld) {
        CHECK(ts_loader_num_batches(ld) == 79);
        ts_tensor *bx, *by;
        int64_t nb = 0, seen = 0;
        t0 = ts_time_now();
        while (ts_loader_next(ld, &bx, &by) == TS_OK && bx) {
            nb++;
            seen += ts_tensor_dim(bx, 0);
            CHECK(ts_tensor_ndim(bx) == 4 && ts_tensor_dim(bx, 1) == 1 && ts_tensor_dim(bx, 3) == 28);
        }
        fprintf(stderr, "  one shuffled epoch of 10000 in %.4fs\n", ts_time_now() - t0);
        CHECK(nb == 79 && seen == 10000);
    }
    ts_loader_free(ld);
    ts_dataset_free(ds);

    ds = NULL;
    CHECK_OK(ts_dataset_load_mnist(real_dir(), "train", &ds));
    CHECK(ts_dataset_size(ds) == 60000);
    ts_dataset_free(ds);
}

/* ---- loader over a vtable dataset: sample i is D values equal to i, label i ------------------ */
enum { VD = 6 };
typedef struct {
    int64_t n;
    int gets;
} vt_impl;
static int64_t vt_size(void *impl) { return ((vt_impl *)impl)->n; }
static ts_status vt_get(void *impl, int64_t i, float *x, int64_t *y) {
    ((vt_impl *)impl)->gets++;
    for (int k = 0; k < VD; k++) x[k] = (float)i;
    *y = i;
    return TS_OK;
}
static const ts_dataset_ops vt_ops = {.size = vt_size, .get = vt_get, .destroy = free};

static ts_dataset *vt_dataset(int64_t n) {
    vt_impl *m = calloc(1, sizeof *m);
    m->n = n;
    ts_dataset *ds = NULL;
    int64_t shape[2] = {2, 3};
    CHECK_OK(ts_dataset_new(&vt_ops, m, 2, shape, 0, &ds));
    return ds;
}

/* Runs the rest of the loader's epoch, appending labels to seq (cap entries) and
 * checking x rows agree with labels. Returns the number of samples; sizes gets batch sizes. */
static int64_t drain(ts_loader *ld, int64_t *seq, int64_t cap, int64_t *sizes, int64_t *nbatches) {
    ts_tensor *x, *y;
    int64_t n = 0, nb = 0;
    while (ts_loader_next(ld, &x, &y) == TS_OK && x) {
        int64_t b = ts_tensor_dim(y, 0);
        CHECK(ts_tensor_dim(x, 0) == b && ts_tensor_dim(x, 1) == 2 && ts_tensor_dim(x, 2) == 3);
        CHECK(ts_tensor_dtype(x) == TS_F32 && ts_tensor_dtype(y) == TS_I64);
        const float *xp = ts_tensor_data_f32(x);
        const int64_t *yp = ts_tensor_data(y);
        for (int64_t k = 0; k < b; k++) {
            if (n < cap) seq[n] = yp[k];
            n++;
            int ok = 1;
            for (int j = 0; j < VD; j++) ok &= xp[k * VD + j] == (float)yp[k];
            CHECK(ok);
        }
        if (sizes) sizes[nb] = b;
        nb++;
    }
    if (nbatches) *nbatches = nb;
    return n;
}

static void test_loader(void) {
    enum { N = 103, B = 10 };
    ts_dataset *ds = vt_dataset(N);
    if (!ds) return;
    CHECK(ts_dataset_size(ds) == N && ts_dataset_sample_numel(ds) == VD);
    ts_loader_opts o = TS_LOADER_OPTS_INIT;
    o.batch_size = B;
    o.seed = 7;
    ts_loader *a = NULL, *b = NULL;
    CHECK_OK(ts_loader_new(ds, &o, &a));
    CHECK_OK(ts_loader_new(ds, &o, &b));
    if (!a || !b) goto out;
    CHECK(ts_loader_num_batches(a) == 11);

    int64_t s0[N], s1[N], sb[N], sizes[16], nb = 0;
    /* every index exactly once, last batch of 3 */
    CHECK(drain(a, s0, N, sizes, &nb) == N);
    CHECK(nb == 11 && sizes[0] == B && sizes[10] == 3);
    int seen[N] = {0};
    for (int i = 0; i < N; i++) seen[s0[i]]++;
    int once = 1;
    for (int i = 0; i < N; i++) once &= seen[i] == 1;
    CHECK(once);
    int64_t on = 0;
    const int64_t *ord = ts_loader_order(a, &on);
    CHECK(on == N && memcmp(ord, s0, sizeof s0) == 0);
    /* shuffled at all */
    int identity = 1;
    for (int i = 0; i < N; i++) identity &= s0[i] == i;
    CHECK(!identity);
    /* end of epoch stays at the end */
    ts_tensor *x = (ts_tensor *)1, *y = (ts_tensor *)1;
    CHECK_OK(ts_loader_next(a, &x, &y));
    CHECK(x == NULL && y == NULL);

    /* same seed and epoch: same order (another loader, and the same loader again) */
    CHECK(drain(b, sb, N, NULL, NULL) == N);
    CHECK(memcmp(s0, sb, sizeof s0) == 0);
    CHECK_OK(ts_loader_set_epoch(a, 0, 0));
    drain(a, s1, N, NULL, NULL);
    CHECK(memcmp(s0, s1, sizeof s0) == 0);
    /* a different epoch differs, and is itself reproducible */
    CHECK_OK(ts_loader_set_epoch(a, 1, 0));
    CHECK(ts_loader_epoch(a) == 1);
    drain(a, s1, N, NULL, NULL);
    CHECK(memcmp(s0, s1, sizeof s0) != 0);
    CHECK_OK(ts_loader_set_epoch(b, 1, 0));
    drain(b, sb, N, NULL, NULL);
    CHECK(memcmp(s1, sb, sizeof s1) == 0);

    /* resume mid-epoch at batch 4: the rest of the epoch matches */
    CHECK_OK(ts_loader_set_epoch(b, 1, 4));
    CHECK(ts_loader_batch_index(b) == 4);
    CHECK(drain(b, sb, N, NULL, &nb) == N - 4 * B);
    CHECK(nb == 7);
    CHECK(memcmp(s1 + 4 * B, sb, sizeof(int64_t) * (N - 4 * B)) == 0);
    CHECK(ts_loader_batch_index(b) == 11);
    CHECK_OK(ts_loader_set_epoch(b, 1, 11)); /* at the end: nothing left */
    CHECK(drain(b, sb, N, NULL, NULL) == 0);
    CHECK_STATUS(ts_loader_set_epoch(b, 1, 12), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_loader_set_epoch(b, -1, 0), TS_ERR_INVALID_ARG);
    ts_loader_free(b);
    b = NULL;

    /* a different seed gives a different order */
    o.seed = 8;
    CHECK_OK(ts_loader_new(ds, &o, &b));
    drain(b, sb, N, NULL, NULL);
    CHECK(memcmp(s0, sb, sizeof s0) != 0);
    ts_loader_free(b);
    b = NULL;

    /* drop_last: 10 full batches, 100 distinct samples */
    o.drop_last = true;
    CHECK_OK(ts_loader_new(ds, &o, &b));
    CHECK(ts_loader_num_batches(b) == 10);
    CHECK(drain(b, sb, N, sizes, &nb) == 100);
    CHECK(nb == 10 && sizes[9] == B);
    memset(seen, 0, sizeof seen);
    int dup = 0;
    for (int i = 0; i < 100; i++) dup += seen[sb[i]]++ > 0;
    CHECK(dup == 0);
    ts_loader_free(b);
    b = NULL;

    /* no shuffle: in order; batch larger than the dataset */
    o.drop_last = false;
    o.shuffle = false;
    o.batch_size = 1000;
    CHECK_OK(ts_loader_new(ds, &o, &b));
    CHECK(ts_loader_num_batches(b) == 1);
    CHECK(drain(b, sb, N, sizes, &nb) == N);
    identity = 1;
    for (int i = 0; i < N; i++) identity &= sb[i] == i;
    CHECK(identity && nb == 1 && sizes[0] == N);
    ts_loader_free(b);
    b = NULL;
    o.drop_last = true; /* ... and with drop_last, no batches at all */
    CHECK_OK(ts_loader_new(ds, &o, &b));
    CHECK(ts_loader_num_batches(b) == 0);
    CHECK(drain(b, sb, N, NULL, NULL) == 0);

    o.batch_size = 0;
    ts_loader *bad = NULL;
    CHECK_STATUS(ts_loader_new(ds, &o, &bad), TS_ERR_INVALID_ARG);
    CHECK_STATUS(ts_dataset_set_normalize(ds, 0.f, 1.f), TS_ERR_UNSUPPORTED);
    CHECK_STATUS(ts_dataset_tensors(ds, NULL, NULL), TS_ERR_UNSUPPORTED);
out:
    ts_loader_free(a);
    ts_loader_free(b);
    ts_dataset_free(ds);
}

/* The in-memory dataset's gather path gives the same batches as the per-sample path. */
static void test_from_tensors(void) {
    enum { N = 37 };
    float xs[N * VD];
    int64_t ys[N];
    for (int i = 0; i < N; i++) {
        ys[i] = i;
        for (int k = 0; k < VD; k++) xs[i * VD + k] = (float)i;
    }
    int64_t xshape[3] = {N, 2, 3}, yshape[1] = {N};
    ts_tensor *x = tu_tensor(3, xshape, xs), *y = NULL;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 1, yshape, ys, &y));
    ts_dataset *m = NULL, *v = vt_dataset(N);
    CHECK_OK(ts_dataset_from_tensors(x, y, &m));
    ts_tensor_release(x); /* the dataset keeps its own references */
    ts_tensor_release(y);
    if (!m || !v) goto out;
    CHECK(ts_dataset_num_classes(m) == N);
    ts_loader_opts o = TS_LOADER_OPTS_INIT;
    o.batch_size = 8;
    o.seed = 123;
    ts_loader *la = NULL, *lb = NULL;
    CHECK_OK(ts_loader_new(m, &o, &la));
    CHECK_OK(ts_loader_new(v, &o, &lb));
    for (int e = 0; e < 3 && la && lb; e++) {
        int64_t sa[N], sb[N];
        CHECK_OK(ts_loader_set_epoch(la, e, 0));
        CHECK_OK(ts_loader_set_epoch(lb, e, 0));
        CHECK(drain(la, sa, N, NULL, NULL) == N);
        CHECK(drain(lb, sb, N, NULL, NULL) == N);
        CHECK(memcmp(sa, sb, sizeof sa) == 0);
    }
    ts_loader_free(la);
    ts_loader_free(lb);
    /* affine re-normalisation of float data */
    CHECK_OK(ts_dataset_set_normalize(m, 1.0f, 2.0f));
    ts_tensor *mx = NULL;
    CHECK_OK(ts_dataset_tensors(m, &mx, NULL));
    CHECK_NEAR(ts_tensor_data_f32(mx)[VD * 5], 2.0, 1e-6);
    /* bad inputs */
    ts_dataset *bad = NULL;
    CHECK_STATUS(ts_dataset_from_tensors(mx, mx, &bad), TS_ERR_DTYPE);
out:
    ts_dataset_free(m);
    ts_dataset_free(v);
}


/* ---- hostile IDX files and data sets ------------------------------------------------------------- */
static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_data: blocked on a FIFO\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

/* Headers that promise more than the file can hold are refused before any allocation. */
static void test_idx_size_limits(void) {
    const char *d = subdir("limits");
    char p[400];
    uint8_t data[64] = {0};
    /* a 40-byte .gz whose header asks for 65535 x 65535 x 64 images (256 GiB) */
    uint32_t huge[3] = {65535, 65535, 64};
    snprintf(p, sizeof p, "%s/huge-idx3-ubyte.gz", d);
    write_idx(p, 1, 0x803, 3, huge, data, 0);
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && sb.st_size < 64);
    double t0 = ts_time_now();
    expect_idx_error(p, 3, TS_ERR_FORMAT, "dimensions 65535 x 65535 x 64 promise more than 17179869184 bytes");
    /* ... and one asking for 1 GiB, under that limit: deflate cannot expand 40 bytes that far */
    uint32_t gib[3] = {65536, 128, 128};
    write_idx(p, 1, 0x803, 3, gib, data, 0);
    expect_idx_error(p, 3, TS_ERR_FORMAT, "promises 1073741824 bytes of pixels (65536 x 128 x 128), more than a");
    CHECK_ERR_MENTIONS("gzip file can hold (deflate expands at most 1032:1)");
    CHECK(ts_time_now() - t0 < 1.0);
    /* over the absolute limit, also for a file that could hold it */
    uint32_t big[3] = {1000, 100, 100};
    snprintf(p, sizeof p, "%s/big-idx3-ubyte", d);
    write_idx(p, 0, 0x803, 3, big, data, 0);
    setenv("TS_IDX_MAX_BYTES", "1m", 1);
    expect_idx_error(p, 3, TS_ERR_FORMAT, "TS_IDX_MAX_BYTES");
    unsetenv("TS_IDX_MAX_BYTES");
    expect_idx_error(p, 3, TS_ERR_FORMAT, "truncated: expected 10000000 bytes of pixels, got 0");
    /* a plain file shorter than its header says, named with its dimensions */
    uint32_t small[3] = {4, 4, 4};
    snprintf(p, sizeof p, "%s/short-idx3-ubyte", d);
    write_idx(p, 0, 0x803, 3, small, data, 63);
    expect_idx_error(p, 3, TS_ERR_FORMAT, "truncated: expected 64 bytes of pixels, got 63 (dimensions 4 x 4 x 4)");
    /* FIFOs and devices are refused without blocking */
    signal(SIGALRM, on_alarm);
    alarm(20);
    snprintf(p, sizeof p, "%s/fifo-idx3-ubyte", d);
    CHECK(mkfifo(p, 0600) == 0);
    expect_idx_error(p, 3, TS_ERR_IO, "is a FIFO");
    expect_idx_error("/dev/zero", 3, TS_ERR_IO, "is a character device");
    alarm(0);
}

/* ts_data_open: empty sets and test labels that are no class of the training set are errors. */
static void test_data_open_checks(void) {
    ts_data_opts o = TS_DATA_OPTS_INIT;
    ts_batch_source *train = NULL, *test = NULL;
    char p[400];
    /* test labels 0..4 against training labels 0..2 */
    const char *d = subdir("open_labels");
    make_synthetic(d, "t10k", 1, ".gz");
    uint8_t lab[SN] = {0, 1, 2, 0, 1};
    uint32_t ld[1] = {SN}, idims[3] = {SN, SH, SW};
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", d);
    write_idx(p, 1, 0x803, 3, idims, syn_pix, sizeof syn_pix);
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", d);
    write_idx(p, 1, 0x801, 1, ld, lab, SN);
    o.path = d;
    CHECK_STATUS(ts_data_open(&o, &train, &test), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("t10k-labels-idx1-ubyte: sample 3 has label 3, but the training set has 3 classes");
    CHECK(!train && !test);
    /* without an evaluation source the training set alone is fine */
    CHECK_OK(ts_data_open(&o, &train, NULL));
    ts_batch_source_free(train);
    train = NULL;
    /* label 255 */
    lab[2] = 255;
    write_idx(p, 1, 0x801, 1, ld, lab, SN);
    CHECK_STATUS(ts_data_open(&o, &train, &test), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("sample 2 has label 255");
    /* an empty training set, then an empty test set */
    const char *e = subdir("open_empty");
    make_synthetic(e, "t10k", 0, "");
    uint32_t z3[3] = {0, SH, SW}, z1[1] = {0};
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte", e);
    write_idx(p, 0, 0x803, 3, z3, syn_pix, 0);
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte", e);
    write_idx(p, 0, 0x801, 1, z1, syn_lab, 0);
    o.path = e;
    CHECK_STATUS(ts_data_open(&o, &train, &test), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("the training set (train-images-idx3-ubyte) is empty: 0 samples");
    make_synthetic(e, "train", 0, "");
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", e);
    write_idx(p, 0, 0x803, 3, z3, syn_pix, 0);
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", e);
    write_idx(p, 0, 0x801, 1, z1, syn_lab, 0);
    CHECK_STATUS(ts_data_open(&o, &train, &test), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("the test set (t10k-images-idx3-ubyte) is empty");
    CHECK(!train && !test);
}


/* ---- class names: classes.txt, Fashion-MNIST recognised by its content ------------------------------ */
static void write_text(const char *dir, const char *name, const char *text) {
    char p[400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_bytes(p, text, strlen(text), 0);
}

static void test_class_names_txt(void) {
    const char *d = subdir("names");
    make_synthetic(d, "train", 0, ""); /* labels 0..4 */
    ts_dataset *ds = NULL;
    CHECK_OK(ts_dataset_load_mnist(d, "train", &ds));
    CHECK(ds && ts_dataset_num_classes(ds) == 5 && ts_dataset_class_name(ds, 0) == NULL); /* unnamed */
    ts_dataset_free(ds);

    /* one name per line, "\r\n" endings, a final newline; more names than the labels use: 6 classes */
    write_text(d, "classes.txt", "zero\r\none\ntwo words\nthree\nfour\nfive\n");
    ds = NULL;
    CHECK_OK(ts_dataset_load_mnist(d, "train", &ds));
    if (ds) {
        CHECK(ts_dataset_num_classes(ds) == 6);
        CHECK(ts_dataset_class_name(ds, 0) && strcmp(ts_dataset_class_name(ds, 0), "zero") == 0);
        CHECK(ts_dataset_class_name(ds, 2) && strcmp(ts_dataset_class_name(ds, 2), "two words") == 0);
        CHECK(ts_dataset_class_name(ds, 5) && strcmp(ts_dataset_class_name(ds, 5), "five") == 0);
        CHECK(ts_dataset_class_name(ds, 6) == NULL && ts_dataset_class_name(ds, -1) == NULL);
        /* the names must cover the classes; none may hold a newline */
        const char *few[2] = {"a", "b"}, *nl[6] = {"a", "b", "c\nd", "e", "f", "g"};
        CHECK_STATUS(ts_dataset_set_class_names(ds, few, 2), TS_ERR_INVALID_ARG);
        CHECK_STATUS(ts_dataset_set_class_names(ds, nl, 6), TS_ERR_INVALID_ARG);
        CHECK(strcmp(ts_dataset_class_name(ds, 0), "zero") == 0); /* unchanged by the refusals */
        CHECK_OK(ts_dataset_set_class_names(ds, NULL, 0));
        CHECK(ts_dataset_class_name(ds, 0) == NULL);
    }
    ts_dataset_free(ds);
    /* the pipeline's reader over the same IDX files sees the same names */
    ts_reader_opts ro = TS_READER_OPTS_INIT;
    ro.idx_dir = d;
    ts_reader *r = NULL;
    CHECK_OK(ts_reader_new(&ro, &r));
    if (r) {
        CHECK(ts_reader_num_classes(r) == 6);
        CHECK(ts_reader_class_name(r, 1) && strcmp(ts_reader_class_name(r, 1), "one") == 0);
    }
    ts_reader_free(r);

    /* errors name the file and line */
    write_text(d, "classes.txt", "zero\none\ntwo\n");
    ds = NULL;
    CHECK_STATUS(ts_dataset_load_mnist(d, "train", &ds), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("classes.txt names 3 classes, but a label is 4");
    CHECK(ds == NULL);
    r = NULL;
    CHECK_STATUS(ts_reader_new(&ro, &r), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("classes.txt names 3 classes");
    write_text(d, "classes.txt", "zero\n\ntwo\nthree\nfour\n");
    CHECK_STATUS(ts_dataset_load_mnist(d, "train", &ds), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("classes.txt:2: empty line");
    write_text(d, "classes.txt", "");
    CHECK_STATUS(ts_dataset_load_mnist(d, "train", &ds), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("no class names");
    char p[400];
    snprintf(p, sizeof p, "%s/classes.txt", d);
    unlink(p);
}

static void test_class_names_match(void) {
    CHECK(ts_class_names_match("Sneaker", "7_sneaker", 7));   /* `tessera data export`'s folder for label 7 */
    CHECK(ts_class_names_match("T-shirt/top", "0_tshirt_top", 0));
    CHECK(ts_class_names_match("Ankle boot", "9_ankle_boot", 9));
    CHECK(ts_class_names_match("3_dress", "3_dress", 3));
    CHECK(!ts_class_names_match("Sneaker", "6_sneaker", 7)); /* another label's folder */
    CHECK(!ts_class_names_match("3_dress", "3_gown", 3));
    CHECK(!ts_class_names_match("_", "-", 0)); /* nothing to compare */
    CHECK(!ts_class_names_match(NULL, "a", 0));
}

/* Fashion-MNIST is recognised by the SHA-256 of its labels and first image, both splits, through the dataset
 * and the reader; a copy that differs in one label, or in one pixel of the first image, is not. */
static void test_class_names_fashion_mnist(void) {
    char p[400];
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte.gz", real_dir());
    if (access(p, R_OK) != 0) {
        real_data_missing = 1;
        return;
    }
    static const char *const want[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                         "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
    for (int split = 0; split < 2; split++) {
        ts_dataset *ds = NULL;
        CHECK_OK(ts_dataset_load_mnist(real_dir(), split ? "train" : "test", &ds));
        for (int k = 0; ds && k < 10; k++)
            CHECK(ts_dataset_class_name(ds, k) && strcmp(ts_dataset_class_name(ds, k), want[k]) == 0);
        ts_dataset_free(ds);
    }
    ts_reader_opts ro = TS_READER_OPTS_INIT;
    ro.idx_dir = real_dir();
    ro.idx_split = "test";
    ts_reader *r = NULL;
    CHECK_OK(ts_reader_new(&ro, &r));
    CHECK(r && ts_reader_class_name(r, 7) && strcmp(ts_reader_class_name(r, 7), "Sneaker") == 0);
    ts_reader_free(r);

    ts_tensor *img = NULL, *lab = NULL;
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte.gz", real_dir());
    CHECK_OK(ts_idx_read(p, 3, &img));
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte.gz", real_dir());
    CHECK_OK(ts_idx_read(p, 1, &lab));
    if (!img || !lab) return;
    uint8_t *px = ts_tensor_data(img), *lb = ts_tensor_data(lab);
    uint32_t idims[3] = {10000, 28, 28}, ldims[1] = {10000};
    const char *d = subdir("fm_copy");
    for (int variant = 0; variant < 3; variant++) { /* 0: an exact copy (plain files); 1: a label; 2: a pixel */
        if (variant == 1) lb[5000] = (uint8_t)((lb[5000] + 1) % 10);
        if (variant == 2) {
            lb[5000] = (uint8_t)((lb[5000] + 9) % 10);
            px[400] ^= 1;
        }
        snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", d);
        write_idx(p, 0, 0x803, 3, idims, px, 10000 * 784);
        snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", d);
        write_idx(p, 0, 0x801, 1, ldims, lb, 10000);
        ts_dataset *ds = NULL;
        CHECK_OK(ts_dataset_load_mnist(d, "test", &ds));
        const char *nm = ds ? ts_dataset_class_name(ds, 7) : NULL;
        if (variant == 0)
            CHECK(nm && strcmp(nm, "Sneaker") == 0);
        else
            CHECK(nm == NULL);
        ts_dataset_free(ds);
    }
    ts_tensor_release(img);
    ts_tensor_release(lab);
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {T(test_synthetic_gz_and_plain), T(test_idx_errors),      T(test_mnist_errors),
                                    T(test_real_fashion_mnist),     T(test_loader),          T(test_from_tensors),
                                    T(test_idx_size_limits),        T(test_data_open_checks),
                                    T(test_class_names_txt),        T(test_class_names_match),
                                    T(test_class_names_fashion_mnist)};
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tu_rm_tmpdir();
    if (rc == 0 && real_data_missing) {
        printf("Fashion-MNIST not found under %s: real-data checks skipped\n", real_dir());
        return 77;
    }
    return rc;
}
