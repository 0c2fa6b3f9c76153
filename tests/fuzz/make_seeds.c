/*
 * tests/fuzz/make_seeds.c — writes the fuzz targets' seed corpora:
 *     build/fuzz_make_seeds tests/fuzz/corpus      (then commit what changed)
 * Small files only (the whole corpus is a few tens of KiB): checkpoints with
 * every entry kind and dtype and the trainer's key layout; IDX files plain and
 * gzip (two Fashion-MNIST images when the data set is installed); JPEGs
 * (baseline gray/RGB, 4:2:0 and 4:4:4, progressive) and PNGs (gray 1/8/16-bit,
 * RGB, RGBA, palette, interlaced) each behind the image target's 6 parameter
 * bytes; TCP store request streams; safetensors files (every Tessera dtype written with metadata,
 * a header with every dtype the reader converts, escapes and skipped fields, an empty file).
 */
#include "tessera.h"

#include <errno.h>
#include <spng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <zlib.h>

static char root[1024];
static int nfiles;

static void put(const char *sub, const char *name, const void *pre, size_t npre, const void *p, size_t n) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", root, sub);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", root, sub, name);
    FILE *f = fopen(path, "wb");
    if (!f || (npre && fwrite(pre, 1, npre, f) != npre) || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "make_seeds: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    nfiles++;
}

static unsigned char *slurp(const char *path, size_t *n) {
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

#define TRY(x)                                                                      \
    do {                                                                            \
        if ((x) != TS_OK) {                                                         \
            fprintf(stderr, "make_seeds: %s: %s\n", #x, ts_last_error());            \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static ts_tensor *tensor(ts_dtype dt, int nd, const int64_t *shape, unsigned seed) {
    ts_tensor *t = NULL;
    TRY(ts_tensor_empty(NULL, dt, nd, shape, &t));
    unsigned char *p = ts_tensor_data(t);
    for (size_t i = 0; i < ts_tensor_nbytes(t); i++) p[i] = (unsigned char)(seed * 131 + i * 7);
    if (dt == TS_F32)
        for (int64_t i = 0; i < ts_tensor_numel(t); i++) ts_tensor_data_f32(t)[i] = (float)(i % 7) * 0.25f - 0.5f;
    return t;
}

static void save_ckpt(ts_ckpt *ck, const char *name) {
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s/tmp.ckpt", root);
    TRY(ts_ckpt_save(ck, tmp));
    size_t n = 0;
    unsigned char *b = slurp(tmp, &n);
    remove(tmp);
    if (!b) exit(1);
    put("ckpt", name, NULL, 0, b, n);
    free(b);
    ts_ckpt_free(ck);
}

static void add(ts_ckpt *ck, const char *name, ts_tensor *t) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    TRY(ts_tensor_list_append(&l, name, t));
    TRY(ts_ckpt_add_tensors(ck, NULL, &l));
    ts_tensor_list_clear(&l);
    ts_tensor_release(t);
}

static void ckpt_seeds(void) {
    ts_ckpt *ck = ts_ckpt_new();
    add(ck, "w", tensor(TS_F32, 2, (int64_t[]){2, 3}, 1));
    TRY(ts_ckpt_set_i64(ck, "n", 42));
    TRY(ts_ckpt_set_f64(ck, "x", 0.5));
    TRY(ts_ckpt_set_bytes(ck, "b", "hello", 5));
    save_ckpt(ck, "kinds");

    ck = ts_ckpt_new();
    add(ck, "model.0.weight", tensor(TS_F32, 2, (int64_t[]){3, 2}, 2));
    add(ck, "model.0.bias", tensor(TS_F32, 1, (int64_t[]){3}, 3));
    int64_t one = 1;
    ts_tensor *t = NULL;
    TRY(ts_tensor_from_data(NULL, TS_I64, 1, (int64_t[]){1}, &one, &t));
    add(ck, "optim.step", t);
    add(ck, "optim.lr", tensor(TS_F32, 1, (int64_t[]){1}, 4));
    add(ck, "optim.0.weight.momentum_buffer", tensor(TS_F32, 2, (int64_t[]){3, 2}, 5));
    add(ck, "optim.0.bias.momentum_buffer", tensor(TS_F32, 1, (int64_t[]){3}, 6));
    const char *keys[] = {"train.epoch", "train.batch", "train.step", "train.seed", "train.world_size",
                          "train.batch_size"};
    for (int i = 0; i < 6; i++) TRY(ts_ckpt_set_i64(ck, keys[i], i == 4 ? 1 : i));
    TRY(ts_ckpt_set_f64(ck, "train.loss", 2.25));
    TRY(ts_ckpt_set_bytes(ck, "train.model", "mlp", 3));
    TRY(ts_ckpt_set_bytes(ck, "train.optimizer", "sgd", 3));
    unsigned char rng[32] = {1, 2, 3};
    TRY(ts_ckpt_set_bytes(ck, "train.rng", rng, sizeof rng));
    save_ckpt(ck, "trainer");

    ck = ts_ckpt_new();
    save_ckpt(ck, "empty");

    ck = ts_ckpt_new();
    add(ck, "f16", tensor(TS_F16, 1, (int64_t[]){3}, 7));
    add(ck, "bf16", tensor(TS_BF16, 2, (int64_t[]){1, 2}, 8));
    add(ck, "i64", tensor(TS_I64, 1, (int64_t[]){2}, 9));
    add(ck, "i32", tensor(TS_I32, 3, (int64_t[]){1, 1, 2}, 10));
    add(ck, "u8", tensor(TS_U8, 1, (int64_t[]){5}, 11));
    add(ck, "scalar", tensor(TS_F32, 0, NULL, 12));
    add(ck, "none", tensor(TS_F32, 3, (int64_t[]){2, 0, 4}, 13));
    add(ck, "name\twith\x1b[31mescapes", tensor(TS_U8, 1, (int64_t[]){1}, 14));
    save_ckpt(ck, "dtypes");
}

static size_t idx_file(unsigned char *buf, uint32_t magic, int nd, const uint32_t *dims, const unsigned char *data) {
    size_t k = 0, total = 1;
    uint32_t v[5] = {magic};
    for (int i = 0; i < nd; i++) v[1 + i] = dims[i], total *= dims[i];
    for (int i = 0; i <= nd; i++)
        for (int b = 3; b >= 0; b--) buf[k++] = (unsigned char)(v[i] >> (8 * b));
    memcpy(buf + k, data, total);
    return k + total;
}

static void idx_put(const char *name, int expect, const unsigned char *file, size_t n, bool gz) {
    unsigned char pre = (unsigned char)expect, out[8192];
    uLongf zn = sizeof out;
    if (gz) { /* a gzip stream: deflateInit2 with windowBits 16 + 15 */
        z_stream z = {0};
        deflateInit2(&z, 9, Z_DEFLATED, 16 + 15, 8, Z_DEFAULT_STRATEGY);
        z.next_in = (Bytef *)file;
        z.avail_in = (uInt)n;
        z.next_out = out;
        z.avail_out = sizeof out;
        deflate(&z, Z_FINISH);
        zn = z.total_out;
        deflateEnd(&z);
        put("idx", name, &pre, 1, out, zn);
    } else {
        put("idx", name, &pre, 1, file, n);
    }
}

static void idx_seeds(void) {
    unsigned char data[64], f[256];
    for (int i = 0; i < 64; i++) data[i] = (unsigned char)(i * 37);
    size_t n = idx_file(f, 0x803, 3, (uint32_t[]){2, 3, 4}, data);
    idx_put("images", 3, f, n, false);
    idx_put("images.gz", 3, f, n, true);
    n = idx_file(f, 0x801, 1, (uint32_t[]){5}, data);
    idx_put("labels", 1, f, n, false);
    idx_put("labels.gz", 0, f, n, true);
    n = idx_file(f, 0x804, 4, (uint32_t[]){1, 2, 2, 3}, data);
    idx_put("4d", 0, f, n, false);
    /* two real images: the test data */
    gzFile gz = gzopen("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz", "rb");
    unsigned char real[16 + 2 * 784], file[16 + 2 * 784];
    if (gz && gzread(gz, real, sizeof real) == (int)sizeof real) {
        n = idx_file(file, 0x803, 3, (uint32_t[]){2, 28, 28}, real + 16);
        idx_put("fashion2.gz", 3, file, n, true);
    }
    if (gz) gzclose(gz);
}

static void picture(unsigned char *p, int w, int h, int c, int seed) {
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int k = 0; k < c; k++) p[(y * w + x) * c + k] = (unsigned char)((x * 9 + y * 5 + k * 60 + seed * 17) ^ (x * y));
}

static void image_put(const char *name, const unsigned char *file, size_t n) {
    static const unsigned char params[][6] = {{0, 0, 0, 0, 255, 255}, {3, 1, 0, 0, 0, 0}, {5, 0, 2, 3, 9, 7},
                                              {7, 2, 64, 32, 128, 200}};
    for (int v = 0; v < 4; v++) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s.%d", name, v);
        put("image", nm, params[v], 6, file, n);
    }
}

static void jpeg_seed(const char *name, int w, int h, int c, int sub, int flags) {
    unsigned char *pix = malloc((size_t)w * h * c), *jb = NULL;
    unsigned long jn = 0;
    picture(pix, w, h, c, w + h);
    tjhandle tj = tjInitCompress();
    if (tjCompress2(tj, pix, w, 0, h, c == 3 ? TJPF_RGB : TJPF_GRAY, &jb, &jn, sub, 70, flags) != 0) {
        fprintf(stderr, "make_seeds: %s\n", tjGetErrorStr2(tj));
        exit(1);
    }
    image_put(name, jb, jn);
    tjFree(jb);
    tjDestroy(tj);
    free(pix);
}

static void png_seed(const char *name, int w, int h, int color_type, int depth, int interlace) {
    spng_ctx *enc = spng_ctx_new(SPNG_CTX_ENCODER);
    spng_set_option(enc, SPNG_ENCODE_TO_BUFFER, 1);
    struct spng_ihdr ihdr = {(uint32_t)w, (uint32_t)h, (uint8_t)depth, (uint8_t)color_type, 0, 0, (uint8_t)interlace};
    spng_set_ihdr(enc, &ihdr);
    int ch = color_type == SPNG_COLOR_TYPE_TRUECOLOR ? 3 : color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA ? 4 : 1;
    if (color_type == SPNG_COLOR_TYPE_INDEXED) {
        struct spng_plte plte = {.n_entries = 4};
        for (int i = 0; i < 4; i++) plte.entries[i] = (struct spng_plte_entry){(uint8_t)(60 * i), (uint8_t)(255 - 50 * i), 90, 255};
        spng_set_plte(enc, &plte);
    }
    size_t row = ((size_t)w * ch * depth + 7) / 8, len = row * h;
    unsigned char *pix = malloc(len);
    picture(pix, (int)row, h, 1, depth);
    if (color_type == SPNG_COLOR_TYPE_INDEXED)
        for (size_t i = 0; i < len; i++) pix[i] &= depth == 8 ? 3 : 0x55;
    int e = spng_encode_image(enc, pix, len, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    size_t pn = 0;
    void *png = e ? NULL : spng_get_png_buffer(enc, &pn, &e);
    if (!png) {
        fprintf(stderr, "make_seeds: PNG %s: %s\n", name, spng_strerror(e));
        exit(1);
    }
    image_put(name, png, pn);
    free(png);
    free(pix);
    spng_ctx_free(enc);
}

static void image_seeds(void) {
    jpeg_seed("gray.jpg", 16, 16, 1, TJSAMP_GRAY, 0);
    jpeg_seed("rgb420.jpg", 24, 16, 3, TJSAMP_420, 0);
    jpeg_seed("rgb444.jpg", 9, 13, 3, TJSAMP_444, 0);
    jpeg_seed("prog.jpg", 20, 20, 3, TJSAMP_422, TJFLAG_PROGRESSIVE);
    png_seed("gray8.png", 9, 7, SPNG_COLOR_TYPE_GRAYSCALE, 8, 0);
    png_seed("gray1.png", 17, 5, SPNG_COLOR_TYPE_GRAYSCALE, 1, 0);
    png_seed("gray16.png", 6, 6, SPNG_COLOR_TYPE_GRAYSCALE, 16, 0);
    png_seed("rgb.png", 7, 5, SPNG_COLOR_TYPE_TRUECOLOR, 8, 1);
    png_seed("rgba.png", 5, 4, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 8, 0);
    png_seed("palette.png", 8, 8, SPNG_COLOR_TYPE_INDEXED, 2, 0);
}

/* store: flags, then frames of u16 length + body */
static size_t frame(unsigned char *p, const unsigned char *body, size_t n) {
    p[0] = (unsigned char)(n >> 8), p[1] = (unsigned char)n;
    memcpy(p + 2, body, n);
    return n + 2;
}
static size_t str(unsigned char *p, const char *s) {
    size_t n = strlen(s);
    p[0] = p[1] = 0, p[2] = (unsigned char)(n >> 8), p[3] = (unsigned char)n;
    memcpy(p + 4, s, n);
    return n + 4;
}

static void store_seeds(void) {
    unsigned char s[512], b[128];
    size_t k = 0, m;
    s[k++] = 0;
    m = 0, b[m++] = 1, m += str(b + m, "key"), m += str(b + m, "value");
    k += frame(s + k, b, m);
    m = 0, b[m++] = 2, m += str(b + m, "key");
    k += frame(s + k, b, m);
    m = 0, b[m++] = 3, m += str(b + m, "count");
    memcpy(b + m, "\0\0\0\0\0\0\0\5", 8), m += 8;
    k += frame(s + k, b, m);
    m = 0, b[m++] = 4, m += str(b + m, "count");
    k += frame(s + k, b, m);
    put("store", "set_get_add_check", NULL, 0, s, k);

    k = 0, s[k++] = 2; /* preset keys */
    m = 0, b[m++] = 5, b[m++] = 0, b[m++] = 0, b[m++] = 0, b[m++] = 2, m += str(b + m, "a"), m += str(b + m, "b");
    k += frame(s + k, b, m);
    m = 0, b[m++] = 2, m += str(b + m, "missing");
    k += frame(s + k, b, m);
    put("store", "wait_get", NULL, 0, s, k);

    k = 0, s[k++] = 1; /* raw length 0 */
    memset(s + k, 0, 4), k += 4;
    put("store", "raw_zero_length", NULL, 0, s, k);
}

/* safetensors: through ts_safetensors_save, and by hand for the dtypes Tessera reads but never writes. */
static void st_put(const char *name, const char *header, const void *data, size_t n) {
    size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
    unsigned char *b = calloc(1, 8 + padded + n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, ' ', padded - hl);
    if (n) memcpy(b + 8 + padded, data, n);
    put("safetensors", name, NULL, 0, b, 8 + padded + n);
    free(b);
}

static void safetensors_seeds(void) {
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s/tmp.safetensors", root);
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_tensor *ts[] = {tensor(TS_F32, 2, (int64_t[]){2, 3}, 1), tensor(TS_I64, 0, NULL, 2),
                       tensor(TS_I32, 1, (int64_t[]){2}, 3),     tensor(TS_U8, 1, (int64_t[]){3}, 4),
                       tensor(TS_F16, 1, (int64_t[]){2}, 5),     tensor(TS_BF16, 2, (int64_t[]){1, 2}, 6),
                       tensor(TS_F32, 2, (int64_t[]){0, 3}, 7)};
    const char *names[] = {"0.weight", "1.num_batches_tracked", "idx", "mask", "half", "brain", "empty"};
    for (int i = 0; i < 7; i++) {
        TRY(ts_tensor_list_append(&l, names[i], ts[i]));
        ts_tensor_release(ts[i]);
    }
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
    TRY(ts_safetensors_meta_set(&m, "format", "pt"));
    TRY(ts_safetensors_meta_set(&m, "model", "cnn"));
    TRY(ts_safetensors_save(tmp, &l, &m));
    size_t n = 0;
    unsigned char *b = slurp(tmp, &n);
    remove(tmp);
    if (!b) exit(1);
    put("safetensors", "dtypes", NULL, 0, b, n);
    free(b);
    ts_tensor_list_clear(&l);
    ts_safetensors_meta_clear(&m);
    unsigned char d[64];
    for (int i = 0; i < 64; i++) d[i] = (unsigned char)(i * 37 + 1);
    st_put("converted",
           "{\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
           "\"b\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[16,18]},"
           "\"i8\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[18,20]},"
           "\"i16\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[20,22]},"
           "\"u16\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[22,24]},"
           "\"u32\":{\"dtype\":\"U32\",\"shape\":[],\"data_offsets\":[24,28]},"
           "\"u64\":{\"dtype\":\"U64\",\"shape\":[1,1],\"data_offsets\":[28,36]},"
           "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[36,40]},"
           "\"bf\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[40,44]}}",
           d, 44);
    st_put("syntax",
           " { \"__metadata__\" : {\"k\\u00e9\":\"v\\n\\\"\"} , \"\\ud83d\\ude00\\t\" : { \"x\" : [1, {\"y\": -2.5e3}, true, "
           "false, null], \"data_offsets\" : [ 0 , 4 ] , \"dtype\" : \"F32\" , \"shape\" : [ ] } }\n",
           d, 4);
    st_put("empty", "{}", NULL, 0);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    snprintf(root, sizeof root, "%s", argv[1]);
    mkdir(root, 0755);
    ckpt_seeds();
    idx_seeds();
    image_seeds();
    store_seeds();
    safetensors_seeds();
    printf("make_seeds: %d files under %s\n", nfiles, root);
    return 0;
}
