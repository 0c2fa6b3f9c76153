/* Checkpoint files: round trips, corruption, truncation and atomic saves. */
#include "test_util.h"

#include "io/ckpt_internal.h"

#include <dirent.h>
#include <sys/wait.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>


static const char *tpath(const char *name) {
    static char bufs[8][400];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%.255s/%.100s", tu_tmpdir(), name);
    return b;
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) abort();
}

static ts_tensor *make(ts_dtype dt, int ndim, const int64_t *shape, ts_rng *r) {
    ts_tensor *t = NULL;
    if (ts_tensor_empty(NULL, dt, ndim, shape, &t) != TS_OK) abort();
    unsigned char *p = ts_tensor_data(t);
    for (size_t i = 0; i < ts_tensor_nbytes(t); i++) p[i] = (unsigned char)ts_rng_u32(r);
    if (dt == TS_F32) /* finite values, so equality checks read naturally */
        for (int64_t i = 0; i < ts_tensor_numel(t); i++) ts_tensor_data_f32(t)[i] = (float)ts_rng_normal(r);
    return t;
}

static bool same_tensor(ts_tensor *a, ts_tensor *b) {
    if (!a || !b || ts_tensor_dtype(a) != ts_tensor_dtype(b) || ts_tensor_ndim(a) != ts_tensor_ndim(b)) return false;
    for (int i = 0; i < ts_tensor_ndim(a); i++)
        if (ts_tensor_dim(a, i) != ts_tensor_dim(b, i)) return false;
    return ts_tensor_nbytes(a) == ts_tensor_nbytes(b) &&
           memcmp(ts_tensor_data(a), ts_tensor_data(b), ts_tensor_nbytes(a)) == 0;
}

/* A checkpoint with model.* and optim.* tensors of several dtypes and all metadata kinds. */
static ts_ckpt *build(ts_tensor_list *model, ts_tensor_list *optim) {
    ts_rng r;
    ts_rng_seed(&r, 99);
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s22[2] = {2, 2}, s5[1] = {5}, s3[1] = {3}, s04[2] = {0, 4},
            s4d[4] = {2, 1, 3, 3};
    struct {
        const char *name;
        ts_dtype dt;
        int nd;
        const int64_t *shape;
        ts_tensor_list *l;
    } spec[] = {
        {"fc.weight", TS_F32, 2, s23, model}, {"fc.bias", TS_F32, 1, s3, model},
        {"conv.weight", TS_F32, 4, s4d, model}, {"bn.num_batches", TS_I64, 1, s4, model},
        {"scalar", TS_F32, 0, NULL, model}, {"empty", TS_F32, 2, s04, model},
        {"fc.weight.m", TS_I32, 2, s22, optim}, {"mask", TS_U8, 1, s5, optim},
        {"half", TS_BF16, 1, s3, optim}, {"f16", TS_F16, 1, s3, optim},
    };
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        ts_tensor *t = make(spec[i].dt, spec[i].nd, spec[i].shape, &r);
        CHECK_OK(ts_tensor_list_append(spec[i].l, spec[i].name, t));
        ts_tensor_release(t);
    }
    ts_ckpt *ck = ts_ckpt_new();
    CHECK_OK(ts_ckpt_add_tensors(ck, "model.", model));
    CHECK_OK(ts_ckpt_add_tensors(ck, "optim.", optim));
    CHECK_OK(ts_ckpt_set_i64(ck, "epoch", 3));
    CHECK_OK(ts_ckpt_set_i64(ck, "step", -5));
    CHECK_OK(ts_ckpt_set_i64(ck, "min", INT64_MIN));
    CHECK_OK(ts_ckpt_set_f64(ck, "lr", 0.1));
    CHECK_OK(ts_ckpt_set_f64(ck, "negzero", -0.0));
    CHECK_OK(ts_ckpt_set_f64(ck, "inf", INFINITY));
    unsigned char blob[40];
    for (int i = 0; i < 40; i++) blob[i] = (unsigned char)(i * 37);
    blob[3] = 0;
    CHECK_OK(ts_ckpt_set_bytes(ck, "rng", blob, sizeof blob));
    CHECK_OK(ts_ckpt_set_bytes(ck, "empty", NULL, 0));
    const char *json = "{\"model\": \"mlp\", \"lr\": 0.1}";
    CHECK_OK(ts_ckpt_set_bytes(ck, "config", json, strlen(json)));
    return ck;
}

static void check_loaded(ts_ckpt *ck, ts_tensor_list *model, ts_tensor_list *optim) {
    CHECK(ts_ckpt_version(ck) == TS_CKPT_VERSION);
    int64_t v = 0;
    CHECK_OK(ts_ckpt_get_i64(ck, "epoch", &v));
    CHECK(v == 3);
    CHECK_OK(ts_ckpt_get_i64(ck, "step", &v));
    CHECK(v == -5);
    CHECK_OK(ts_ckpt_get_i64(ck, "min", &v));
    CHECK(v == INT64_MIN);
    double d = 0;
    CHECK_OK(ts_ckpt_get_f64(ck, "lr", &d));
    CHECK(d == 0.1);
    CHECK_OK(ts_ckpt_get_f64(ck, "negzero", &d));
    CHECK(d == 0.0 && signbit(d));
    CHECK_OK(ts_ckpt_get_f64(ck, "inf", &d));
    CHECK(isinf(d) && d > 0);
    const void *p = NULL;
    size_t n = 0;
    CHECK_OK(ts_ckpt_get_bytes(ck, "rng", &p, &n));
    CHECK(n == 40 && p && ((const unsigned char *)p)[3] == 0 && ((const unsigned char *)p)[39] == (unsigned char)(39 * 37));
    CHECK_OK(ts_ckpt_get_bytes(ck, "empty", &p, &n));
    CHECK(n == 0);
    CHECK_OK(ts_ckpt_get_bytes(ck, "config", &p, &n));
    CHECK(n == strlen("{\"model\": \"mlp\", \"lr\": 0.1}") && memcmp(p, "{\"model\"", 8) == 0);
    CHECK(ts_ckpt_count(ck, TS_CKPT_I64) == 3 && ts_ckpt_count(ck, TS_CKPT_F64) == 3);
    CHECK(ts_ckpt_count(ck, TS_CKPT_BYTES) == 3 && ts_ckpt_count(ck, TS_CKPT_TENSOR) == model->n + optim->n);
    CHECK(ts_ckpt_name(ck, TS_CKPT_I64, 0) && strcmp(ts_ckpt_name(ck, TS_CKPT_I64, 0), "epoch") == 0);
    CHECK(ts_ckpt_name(ck, TS_CKPT_I64, 3) == NULL);
    CHECK(ts_ckpt_has(ck, TS_CKPT_F64, "lr") && !ts_ckpt_has(ck, TS_CKPT_I64, "lr"));

    ts_tensor_list m = TS_TENSOR_LIST_INIT, o = TS_TENSOR_LIST_INIT, all = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_ckpt_get_tensors(ck, "model.", &m));
    CHECK_OK(ts_ckpt_get_tensors(ck, "optim.", &o));
    CHECK_OK(ts_ckpt_get_tensors(ck, NULL, &all));
    CHECK(m.n == model->n && o.n == optim->n && all.n == model->n + optim->n);
    for (int i = 0; i < model->n && i < m.n; i++) {
        CHECK(strcmp(m.names[i], model->names[i]) == 0);
        CHECK(same_tensor(m.tensors[i], model->tensors[i]));
        CHECK(ts_tensor_device(m.tensors[i]) == ts_device_cpu());
    }
    for (int i = 0; i < optim->n && i < o.n; i++) {
        CHECK(strcmp(o.names[i], optim->names[i]) == 0);
        CHECK(same_tensor(o.tensors[i], optim->tensors[i]));
    }
    CHECK(ts_ckpt_find_tensor(ck, "model.fc.bias") == m.tensors[1]);
    ts_tensor_list_clear(&m);
    ts_tensor_list_clear(&o);
    ts_tensor_list_clear(&all);
}

static void test_round_trip(void) {
    ts_tensor_list model = TS_TENSOR_LIST_INIT, optim = TS_TENSOR_LIST_INIT;
    ts_ckpt *ck = build(&model, &optim);
    const char *path = tpath("rt.ckpt");
    CHECK_OK(ts_ckpt_save(ck, path));
    check_loaded(ck, &model, &optim); /* the in-memory object answers the same */
    ts_ckpt_free(ck);

    ts_ckpt *back = NULL;
    CHECK_OK(ts_ckpt_load(path, &back));
    if (back) check_loaded(back, &model, &optim);
    /* tensors handed out outlive the checkpoint */
    ts_tensor_list keep = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_ckpt_get_tensors(back, "model.fc.", &keep));
    CHECK(keep.n == 2 && strcmp(keep.names[0], "weight") == 0);
    /* saving a loaded checkpoint reproduces the file byte for byte */
    const char *path2 = tpath("rt2.ckpt");
    CHECK_OK(ts_ckpt_save(back, path2));
    ts_ckpt_free(back);
    CHECK(keep.n == 2 && same_tensor(keep.tensors[0], model.tensors[0]));
    ts_tensor_list_clear(&keep);
    size_t n1 = 0, n2 = 0;
    unsigned char *a = read_file(path, &n1), *b = read_file(path2, &n2);
    CHECK(a && b && n1 == n2 && memcmp(a, b, n1) == 0);
    CHECK(n1 > 8 && memcmp(a, "TSCKPT\0\1", 8) == 0);
    free(a);
    free(b);

    /* an empty checkpoint */
    ts_ckpt *e = ts_ckpt_new();
    CHECK_OK(ts_ckpt_save(e, path2));
    ts_ckpt_free(e);
    e = NULL;
    CHECK_OK(ts_ckpt_load(path2, &e));
    CHECK(e && ts_ckpt_count(e, TS_CKPT_TENSOR) == 0 && ts_ckpt_count(e, TS_CKPT_I64) == 0);
    ts_ckpt_free(e);
    ts_tensor_list_clear(&model);
    ts_tensor_list_clear(&optim);
}

static void test_api_errors(void) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    int64_t s[1] = {2};
    float v[2] = {1, 2};
    ts_tensor *t = tu_tensor(1, s, v);
    CHECK_OK(ts_tensor_list_append(&l, "w", t));
    CHECK_OK(ts_tensor_list_append(&l, "b", t));
    ts_ckpt *ck = ts_ckpt_new();
    CHECK_OK(ts_ckpt_add_tensors(ck, "m.", &l));
    CHECK_STATUS(ts_ckpt_add_tensors(ck, "m.", &l), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("m.w");
    CHECK(ts_ckpt_count(ck, TS_CKPT_TENSOR) == 2); /* nothing added by the failed call */
    CHECK_OK(ts_tensor_list_append(&l, "w", t));   /* a duplicate inside one list */
    CHECK_STATUS(ts_ckpt_add_tensors(ck, "n.", &l), TS_ERR_INVALID_ARG);
    CHECK(ts_ckpt_count(ck, TS_CKPT_TENSOR) == 2);
    int64_t x = 0;
    CHECK_STATUS(ts_ckpt_get_i64(ck, "epoch", &x), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("epoch");
    CHECK_OK(ts_ckpt_set_i64(ck, "epoch", 1));
    CHECK_OK(ts_ckpt_set_i64(ck, "epoch", 2)); /* replaces */
    CHECK_OK(ts_ckpt_get_i64(ck, "epoch", &x));
    CHECK(x == 2 && ts_ckpt_count(ck, TS_CKPT_I64) == 1);
    double d;
    CHECK_STATUS(ts_ckpt_get_f64(ck, "epoch", &d), TS_ERR_INVALID_ARG); /* kinds are separate */
    CHECK_OK(ts_ckpt_set_bytes(ck, "b", "abc", 3));
    CHECK_OK(ts_ckpt_set_bytes(ck, "b", "de", 2));
    const void *p;
    size_t n;
    CHECK_OK(ts_ckpt_get_bytes(ck, "b", &p, &n));
    CHECK(n == 2 && memcmp(p, "de", 2) == 0);
    ts_ckpt *none = NULL;
    CHECK_STATUS(ts_ckpt_load(tpath("does-not-exist.ckpt"), &none), TS_ERR_IO);
    CHECK_ERR_MENTIONS("does-not-exist.ckpt");
    CHECK_ERR_MENTIONS("No such file");
    ts_ckpt_free(ck);
    ts_tensor_list_clear(&l);
    ts_tensor_release(t);
}

/* Saves a small checkpoint to `name`; returns its bytes. */
static unsigned char *small_file(const char *name, size_t *n) {
    ts_tensor_list model = TS_TENSOR_LIST_INIT, optim = TS_TENSOR_LIST_INIT;
    ts_ckpt *ck = build(&model, &optim);
    CHECK_OK(ts_ckpt_save(ck, tpath(name)));
    ts_ckpt_free(ck);
    ts_tensor_list_clear(&model);
    ts_tensor_list_clear(&optim);
    return read_file(tpath(name), n);
}

static void test_truncation(void) {
    size_t n = 0;
    unsigned char *full = small_file("full.ckpt", &n);
    if (!full) return;
    const char *p = tpath("cut.ckpt");
    int wrong = 0;
    for (size_t len = 0; len < n; len++) {
        write_file(p, full, len);
        ts_ckpt *ck = NULL;
        ts_status st = ts_ckpt_load(p, &ck);
        if (st != TS_ERR_FORMAT || ck || !strstr(ts_last_error(), "truncated") || !strstr(ts_last_error(), p)) {
            if (wrong++ < 5) fprintf(stderr, "  cut at %zu: %s: %s\n", len, ts_status_name(st), ts_last_error());
        }
        ts_ckpt_free(ck);
    }
    CHECK(wrong == 0);
    /* one byte too many */
    unsigned char *more = malloc(n + 1);
    memcpy(more, full, n);
    more[n] = 0;
    write_file(p, more, n + 1);
    ts_ckpt *ck = NULL;
    CHECK_STATUS(ts_ckpt_load(p, &ck), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("trailing data");
    free(more);
    free(full);
}

static void test_corruption(void) {
    size_t n = 0;
    unsigned char *full = small_file("good.ckpt", &n);
    if (!full) return;
    const char *p = tpath("flip.ckpt");
    int wrong = 0;
    for (size_t off = 0; off < n; off++) {
        for (int bit = 0; bit < 8; bit += 7) { /* lowest and highest bit of every byte */
            full[off] ^= (unsigned char)(1u << bit);
            write_file(p, full, n);
            full[off] ^= (unsigned char)(1u << bit);
            ts_ckpt *ck = NULL;
            ts_status st = ts_ckpt_load(p, &ck);
            const char *want = off < 8 ? "bad magic" : "checksum mismatch";
            if (st != TS_ERR_FORMAT || ck || !strstr(ts_last_error(), want) || !strstr(ts_last_error(), p)) {
                if (wrong++ < 5)
                    fprintf(stderr, "  flip at %zu bit %d: %s: %s\n", off, bit, ts_status_name(st), ts_last_error());
            }
            ts_ckpt_free(ck);
        }
    }
    CHECK(wrong == 0);
    free(full);
}

/* A hand-made file: version v, optional unknown section before an I64 section. */
static size_t craft(unsigned char *buf, uint32_t version, int unknown) {
    size_t o = 32;
    uint32_t nsec = 1;
    if (unknown) {
        memcpy(buf + o, "ZZZZ", 4);
        uint32_t c = 1;
        uint64_t b = 5;
        memcpy(buf + o + 4, &c, 4);
        memcpy(buf + o + 8, &b, 8);
        memcpy(buf + o + 16, "hello", 5);
        o += 21;
        nsec++;
    }
    uint32_t c = 1, nl = 5;
    uint64_t b = 4 + 5 + 8;
    int64_t val = 42;
    memcpy(buf + o, "I64 ", 4);
    memcpy(buf + o + 4, &c, 4);
    memcpy(buf + o + 8, &b, 8);
    memcpy(buf + o + 16, &nl, 4);
    memcpy(buf + o + 20, "epoch", 5);
    memcpy(buf + o + 25, &val, 8);
    o += 33;
    uint64_t size = o + 4;
    uint32_t flags = 0;
    memcpy(buf, "TSCKPT\0\1", 8);
    memcpy(buf + 8, &version, 4);
    memcpy(buf + 12, &flags, 4);
    memcpy(buf + 16, &size, 8);
    memcpy(buf + 24, &nsec, 4);
    uint32_t hc = (uint32_t)crc32(0, buf, 28);
    memcpy(buf + 28, &hc, 4);
    uint32_t fc = (uint32_t)crc32(0, buf, (uInt)o);
    memcpy(buf + o, &fc, 4);
    return o + 4;
}

static void test_versions_and_sections(void) {
    unsigned char buf[256];
    const char *p = tpath("crafted.ckpt");
    size_t n = craft(buf, 1, 1);
    write_file(p, buf, n);
    ts_ckpt *ck = NULL;
    CHECK_OK(ts_ckpt_load(p, &ck)); /* the unknown section is skipped */
    int64_t v = 0;
    if (ck) CHECK_OK(ts_ckpt_get_i64(ck, "epoch", &v));
    CHECK(v == 42);
    ts_ckpt_free(ck);
    ck = NULL;
    n = craft(buf, 2, 0);
    write_file(p, buf, n);
    CHECK_STATUS(ts_ckpt_load(p, &ck), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("version 2");
    CHECK_ERR_MENTIONS("1");
    CHECK_ERR_MENTIONS(p);
    write_file(p, "PK\3\4 this is a zip file, not a checkpoint........", 50);
    CHECK_STATUS(ts_ckpt_load(p, &ck), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("bad magic");
}

/* A flag bit this build does not know makes the file unreadable, naming the bits. */
static void test_unknown_flags(void) {
    unsigned char buf[256];
    const char *p = tpath("flags.ckpt");
    size_t n = craft(buf, 1, 0);
    uint32_t flags = 0x10004;
    memcpy(buf + 12, &flags, 4);
    uint32_t hc = (uint32_t)crc32(0, buf, 28);
    memcpy(buf + 28, &hc, 4);
    uint32_t fc = (uint32_t)crc32(0, buf, (uInt)(n - 4));
    memcpy(buf + n - 4, &fc, 4);
    write_file(p, buf, n);
    ts_ckpt *ck = NULL;
    CHECK_STATUS(ts_ckpt_load(p, &ck), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("unknown header flag bits 0x00010004");
    CHECK_ERR_MENTIONS(p);
    CHECK(ck == NULL);
    CHECK_STATUS(ts_ckpt_load_meta(p, &ck), TS_ERR_UNSUPPORTED);
}

/* ts_ckpt_load_meta: the metadata without the tensors, and no whole-file CRC. */
static void test_load_meta(void) {
    ts_tensor_list model = TS_TENSOR_LIST_INIT, optim = TS_TENSOR_LIST_INIT;
    ts_ckpt *ck = build(&model, &optim);
    const char *path = tpath("meta.ckpt");
    CHECK_OK(ts_ckpt_save(ck, path));
    int ni = ts_ckpt_count(ck, TS_CKPT_I64), nb = ts_ckpt_count(ck, TS_CKPT_BYTES);
    ts_ckpt_free(ck);
    ts_ckpt *m = NULL;
    CHECK_OK(ts_ckpt_load_meta(path, &m));
    CHECK(m && ts_ckpt_count(m, TS_CKPT_TENSOR) == 0 && ts_ckpt_count(m, TS_CKPT_I64) == ni &&
          ts_ckpt_count(m, TS_CKPT_BYTES) == nb && ni > 0);
    ts_ckpt_free(m);
    /* a flipped byte in the tensor data: ts_ckpt_load says so, the metadata still reads */
    size_t n = 0;
    unsigned char *b = read_file(path, &n);
    if (b && n > 200) {
        b[100] ^= 1; /* inside the first section, the tensors' */
        write_file(path, b, n);
        m = NULL;
        CHECK_STATUS(ts_ckpt_load(path, &m), TS_ERR_FORMAT);
        CHECK_OK(ts_ckpt_load_meta(path, &m));
        ts_ckpt_free(m);
        m = NULL;
        write_file(path, b, n / 2); /* truncated: the header's length is still checked */
        CHECK_STATUS(ts_ckpt_load_meta(path, &m), TS_ERR_FORMAT);
        CHECK_ERR_MENTIONS("truncated");
    }
    free(b);
    ts_tensor_list_clear(&model);
    ts_tensor_list_clear(&optim);
}

/* Names in the temp dir that start with prefix. */
static int count_entries(const char *prefix) {
    DIR *d = opendir(tu_tmpdir());
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    if (d) closedir(d);
    return n;
}

static void test_failed_save_keeps_old_file(void) {
    size_t n = 0;
    unsigned char *good = small_file("keep.ckpt", &n);
    if (!good) return;
    const char *path = tpath("keep.ckpt");

    /* a checkpoint too large to write: the file size limit makes write() fail
     * (EFBIG) halfway, even for root */
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    int64_t s[1] = {1 << 20};
    ts_tensor *big = NULL;
    CHECK_OK(ts_tensor_zeros(NULL, TS_F32, 1, s, &big));
    CHECK_OK(ts_tensor_list_append(&l, "big", big));
    ts_ckpt *ck = ts_ckpt_new();
    CHECK_OK(ts_ckpt_add_tensors(ck, "model.", &l));
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 64 * 1024;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    ts_status st = ts_ckpt_save(ck, path);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    CHECK(st == TS_ERR_IO);
    CHECK_ERR_MENTIONS(path);
    CHECK_ERR_MENTIONS("too large");
    size_t m = 0;
    unsigned char *now = read_file(path, &m);
    CHECK(now && m == n && memcmp(now, good, n) == 0);
    free(now);
    CHECK(count_entries("keep.ckpt") == 1); /* no keep.ckpt.tmp.* left */

    /* a parent "directory" that is a regular file */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/sub/x.ckpt", path);
    CHECK_STATUS(ts_ckpt_save(ck, bad), TS_ERR_IO);
    CHECK_ERR_MENTIONS(bad);
    CHECK_ERR_MENTIONS("Not a directory");
    /* the temporary name already taken by a directory */
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(mkdir(tmp, 0755) == 0);
    CHECK_STATUS(ts_ckpt_save(ck, path), TS_ERR_IO);
    CHECK_ERR_MENTIONS(path);
    rmdir(tmp);
    now = read_file(path, &m);
    CHECK(now && m == n && memcmp(now, good, n) == 0);
    free(now);
    CHECK(count_entries("keep.ckpt") == 1);

    /* and a successful save replaces it */
    CHECK_OK(ts_ckpt_save(ck, path));
    ts_ckpt *back = NULL;
    CHECK_OK(ts_ckpt_load(path, &back));
    CHECK(back && ts_ckpt_count(back, TS_CKPT_TENSOR) == 1);
    CHECK(count_entries("keep.ckpt") == 1);
    ts_ckpt_free(back);
    ts_ckpt_free(ck);
    ts_tensor_list_clear(&l);
    ts_tensor_release(big);
    free(good);
}


/* ---- hostile paths and files --------------------------------------------------------------------- */
static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_ckpt: blocked on a FIFO\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

/* Devices, FIFOs, sockets and directories are refused, for reading and for writing, without blocking;
 * the device nodes stay what they are. */
static void test_special_files(void) {
    ts_tensor_list model = TS_TENSOR_LIST_INIT, optim = TS_TENSOR_LIST_INIT;
    ts_ckpt *ck = build(&model, &optim), *back = NULL;
    signal(SIGALRM, on_alarm);
    alarm(20); /* a FIFO that blocks fails the test instead of hanging it */
    const char *fifo = tpath("fifo.ckpt");
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_STATUS(ts_ckpt_load(fifo, &back), TS_ERR_IO);
    CHECK_ERR_MENTIONS(fifo);
    CHECK_ERR_MENTIONS("is a FIFO");
    CHECK_STATUS(ts_ckpt_save(ck, fifo), TS_ERR_IO);
    CHECK_ERR_MENTIONS("refusing to replace it");
    CHECK_STATUS(ts_ckpt_check_writable(fifo), TS_ERR_IO);
    struct stat sb;
    CHECK(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
    CHECK(count_entries("fifo.ckpt") == 1);
    const char *devs[] = {"/dev/null", "/dev/full", "/dev/zero"};
    for (size_t i = 0; i < 3; i++) {
        if (stat(devs[i], &sb) != 0) continue;
        CHECK_STATUS(ts_ckpt_load(devs[i], &back), TS_ERR_IO);
        CHECK_ERR_MENTIONS("is a character device");
        CHECK_STATUS(ts_ckpt_save(ck, devs[i]), TS_ERR_IO); /* as root this used to replace the node */
        CHECK_ERR_MENTIONS(devs[i]);
        CHECK_STATUS(ts_ckpt_check_writable(devs[i]), TS_ERR_IO);
        CHECK(stat(devs[i], &sb) == 0 && S_ISCHR(sb.st_mode));
    }
    const char *link = tpath("null.ckpt"); /* through a symbolic link too */
    CHECK(symlink("/dev/null", link) == 0);
    CHECK_STATUS(ts_ckpt_save(ck, link), TS_ERR_IO);
    CHECK(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode));
    CHECK_STATUS(ts_ckpt_load(tu_tmpdir(), &back), TS_ERR_IO);
    CHECK_ERR_MENTIONS("is a directory");
    /* the writable check: a missing directory, a file where a directory should be, then a good path */
    char p[512];
    snprintf(p, sizeof p, "%s/missing/x.ckpt", tu_tmpdir());
    CHECK_STATUS(ts_ckpt_check_writable(p), TS_ERR_IO);
    CHECK_ERR_MENTIONS("missing: No such file or directory");
    CHECK_OK(ts_ckpt_save(ck, tpath("plain.ckpt")));
    snprintf(p, sizeof p, "%s/x.ckpt", tpath("plain.ckpt"));
    CHECK_STATUS(ts_ckpt_check_writable(p), TS_ERR_IO);
    CHECK_ERR_MENTIONS("is a regular file, not a directory");
    CHECK_OK(ts_ckpt_check_writable(tpath("plain.ckpt")));
    CHECK_OK(ts_ckpt_check_writable(tpath("new.ckpt")));
    CHECK(count_entries("new.ckpt") == 0 && count_entries("plain.ckpt") == 1);
    alarm(0);
    unlink(fifo);
    unlink(link);
    ts_ckpt_free(ck);
    ts_tensor_list_clear(&model);
    ts_tensor_list_clear(&optim);
}

static pid_t dead_pid(void) {
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

/* "<name>.tmp.<pid>" files of writers that are gone are removed by the next save; others stay. */
static void test_stale_temps_removed(void) {
    ts_tensor_list model = TS_TENSOR_LIST_INIT, optim = TS_TENSOR_LIST_INIT;
    ts_ckpt *ck = build(&model, &optim);
    char dead[512], live[512], other[512], junk[512];
    pid_t d = dead_pid();
    snprintf(dead, sizeof dead, "%s.tmp.%d", tpath("st.ckpt"), (int)d);
    snprintf(live, sizeof live, "%s.tmp.%d", tpath("st.ckpt"), (int)getppid());
    snprintf(other, sizeof other, "%s.tmp.%d", tpath("st2.ckpt"), (int)d);
    snprintf(junk, sizeof junk, "%s.tmp.12x", tpath("st.ckpt"));
    write_file(dead, "x", 1);
    write_file(live, "x", 1);
    write_file(other, "x", 1);
    write_file(junk, "x", 1);
    CHECK_OK(ts_ckpt_save(ck, tpath("st.ckpt")));
    struct stat sb;
    CHECK(stat(dead, &sb) != 0);  /* its writer is gone */
    CHECK(stat(live, &sb) == 0);  /* a live process's */
    CHECK(stat(other, &sb) == 0); /* another checkpoint's */
    CHECK(stat(junk, &sb) == 0);  /* not a pid */
    unlink(live);
    unlink(other);
    unlink(junk);
    ts_ckpt_free(ck);
    ts_tensor_list_clear(&model);
    ts_tensor_list_clear(&optim);
}

/* kill -9 in the middle of saves: the file is always the old or the new checkpoint, and the next save
 * leaves no temporary file behind. */
static void test_kill9_during_saves(void) {
    const char *path = tpath("k9.ckpt");
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    int64_t s[1] = {1 << 20}; /* 4 MiB: a save takes a few ms */
    ts_tensor *big = NULL;
    CHECK_OK(ts_tensor_zeros(NULL, TS_F32, 1, s, &big));
    CHECK_OK(ts_tensor_list_append(&l, "w", big));
    ts_ckpt *ck = ts_ckpt_new();
    CHECK_OK(ts_ckpt_add_tensors(ck, NULL, &l));
    int left_behind = 0, torn = 0;
    ts_rng r;
    ts_rng_seed(&r, 9);
    for (int round = 0; round < 12; round++) {
        fflush(NULL);
        pid_t p = fork();
        if (p == 0) {
            for (;;) (void)ts_ckpt_save(ck, path);
        }
        usleep(2000 + (useconds_t)ts_rng_below(&r, 20000));
        kill(p, SIGKILL);
        waitpid(p, NULL, 0);
        left_behind += count_entries("k9.ckpt.tmp.") > 0;
        ts_ckpt *back = NULL;
        struct stat sb;
        if (stat(path, &sb) == 0) {
            torn += ts_ckpt_load(path, &back) != TS_OK;
            ts_ckpt_free(back);
        }
    }
    fprintf(stderr, "  %d of 12 kills left a temporary file; the next save removes them\n", left_behind);
    CHECK(torn == 0);
    CHECK_OK(ts_ckpt_save(ck, path));
    CHECK(count_entries("k9.ckpt.tmp.") == 0);
    ts_ckpt_free(ck);
    ts_tensor_list_clear(&l);
    ts_tensor_release(big);
}

/* Hand-made records: shapes whose non-zero sizes multiply past the file, huge counts, duplicates,
 * names with control bytes (escaped in messages). */
static size_t seal(unsigned char *buf, size_t o, uint32_t nsec) {
    uint64_t size = o + 4;
    uint32_t version = 1, flags = 0;
    memcpy(buf, "TSCKPT\0\1", 8);
    memcpy(buf + 8, &version, 4);
    memcpy(buf + 12, &flags, 4);
    memcpy(buf + 16, &size, 8);
    memcpy(buf + 24, &nsec, 4);
    uint32_t hc = (uint32_t)crc32(0, buf, 28);
    memcpy(buf + 28, &hc, 4);
    uint32_t fc = (uint32_t)crc32(0, buf, (uInt)o);
    memcpy(buf + o, &fc, 4);
    return o + 4;
}

static size_t tensor_record(unsigned char *p, const char *name, uint32_t nd, const uint64_t *shape, uint64_t nbytes) {
    size_t o = 0;
    uint32_t nl = (uint32_t)strlen(name), dt = 0;
    memcpy(p + o, &nl, 4), o += 4;
    memcpy(p + o, name, nl), o += nl;
    memcpy(p + o, &dt, 4), o += 4;
    memcpy(p + o, &nd, 4), o += 4;
    for (uint32_t d = 0; d < nd; d++) memcpy(p + o, &shape[d], 8), o += 8;
    memcpy(p + o, &nbytes, 8), o += 8;
    memset(p + o, 0, nbytes < 64 ? nbytes : 0), o += nbytes < 64 ? nbytes : 0;
    return o;
}

static size_t one_section(unsigned char *buf, const char *tag, uint32_t count, const unsigned char *body, size_t n) {
    size_t o = 32;
    uint64_t b = n;
    memcpy(buf + o, tag, 4);
    memcpy(buf + o + 4, &count, 4);
    memcpy(buf + o + 8, &b, 8);
    memcpy(buf + o + 16, body, n);
    return seal(buf, o + 16 + n, 1);
}

static void test_hostile_records(void) {
    unsigned char body[512], buf[1024];
    ts_ckpt *ck = NULL;
    /* (0, 2^40, 2^40, 2^40): zero elements, but strides would overflow */
    uint64_t sh[4] = {0, 1ull << 40, 1ull << 40, 1ull << 40};
    size_t n = tensor_record(body, "z", 4, sh, 0);
    n = one_section(buf, "TENS", 1, body, n);
    CHECK_STATUS(ts__ckpt_load_mem(buf, n, "z.ckpt", &ck), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("tensor 'z' has size 1099511627776 in dim 1");
    /* a size that promises more bytes than the file has */
    uint64_t sh2[2] = {1000, 1000};
    n = tensor_record(body, "big", 2, sh2, 4000000);
    n = one_section(buf, "TENS", 1, body, n);
    CHECK_STATUS(ts__ckpt_load_mem(buf, n, "big.ckpt", &ck), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("big.ckpt: malformed");
    /* duplicate names, found once every record is read */
    uint64_t one[1] = {1};
    n = tensor_record(body, "dup", 1, one, 4);
    n += tensor_record(body + n, "dup", 1, one, 4);
    n = one_section(buf, "TENS", 2, body, n);
    CHECK_STATUS(ts__ckpt_load_mem(buf, n, "dup.ckpt", &ck), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("duplicate TENS entry 'dup'");
    /* a name with an escape sequence is printed escaped */
    n = tensor_record(body, "a\x1b[31mb", 1, one, 4);
    n += tensor_record(body + n, "a\x1b[31mb", 1, one, 4);
    n = one_section(buf, "TENS", 2, body, n);
    CHECK_STATUS(ts__ckpt_load_mem(buf, n, "esc.ckpt", &ck), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("'a\\x1b[31mb'");
    CHECK(!strchr(ts_last_error(), 0x1b));
    /* a count of 4 billion records in a small section */
    n = tensor_record(body, "c", 1, one, 4);
    n = one_section(buf, "TENS", 0xffffffffu, body, n);
    CHECK_STATUS(ts__ckpt_load_mem(buf, n, "count.ckpt", &ck), TS_ERR_FORMAT);
    /* empty input and a good file through memory */
    CHECK_STATUS(ts__ckpt_load_mem(NULL, 0, "empty", &ck), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("truncated: 0 bytes");
    n = tensor_record(body, "ok", 1, one, 4);
    n = one_section(buf, "TENS", 1, body, n);
    CHECK_OK(ts__ckpt_load_mem(buf, n, "ok.ckpt", &ck));
    CHECK(ck && ts_ckpt_find_tensor(ck, "ok"));
    ts_ckpt_free(ck);
}

/* The library's output writer and input reader for any file (tessera/core.h). */
static void test_outfile_and_read_file(void) {
    const char *p = tpath("out.txt"), *fifo = tpath("out.fifo");
    ts_outfile *o = NULL;
    CHECK_OK(ts_outfile_check(p, "a report"));
    CHECK_OK(ts_outfile_open(p, "a report", &o));
    if (o) fprintf(ts_outfile_stream(o), "hello %d\n", 42);
    if (o) CHECK_OK(ts_outfile_close(o));
    char *buf = NULL;
    size_t n = 0;
    CHECK_OK(ts_read_file(p, "a report", 100, &buf, &n));
    CHECK(buf && n == 9 && strcmp(buf, "hello 42\n") == 0);
    free(buf);
    CHECK_STATUS(ts_read_file(p, "a report", 4, &buf, &n), TS_ERR_FORMAT); /* over the bound: nothing allocated */
    CHECK_ERR_MENTIONS("9 bytes, more than the 4");
    CHECK(buf == NULL);
    /* discarded: the old file stays, no temporary file is left */
    o = NULL;
    CHECK_OK(ts_outfile_open(p, "a report", &o));
    if (o) fputs("half", ts_outfile_stream(o));
    ts_outfile_discard(o);
    CHECK_OK(ts_read_file(p, NULL, 100, &buf, &n));
    CHECK(buf && strcmp(buf, "hello 42\n") == 0);
    free(buf);
    CHECK(count_entries("out.txt.tmp.") == 0);
    CHECK_OK(ts_write_file(p, "a report", "bytes", 5));
    CHECK_OK(ts_read_file(p, NULL, 100, &buf, &n));
    CHECK(buf && n == 5 && memcmp(buf, "bytes", 5) == 0);
    free(buf);
    /* FIFOs and devices: refused by name, never opened */
    CHECK(mkfifo(fifo, 0600) == 0);
    o = NULL;
    CHECK_STATUS(ts_outfile_open(fifo, "a report", &o), TS_ERR_IO);
    CHECK_ERR_MENTIONS("is a FIFO");
    CHECK_ERR_MENTIONS("a report");
    CHECK(o == NULL);
    CHECK_STATUS(ts_outfile_check(fifo, "a report"), TS_ERR_IO);
    CHECK_STATUS(ts_write_file("/dev/full", "a report", "x", 1), TS_ERR_IO);
    CHECK_ERR_MENTIONS("/dev/full: is a character device");
    CHECK_STATUS(ts_read_file(fifo, "a report", 100, &buf, &n), TS_ERR_IO); /* no writer: would block */
    CHECK_ERR_MENTIONS("is a FIFO (named pipe), expected a report");
    CHECK_STATUS(ts_read_file(tu_tmpdir(), NULL, 100, &buf, &n), TS_ERR_IO);
    CHECK_ERR_MENTIONS("is a directory");
}

int main(int argc, char **argv) {
    static const tu_test tests[] = {T(test_round_trip),          T(test_api_errors),
                                    T(test_truncation),          T(test_corruption),
                                    T(test_versions_and_sections), T(test_failed_save_keeps_old_file),
                                    T(test_special_files),       T(test_stale_temps_removed),
                                    T(test_kill9_during_saves),  T(test_hostile_records),
                                    T(test_unknown_flags),       T(test_load_meta),
                                    T(test_outfile_and_read_file)};
    int rc = tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tu_rm_tmpdir();
    return rc;
}
