/* safetensors files: round trips in the Python library's layout, every dtype's read path,
 * each kind of corruption refused with a message naming the file and the tensor, checkpoint
 * export, weights loading (strict, naming every problem) and load_state_dict's bounded report.
 *
 * Also a helper for tests/cli_safetensors.sh (not a test):
 *   test_safetensors --logits MODEL WEIGHTS INPUT.f32 N OUTPUT.f32
 * builds MODEL, loads WEIGHTS (ts_weights_load), runs N images of INPUT (raw float32, N x 1 x 28 x 28)
 * through it in eval mode and writes the logits as raw float32. */
#include "test_util.h"

#include <inttypes.h>

#include "io/safetensors_internal.h"

#include <sys/stat.h>
#include <unistd.h>

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

/* A file of: u64 header length, the header (padded with spaces to a multiple of 8 when pad), data. */
static void write_st(const char *path, const char *header, bool pad, const void *data, size_t n) {
    size_t hl = strlen(header), padded = pad ? (hl + 7) / 8 * 8 : hl;
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    if (n) fwrite(data, 1, n, f);
    if (fclose(f) != 0) abort();
}

static ts_tensor *make(ts_dtype dt, int ndim, const int64_t *shape, unsigned seed) {
    ts_tensor *t = NULL;
    if (ts_tensor_empty(NULL, dt, ndim, shape, &t) != TS_OK) abort();
    unsigned char *p = ts_tensor_data(t);
    for (size_t i = 0; i < ts_tensor_nbytes(t); i++) p[i] = (unsigned char)(seed * 131 + i * 7 + 1);
    if (dt == TS_F32)
        for (int64_t i = 0; i < ts_tensor_numel(t); i++) ts_tensor_data_f32(t)[i] = (float)i * 0.5f - (float)seed;
    return t;
}

static bool same_tensor(ts_tensor *a, ts_tensor *b) {
    if (!a || !b || ts_tensor_dtype(a) != ts_tensor_dtype(b) || ts_tensor_ndim(a) != ts_tensor_ndim(b)) return false;
    for (int i = 0; i < ts_tensor_ndim(a); i++)
        if (ts_tensor_dim(a, i) != ts_tensor_dim(b, i)) return false;
    return ts_tensor_nbytes(a) == ts_tensor_nbytes(b) &&
           (ts_tensor_nbytes(a) == 0 || memcmp(ts_tensor_data(a), ts_tensor_data(b), ts_tensor_nbytes(a)) == 0);
}

/* ---- round trip ----------------------------------------------------------------------------------- */
static void test_round_trip(void) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT, back = TS_TENSOR_LIST_INIT;
    struct {
        const char *name;
        ts_dtype dt;
        int nd;
        int64_t shape[3];
    } spec[] = {
        {"b.weight", TS_F32, 2, {2, 3}},  {"a.num_batches_tracked", TS_I64, 0, {0}}, {"idx", TS_I32, 1, {4}},
        {"mask", TS_U8, 1, {3}},          {"half", TS_F16, 1, {2}},                  {"brain", TS_BF16, 2, {1, 2}},
        {"empty", TS_F32, 2, {0, 3}},     {"a.weight", TS_F32, 1, {5}},              {"tab\t\"q\"\\é", TS_F32, 0, {0}},
    };
    int n = (int)(sizeof spec / sizeof spec[0]);
    for (int i = 0; i < n; i++) {
        ts_tensor *t = make(spec[i].dt, spec[i].nd, spec[i].shape, (unsigned)i);
        CHECK_OK(ts_tensor_list_append(&l, spec[i].name, t));
        ts_tensor_release(t);
    }
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT, mb = TS_SAFETENSORS_META_INIT;
    CHECK_OK(ts_safetensors_meta_set(&m, "format", "pt"));
    CHECK_OK(ts_safetensors_meta_set(&m, "note", "line\nbreak \"quoted\""));
    CHECK_OK(ts_safetensors_meta_set(&m, "format", "pt")); /* replaces */
    CHECK(m.n == 2);
    const char *path = tpath("rt.safetensors");
    CHECK_OK(ts_safetensors_save(path, &l, &m));
    CHECK_OK(ts_safetensors_load(path, 0, &back, &mb));
    CHECK(back.n == n);
    for (int i = 0; i < n; i++) CHECK(same_tensor(l.tensors[i], ts_tensor_list_find(&back, spec[i].name)));
    CHECK(mb.n == 2 && strcmp(ts_safetensors_meta_get(&mb, "note"), "line\nbreak \"quoted\"") == 0);
    CHECK(strcmp(ts_safetensors_meta_get(&mb, "format"), "pt") == 0);
    CHECK(ts_safetensors_meta_get(&mb, "nope") == NULL);
    /* file order: largest dtype first (I64, F32, I32, BF16, F16, U8), then by name */
    const char *want[] = {"a.num_batches_tracked", "a.weight", "b.weight", "empty", "tab\t\"q\"\\é", "idx",
                          "brain", "half", "mask"};
    for (int i = 0; i < n && i < back.n; i++) CHECK(strcmp(back.names[i], want[i]) == 0);
    /* the layout the Python library writes */
    size_t fn = 0;
    unsigned char *b = read_file(path, &fn);
    uint64_t hn = 0;
    for (int i = 0; i < 8; i++) hn |= (uint64_t)b[i] << (8 * i);
    CHECK(hn % 8 == 0 && 8 + hn <= fn);
    const char *head = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"line\\nbreak \\\"quoted\\\"\"},"
                       "\"a.num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
                       "\"a.weight\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[8,28]},";
    CHECK(memcmp(b + 8, head, strlen(head)) == 0);
    CHECK(strstr((char *)b + 8, "\"tab\\t\\\"q\\\"\\\\é\":{\"dtype\":\"F32\",\"shape\":[]") != NULL);
    CHECK(b[8 + hn - 1] == ' ' || b[8 + hn - 1] == '}');
    free(b);
    /* appending to a list that has entries keeps them */
    CHECK_OK(ts_safetensors_load(path, 0, &back, NULL));
    CHECK(back.n == 2 * n);
    ts_tensor_list_clear(&back);
    /* an empty list: "{}" and 6 spaces */
    ts_tensor_list none = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_safetensors_save(path, &none, NULL));
    b = read_file(path, &fn);
    CHECK(fn == 16 && memcmp(b, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
    free(b);
    CHECK_OK(ts_safetensors_load(path, 0, &back, NULL));
    CHECK(back.n == 0);
    CHECK(ts_safetensors_probe(path));
    CHECK(!ts_safetensors_probe("/nonexistent/x"));
    ts_tensor_list_clear(&l);
    ts_safetensors_meta_clear(&m);
    ts_safetensors_meta_clear(&mb);
}

/* ---- read paths of every dtype ----------------------------------------------------------------------- */
static void test_read_dtypes(void) {
    const char *path = tpath("dt.safetensors");
    unsigned char data[256];
    size_t k = 0;
#define PUT(v)                                  \
    do {                                        \
        __typeof__(v) x_ = (v);                 \
        memcpy(data + k, &x_, sizeof x_);       \
        k += sizeof x_;                         \
    } while (0)
    PUT((double)1.5);  PUT((double)-1e300); PUT((double)0.1);              /* f64 [0,24) */
    PUT((uint8_t)0);   PUT((uint8_t)1);     PUT((uint8_t)7);               /* bool [24,27) */
    PUT((int8_t)-128); PUT((int8_t)127);                                   /* i8 [27,29) */
    PUT((int16_t)-300); PUT((uint16_t)65535);                              /* i16 [29,31), u16 [31,33) */
    PUT((uint32_t)4000000000u);                                            /* u32 [33,37) */
    PUT((uint64_t)123456789012345ull);                                     /* u64 [37,45) */
    uint16_t h[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00, 0x8000, 0x3555};
    for (int i = 0; i < 7; i++) PUT(h[i]);                                 /* f16 [45,59) */
    PUT((uint16_t)0x3fc0); PUT((uint16_t)0xc2f7);                          /* bf16 [59,63): 1.5, -123.5 */
#undef PUT
    CHECK(k == 63);
    const char *hdr =
        "{\"d\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[0,24]},"
        "\"b\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[24,27]},"
        "\"i8\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[27,29]},"
        "\"i16\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[29,31]},"
        "\"u16\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[31,33]},"
        "\"u32\":{\"dtype\":\"U32\",\"shape\":[],\"data_offsets\":[33,37]},"
        "\"u64\":{\"dtype\":\"U64\",\"shape\":[1,1],\"data_offsets\":[37,45]},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[7],\"data_offsets\":[45,59]},"
        "\"bf\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[59,63]}}";
    write_st(path, hdr, true, data, k);
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_safetensors_load(path, 0, &l, NULL));
    CHECK(l.n == 9);
    ts_tensor *t;
    if ((t = ts_tensor_list_find(&l, "d"))) {
        CHECK(ts_tensor_dtype(t) == TS_F32);
        CHECK(ts_tensor_item(t, 0) == 1.5 && isinf(ts_tensor_item(t, 1)) && ts_tensor_item(t, 2) == (double)0.1f);
    }
    if ((t = ts_tensor_list_find(&l, "b")))
        CHECK(ts_tensor_dtype(t) == TS_U8 && ts_tensor_item(t, 0) == 0 && ts_tensor_item(t, 1) == 1 &&
              ts_tensor_item(t, 2) == 1);
    if ((t = ts_tensor_list_find(&l, "i8")))
        CHECK(ts_tensor_dtype(t) == TS_I32 && ts_tensor_item(t, 0) == -128 && ts_tensor_item(t, 1) == 127);
    if ((t = ts_tensor_list_find(&l, "i16"))) CHECK(ts_tensor_dtype(t) == TS_I32 && ts_tensor_item(t, 0) == -300);
    if ((t = ts_tensor_list_find(&l, "u16"))) CHECK(ts_tensor_dtype(t) == TS_I32 && ts_tensor_item(t, 0) == 65535);
    if ((t = ts_tensor_list_find(&l, "u32")))
        CHECK(ts_tensor_dtype(t) == TS_I64 && ts_tensor_ndim(t) == 0 && ts_tensor_item(t, 0) == 4000000000.0);
    if ((t = ts_tensor_list_find(&l, "u64")))
        CHECK(ts_tensor_dtype(t) == TS_I64 && ((int64_t *)ts_tensor_data(t))[0] == 123456789012345ll);
    if ((t = ts_tensor_list_find(&l, "h"))) CHECK(ts_tensor_dtype(t) == TS_F16 && ts_tensor_nbytes(t) == 14);
    if ((t = ts_tensor_list_find(&l, "bf"))) CHECK(ts_tensor_dtype(t) == TS_BF16);
    ts_tensor_list_clear(&l);
    /* TS_SAFETENSORS_F32: F16 and BF16 as float32, exactly */
    CHECK_OK(ts_safetensors_load(path, TS_SAFETENSORS_F32, &l, NULL));
    if ((t = ts_tensor_list_find(&l, "h"))) {
        CHECK(ts_tensor_dtype(t) == TS_F32);
        const float *f = ts_tensor_data_f32(t);
        CHECK(f[0] == 1.0f && f[1] == -2.0f && f[2] == 65504.0f && f[3] == ldexpf(1.0f, -24) && isinf(f[4]) &&
              f[4] > 0 && f[5] == 0.0f && signbit(f[5]) && f[6] == 0.333251953125f);
    }
    if ((t = ts_tensor_list_find(&l, "bf"))) {
        CHECK(ts_tensor_dtype(t) == TS_F32);
        CHECK(ts_tensor_data_f32(t)[0] == 1.5f && ts_tensor_data_f32(t)[1] == -123.5f);
    }
    if ((t = ts_tensor_list_find(&l, "i8"))) CHECK(ts_tensor_dtype(t) == TS_I32); /* integers stay integers */
    ts_tensor_list_clear(&l);
    /* F16 subnormals, every one: value m x 2^-24 */
    unsigned char sub[2 * 1023];
    for (int m = 1; m <= 1023; m++) sub[2 * (m - 1)] = (unsigned char)(m & 0xff), sub[2 * (m - 1) + 1] = (unsigned char)(m >> 8);
    write_st(path, "{\"s\":{\"dtype\":\"F16\",\"shape\":[1023],\"data_offsets\":[0,2046]}}", true, sub, sizeof sub);
    CHECK_OK(ts_safetensors_load(path, TS_SAFETENSORS_F32, &l, NULL));
    bool ok = l.n == 1;
    for (int m = 1; ok && m <= 1023; m++) ok = ts_tensor_data_f32(l.tensors[0])[m - 1] == ldexpf((float)m, -24);
    CHECK(ok);
    ts_tensor_list_clear(&l);
    /* accepted as the Python library accepts: whitespace, escapes, null metadata, unknown fields, no padding */
    float one = 1.0f;
    write_st(path, " { \"__metadata__\" : null , \"\\u00e9\\n\\ud83d\\ude00\" : { \"x\" : [1, {\"y\": -2.5e3}, true, null], "
                   "\"data_offsets\" : [ 0 , 4 ] , \"dtype\" : \"F32\" , \"shape\" : [ ] } }\n",
             false, &one, 4);
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
    CHECK_OK(ts_safetensors_load(path, 0, &l, &m));
    CHECK(l.n == 1 && m.n == 0 && strcmp(l.names[0], "\xc3\xa9\n\xf0\x9f\x98\x80") == 0);
    ts_tensor_list_clear(&l);
}

/* ---- corruption ------------------------------------------------------------------------------------------ */
typedef struct bad_case {
    const char *what, *header;
    size_t ndata;
    ts_status want;
    const char *mention;
} bad_case;

static void test_corrupt(void) {
    const char *path = tpath("bad.safetensors");
    unsigned char zeros[64] = {0};
#define F32A "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"
    const bad_case cases[] = {
        {"not an object", "[1]", 0, TS_ERR_FORMAT, "not a JSON object"},
        {"trailing characters", "{" F32A "}x", 4, TS_ERR_FORMAT, "trailing characters"},
        {"NUL in the header", "{" F32A "}\\0", 4, TS_ERR_FORMAT, "NUL byte"},
        {"unterminated", "{\"a", 0, TS_ERR_FORMAT, "unterminated string"},
        {"bad escape", "{\"\\q\":{}}", 0, TS_ERR_FORMAT, "bad escape"},
        {"lone surrogate", "{\"\\ud800\":{}}", 0, TS_ERR_FORMAT, "surrogate"},
        {"NUL escape", "{\"a\\u0000b\":{}}", 0, TS_ERR_FORMAT, "NUL"},
        {"control character", "{\"a\tb\":{}}", 0, TS_ERR_FORMAT, "control character"},
        {"unknown dtype", "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TS_ERR_FORMAT,
         "tensor 'w': unknown dtype 'f32'"},
        {"unsupported dtype", "{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
         TS_ERR_UNSUPPORTED, "tensor 'w': dtype F8_E4M3"},
        {"negative size", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, TS_ERR_FORMAT,
         "non-negative integer in shape"},
        {"fractional size", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, TS_ERR_FORMAT,
         "non-negative integer in shape"},
        {"leading zero", "{\"w\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, TS_ERR_FORMAT,
         "non-negative integer"},
        {"huge integer", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}", 4,
         TS_ERR_FORMAT, "integer too large"},
        {"9 dimensions", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
         TS_ERR_UNSUPPORTED, "tensor 'w': more than 8 dimensions"},
        {"three offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, TS_ERR_FORMAT,
         "tensor 'w': \"data_offsets\" must hold exactly two"},
        {"missing offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, TS_ERR_FORMAT,
         "tensor 'w': missing field \"data_offsets\""},
        {"missing dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TS_ERR_FORMAT,
         "tensor 'w': missing field \"dtype\""},
        {"duplicate field", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         TS_ERR_FORMAT, "tensor 'w': duplicate field \"shape\""},
        {"entry not an object", "{\"w\":[1]}", 0, TS_ERR_FORMAT, "tensor 'w': its entry is not an object"},
        {"duplicate tensor", "{" F32A ",\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         TS_ERR_FORMAT, "duplicate tensor name 'a'"},
        {"gap", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, TS_ERR_FORMAT,
         "tensor 'w': data_offsets [4, 8] leave a gap"},
        {"overlap", "{" F32A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[2,10]}}", 10, TS_ERR_FORMAT,
         "overlap"},
        {"size mismatch", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, TS_ERR_FORMAT,
         "tensor 'w': data_offsets [0, 4] hold 4 bytes, but F32 [2] needs 8"},
        {"end before begin", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, TS_ERR_FORMAT,
         "tensor 'w': data_offsets [4, 0]"},
        {"shape beyond the data", "{\"w\":{\"dtype\":\"U8\",\"shape\":[65536,65536],\"data_offsets\":[0,4]}}", 4,
         TS_ERR_FORMAT, "tensor 'w': shape [65536, 65536] is larger"},
        {"trailing bytes", "{" F32A "}", 8, TS_ERR_FORMAT, "(trailing bytes)"},
        {"truncated data", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, TS_ERR_FORMAT,
         "cover 16 bytes of data, the file holds 8 after the header (truncated?)"},
        {"truncated data 2", "{" F32A ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 4,
         TS_ERR_FORMAT, "(truncated?)"},
        {"metadata value", "{\"__metadata__\":{\"k\":1}," F32A "}", 4, TS_ERR_FORMAT, "value is not a string"},
        {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}," F32A "}", 4, TS_ERR_FORMAT,
         "second \"__metadata__\""},
        {"metadata key twice", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}," F32A "}", 4, TS_ERR_FORMAT,
         "duplicate \"__metadata__\" key 'k'"},
        {"deep nesting", "{\"w\":{\"x\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]"
                         "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],\"dtype\":\"F32\",\"shape\":[1],"
                         "\"data_offsets\":[0,4]}}",
         4, TS_ERR_FORMAT, "nested too deeply"},
        {"empty name", "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TS_ERR_FORMAT,
         "empty name"},
        {"bad literal", "{\"w\":{\"x\":nul,\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, TS_ERR_FORMAT,
         "expected a value"},
        {"missing colon", "{\"w\" {}}", 0, TS_ERR_FORMAT, "expected ':'"},
        {"missing comma", "{" F32A " \"b\":{}}", 4, TS_ERR_FORMAT, "expected ',' or '}'"},
    };
#undef F32A
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        /* "\\0" in a case's header stands for a raw NUL byte */
        char hdr[512];
        size_t hl = 0;
        for (const char *p = c->header; *p && hl < sizeof hdr - 1; p++) {
            if (p[0] == '\\' && p[1] == '0') {
                hdr[hl++] = '\0';
                p++;
            } else {
                hdr[hl++] = *p;
            }
        }
        FILE *f = fopen(path, "wb");
        unsigned char len[8];
        for (int b = 0; b < 8; b++) len[b] = (unsigned char)((uint64_t)hl >> (8 * b));
        fwrite(len, 1, 8, f);
        fwrite(hdr, 1, hl, f);
        fwrite(zeros, 1, c->ndata, f);
        fclose(f);
        ts_tensor_list l = TS_TENSOR_LIST_INIT;
        ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
        ts_status st = ts_safetensors_load(path, 0, &l, &m);
        tu_checks++;
        if (st != c->want || !strstr(ts_last_error(), c->mention) || !strstr(ts_last_error(), path)) {
            tu_failures++;
            fprintf(stderr, "corrupt case '%s': got %s '%s', want %s mentioning '%s'\n", c->what, ts_status_name(st),
                    ts_last_error(), ts_status_name(c->want), c->mention);
        }
        CHECK(l.n == 0 && m.n == 0); /* nothing appended on error */
    }
    /* the header length */
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    FILE *f = fopen(path, "wb");
    fwrite("\x04\0\0\0", 1, 4, f);
    fclose(f);
    CHECK_STATUS(ts_safetensors_load(path, 0, &l, NULL), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("truncated: 4 bytes");
    f = fopen(path, "wb");
    fwrite("\x00\x01\0\0\0\0\0\0{}", 1, 10, f);
    fclose(f);
    CHECK_STATUS(ts_safetensors_load(path, 0, &l, NULL), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("truncated: the header length is 256 bytes, the file has 2");
    f = fopen(path, "wb");
    fwrite("\x00\x00\x00\x10\0\0\0\0{}", 1, 10, f);
    fclose(f);
    CHECK_STATUS(ts_safetensors_load(path, 0, &l, NULL), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("above the format's limit");
    f = fopen(path, "wb");
    fwrite("\x08\0\0\0\0\0\0\0{\"\xc3\x28\":1}", 1, 16, f);
    fclose(f);
    CHECK_STATUS(ts_safetensors_load(path, 0, &l, NULL), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("invalid UTF-8 at byte 2");
    /* a U64 value past int64 */
    uint64_t big = (uint64_t)1 << 63;
    write_st(path, "{\"u\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[0,8]}}", true, &big, 8);
    CHECK_STATUS(ts_safetensors_load(path, 0, &l, NULL), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("tensor 'u': a U64 value does not fit int64");
    /* names from the file are printed escaped */
    write_st(path, "{\"\\u001b[31m\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", true, zeros, 4);
    CHECK_STATUS(ts_safetensors_load(path, 0, &l, NULL), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("tensor '\\x1b[31m'");
    /* not a regular file, not there */
    const char *fifo = tpath("fifo.safetensors");
    unlink(fifo);
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_STATUS(ts_safetensors_load(fifo, 0, &l, NULL), TS_ERR_IO);
    CHECK_ERR_MENTIONS("FIFO");
    CHECK(!ts_safetensors_probe(fifo));
    unlink(fifo);
    CHECK_STATUS(ts_safetensors_load(tpath("missing.safetensors"), 0, &l, NULL), TS_ERR_IO);
    /* every truncation of a good file is refused */
    ts_tensor_list good = TS_TENSOR_LIST_INIT;
    ts_tensor *t = make(TS_F32, 1, (int64_t[]){3}, 1), *u = make(TS_I64, 1, (int64_t[]){2}, 2);
    CHECK_OK(ts_tensor_list_append(&good, "x", t));
    CHECK_OK(ts_tensor_list_append(&good, "y", u));
    ts_tensor_release(t);
    ts_tensor_release(u);
    CHECK_OK(ts_safetensors_save(path, &good, NULL));
    size_t fn = 0;
    unsigned char *b = read_file(path, &fn);
    int accepted = 0;
    for (size_t n = 0; n < fn; n++) {
        ts_tensor_list o = TS_TENSOR_LIST_INIT;
        if (ts__safetensors_load_mem(b, n, "mem", 0, &o, NULL) == TS_OK) accepted++;
        ts_tensor_list_clear(&o);
    }
    CHECK(accepted == 0);
    CHECK_OK(ts__safetensors_load_mem(b, fn, "mem", 0, &l, NULL));
    CHECK(l.n == 2);
    ts_tensor_list_clear(&l);
    free(b);
    ts_tensor_list_clear(&good);
}

/* Many tensors and metadata entries: duplicates are found by sorting, not by a quadratic scan
 * (50000 of each take milliseconds; a scan would take seconds). */
static void test_many_entries(void) {
    const int n = 50000;
    size_t cap = (size_t)n * 96 + 64, k = 8;
    char *b = malloc(cap);
    k += (size_t)snprintf(b + k, cap - k, "{\"__metadata__\":{");
    for (int i = 0; i < n; i++) k += (size_t)snprintf(b + k, cap - k, "%s\"key%05d\":\"%d\"", i ? "," : "", i, i);
    k += (size_t)snprintf(b + k, cap - k, "}");
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(b + k, cap - k, ",\"t%d\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}", i);
    k += (size_t)snprintf(b + k, cap - k, "}");
    uint64_t hn = k - 8;
    for (int i = 0; i < 8; i++) b[i] = (char)(unsigned char)(hn >> (8 * i));
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
    double t0 = ts_time_now();
    CHECK_OK(ts__safetensors_load_mem(b, k, "many", 0, &l, &m));
    double secs = ts_time_now() - t0;
    CHECK(l.n == n && m.n == n);
    CHECK(m.n == n && strcmp(ts_safetensors_meta_get(&m, "key49999"), "49999") == 0);
    printf("  %d tensors and %d metadata entries loaded in %.3f s\n", n, n, secs);
    ts_tensor_list_clear(&l);
    ts_safetensors_meta_clear(&m);
    /* one duplicate at the end of each is still found */
    memcpy(strstr(b + 8, "\"key49999\""), "\"key00001\"", 10);
    CHECK_STATUS(ts__safetensors_load_mem(b, k, "many", 0, &l, &m), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("duplicate \"__metadata__\" key 'key00001'");
    free(b);
}

/* ---- saving refuses ------------------------------------------------------------------------------------ */
static void test_save_errors(void) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_tensor *t = make(TS_F32, 1, (int64_t[]){2}, 0);
    const char *path = tpath("save.safetensors");
    CHECK_OK(ts_tensor_list_append(&l, "w", t));
    CHECK_OK(ts_tensor_list_append(&l, "w", t));
    CHECK_STATUS(ts_safetensors_save(path, &l, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("duplicate tensor name 'w'");
    ts_tensor_list_clear(&l);
    CHECK_OK(ts_tensor_list_append(&l, "__metadata__", t));
    CHECK_STATUS(ts_safetensors_save(path, &l, NULL), TS_ERR_INVALID_ARG);
    ts_tensor_list_clear(&l);
    CHECK_OK(ts_tensor_list_append(&l, "bad\xff", t));
    CHECK_STATUS(ts_safetensors_save(path, &l, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("'bad\\xff' is not valid UTF-8");
    ts_tensor_list_clear(&l);
    CHECK_OK(ts_tensor_list_append(&l, "w", t));
    CHECK_STATUS(ts_safetensors_save("/dev/full", &l, NULL), TS_ERR_IO);
    CHECK_ERR_MENTIONS("character device");
    CHECK_STATUS(ts_safetensors_save(tu_tmpdir(), &l, NULL), TS_ERR_IO);
    CHECK_STATUS(ts_safetensors_save(tpath("no/such/dir.safetensors"), &l, NULL), TS_ERR_IO);
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
    CHECK_OK(ts_safetensors_meta_set(&m, "k", "\xc3"));
    CHECK_STATUS(ts_safetensors_save(path, &l, &m), TS_ERR_INVALID_ARG);
    CHECK(access(path, F_OK) != 0); /* nothing written */
    ts_safetensors_meta_clear(&m);
    ts_tensor_list_clear(&l);
    ts_tensor_release(t);
}

/* ---- checkpoints and models ------------------------------------------------------------------------------ */
/* The module's live parameter or buffer called name (borrowed: the module keeps it alive). */
static ts_tensor *sd_find(ts_module *m, const char *name) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_module_parameters(m, &l);
    ts_module_buffers(m, &l);
    ts_tensor *t = ts_tensor_list_find(&l, name);
    ts_tensor_list_clear(&l);
    return t;
}

static void test_export_and_weights(void) {
    ts_rng r;
    ts_rng_seed(&r, 5);
    ts_module *a = NULL, *b = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &a));
    CHECK_OK(ts_model_reference_cnn(&r, &b));
    int64_t seven = 7;
    ts_tensor_from_host(sd_find(a, "5.num_batches_tracked"), &seven, sizeof seven);
    ts_tensor_fill_(sd_find(a, "1.running_var"), 2.5f);
    ts_tensor_list sa = TS_TENSOR_LIST_INIT, back = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(a, &sa));
    ts_ckpt *ck = ts_ckpt_new();
    CHECK_OK(ts_ckpt_add_tensors(ck, "model.", &sa));
    CHECK_OK(ts_ckpt_set_bytes(ck, "train.model", "cnn", 3));
    CHECK_OK(ts_ckpt_set_i64(ck, "train.step", 42));
    const char *cpath = tpath("a.ckpt"), *spath = tpath("a.safetensors");
    CHECK_OK(ts_ckpt_save(ck, cpath));
    ts_ckpt_free(ck);
    int n = 0;
    CHECK_OK(ts_safetensors_export_ckpt(cpath, spath, &n));
    CHECK(n == sa.n);
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
    CHECK_OK(ts_safetensors_load(spath, 0, &back, &m));
    CHECK(back.n == sa.n);
    for (int i = 0; i < sa.n; i++) CHECK(same_tensor(sa.tensors[i], ts_tensor_list_find(&back, sa.names[i])));
    CHECK(ts_safetensors_meta_get(&m, "format") && strcmp(ts_safetensors_meta_get(&m, "format"), "pt") == 0);
    CHECK(ts_safetensors_meta_get(&m, "model") && strcmp(ts_safetensors_meta_get(&m, "model"), "cnn") == 0);
    CHECK(ts_safetensors_meta_get(&m, "step") && strcmp(ts_safetensors_meta_get(&m, "step"), "42") == 0);
    CHECK(ts_safetensors_meta_get(&m, "epoch") == NULL);
    ts_safetensors_meta_clear(&m);
    /* both formats load into a fresh model */
    const char *fmt = NULL;
    ts_tensor_list x = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_weights_read(cpath, &x, &fmt));
    CHECK(fmt && strcmp(fmt, "checkpoint") == 0 && x.n == sa.n);
    ts_tensor_list_clear(&x);
    CHECK_OK(ts_weights_read(spath, &x, &fmt));
    CHECK(fmt && strcmp(fmt, "safetensors") == 0 && x.n == sa.n);
    ts_tensor_list_clear(&x);
    CHECK(!same_tensor(sd_find(a, "0.weight"), sd_find(b, "0.weight")));
    CHECK_OK(ts_weights_load(b, spath));
    CHECK(same_tensor(sd_find(a, "0.weight"), sd_find(b, "0.weight")));
    CHECK(ts_tensor_item(sd_find(b, "5.num_batches_tracked"), 0) == 7);
    ts_module *c = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &c));
    CHECK_OK(ts_weights_load(c, cpath));
    CHECK(same_tensor(sd_find(a, "9.weight"), sd_find(c, "9.weight")));
    /* a checkpoint export refuses a checkpoint without a model */
    ck = ts_ckpt_new();
    CHECK_OK(ts_ckpt_set_i64(ck, "x", 1));
    CHECK_OK(ts_ckpt_save(ck, cpath));
    ts_ckpt_free(ck);
    CHECK_STATUS(ts_safetensors_export_ckpt(cpath, spath, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("no model.* tensors");
    CHECK_STATUS(ts_weights_load(c, cpath), TS_ERR_INVALID_ARG);
    const char *junk = tpath("junk.bin");
    FILE *f = fopen(junk, "wb");
    fputs("hello, world", f);
    fclose(f);
    CHECK_STATUS(ts_weights_load(c, junk), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("neither a safetensors file nor a Tessera checkpoint");

    /* wrong files: every missing, unexpected and misshaped tensor is named; nothing is copied */
    ts_tensor_list bad = TS_TENSOR_LIST_INIT;
    ts_tensor *w = make(TS_F32, 2, (int64_t[]){10, 64}, 3), *h = make(TS_F16, 1, (int64_t[]){128}, 4);
    for (int i = 0; i < sa.n; i++) {
        const char *nm = sa.names[i];
        if (strcmp(nm, "4.bias") == 0 || strcmp(nm, "1.running_mean") == 0) continue; /* missing */
        if (strcmp(nm, "11.weight") == 0) {
            CHECK_OK(ts_tensor_list_append(&bad, nm, w)); /* misshaped */
            continue;
        }
        if (strcmp(nm, "9.bias") == 0) {
            CHECK_OK(ts_tensor_list_append(&bad, nm, h)); /* F16: read as F32, fits */
            continue;
        }
        CHECK_OK(ts_tensor_list_append(&bad, nm, sa.tensors[i]));
    }
    CHECK_OK(ts_tensor_list_append(&bad, "12.weight", w)); /* unexpected */
    CHECK_OK(ts_tensor_list_append(&bad, "fc.bias", h));
    CHECK_OK(ts_safetensors_save(spath, &bad, NULL));
    ts_module *d = NULL;
    CHECK_OK(ts_model_reference_cnn(&r, &d));
    double d0 = ts_tensor_item(sd_find(d, "0.weight"), 0);
    CHECK_STATUS(ts_weights_load(d, spath), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS(spath);
    CHECK_ERR_MENTIONS("5 problems");
    CHECK_ERR_MENTIONS("2 missing keys in the state dict: '1.running_mean', '4.bias'");
    CHECK_ERR_MENTIONS("2 unexpected keys in the state dict: '12.weight', 'fc.bias'");
    CHECK_ERR_MENTIONS("size mismatch for '11.weight': the state dict has shape [10, 64], the model has shape [10, 128]");
    CHECK(ts_tensor_item(sd_find(d, "0.weight"), 0) == d0);
    /* with F16 9.bias alone wrong: loads, converted to float32 */
    ts_tensor_list_clear(&bad);
    for (int i = 0; i < sa.n; i++)
        CHECK_OK(ts_tensor_list_append(&bad, sa.names[i], strcmp(sa.names[i], "9.bias") == 0 ? h : sa.tensors[i]));
    CHECK_OK(ts_safetensors_save(spath, &bad, NULL));
    CHECK_OK(ts_weights_load(d, spath));
    CHECK(ts_tensor_dtype(sd_find(d, "9.bias")) == TS_F32);
    ts_tensor_list_clear(&bad);
    ts_tensor_release(w);
    ts_tensor_release(h);
    ts_tensor_list_clear(&sa);
    ts_tensor_list_clear(&back);
    ts_module_free(a);
    ts_module_free(b);
    ts_module_free(c);
    ts_module_free(d);
}

/* load_state_dict's report stays short: counts, 5 names per kind, then "... and N more". */
static void test_report_bounds(void) {
    ts_rng r;
    ts_rng_seed(&r, 1);
    ts_module *m = NULL;
    CHECK_OK(ts_model_mlp(&r, &m));
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_tensor *t = make(TS_F32, 1, (int64_t[]){1}, 0);
    char name[64];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "layer%03d.some_rather_long_parameter_name", i);
        CHECK_OK(ts_tensor_list_append(&l, name, t));
    }
    CHECK_OK(ts_tensor_list_append(&l, "1.weight", t)); /* misshaped too */
    CHECK_STATUS(ts_module_load_state_dict(m, &l, true), TS_ERR_SHAPE);
    const char *e = ts_last_error();
    CHECK(strlen(e) <= 1023 - 192); /* room left for a caller's "FILE: " */
    CHECK_ERR_MENTIONS("304 problems");
    CHECK_ERR_MENTIONS("3 missing keys in the state dict: '1.bias', '3.weight', '3.bias'");
    CHECK_ERR_MENTIONS("300 unexpected keys in the state dict: 'layer000.some_rather_long_parameter_name'");
    CHECK_ERR_MENTIONS(" more");
    CHECK_ERR_MENTIONS("size mismatch for '1.weight'");
    CHECK_ERR_MENTIONS("'layer004.some_rather_long_parameter_name', ... and 295 more");
    CHECK(!strstr(e, "layer005.")); /* at most 5 names */
    CHECK(strlen(e) < 640);
    /* not strict: missing and unexpected keys are fine, the mismatch is not */
    CHECK_STATUS(ts_module_load_state_dict(m, &l, false), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("1 problem: 1 tensor of another shape or dtype: size mismatch for '1.weight'");
    CHECK(!strstr(ts_last_error(), "unexpected"));
    ts_tensor_list_clear(&l);
    ts_tensor_release(t);
    ts_module_free(m);
}

/* ---- the CLI tests' helper ---------------------------------------------------------------------------------- */
/* test_safetensors --logits MODEL WEIGHTS INPUT.f32 SHAPE OUTPUT.f32 [CLASSES]: the eval-mode logits of
 * zoo model MODEL (CLASSES outputs; default the model's) with WEIGHTS loaded strictly, on the float32
 * input of SHAPE ("N" for N x 1 x 28 x 28, or "N,C,H,W"). */
static int logits_main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: test_safetensors --logits MODEL WEIGHTS INPUT.f32 N|N,C,H,W OUTPUT.f32 [CLASSES]\n");
        return 2;
    }
    int64_t shape[4] = {0, 1, 28, 28};
    int got = sscanf(argv[5], "%" SCNd64 ",%" SCNd64 ",%" SCNd64 ",%" SCNd64, &shape[0], &shape[1], &shape[2],
                     &shape[3]);
    int64_t classes = argc == 8 ? atoll(argv[7]) : 0, n = shape[0];
    ts_module *m = NULL;
    ts_tensor *x = NULL, *y = NULL;
    size_t bytes = 0;
    float *in = (float *)read_file(argv[4], &bytes);
    int rc = 1;
    if (!in || (got != 1 && got != 4) || n <= 0 ||
        bytes != (size_t)(n * shape[1] * shape[2] * shape[3]) * sizeof(float)) {
        fprintf(stderr, "--logits: %s: expected %s float32 values\n", argv[4], argv[5]);
        goto done;
    }
    if (ts_model_new(argv[2], classes, NULL, &m) != TS_OK || ts_weights_load(m, argv[3]) != TS_OK ||
        ts_tensor_from_data(NULL, TS_F32, 4, shape, in, &x) != TS_OK) {
        fprintf(stderr, "--logits: %s\n", ts_last_error());
        goto done;
    }
    ts_module_train(m, false);
    bool prev = ts_grad_set_enabled(false);
    ts_status st = ts_module_forward(m, x, &y);
    ts_grad_set_enabled(prev);
    if (st != TS_OK) {
        fprintf(stderr, "--logits: forward: %s\n", ts_last_error());
        goto done;
    }
    FILE *f = fopen(argv[6], "wb");
    if (f && fwrite(ts_tensor_data_f32(y), 1, ts_tensor_nbytes(y), f) == ts_tensor_nbytes(y) && fclose(f) == 0) rc = 0;
done:
    free(in);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_module_free(m);
    return rc;
}

/* A state dict from another zoo model: one line naming both models when the file says which model it came
 * from (a checkpoint's train.model), else the counts and the first 5 names of each kind. */
static void test_report_other_model(void) {
    ts_module *cnn = NULL, *mlp = NULL;
    CHECK_OK(ts_model_new("cnn", 0, NULL, &cnn));
    CHECK_OK(ts_model_new("mlp", 0, NULL, &mlp));
    if (!cnn || !mlp) return;
    CHECK(ts_module_model_name(cnn) && strcmp(ts_module_model_name(cnn), "cnn") == 0);
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(cnn, &sd));
    CHECK_STATUS(ts_module_load_state_dict_from(mlp, &sd, true, "cnn"), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("load_state_dict: this is a cnn checkpoint; the model is mlp (");
    CHECK(!strstr(ts_last_error(), "'0.weight'")); /* no key names */
    CHECK(strlen(ts_last_error()) < 160);
    /* unknown origin, or the same model: the short listing */
    CHECK_STATUS(ts_module_load_state_dict_from(mlp, &sd, true, NULL), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("missing keys in the state dict");
    CHECK(strlen(ts_last_error()) < 900);
    CHECK_STATUS(ts_module_load_state_dict_from(mlp, &sd, true, "mlp"), TS_ERR_SHAPE);
    CHECK(!strstr(ts_last_error(), "this is a"));
    /* a checkpoint naming its model, through ts_weights_load (tessera train --init-from) */
    char path[400];
    snprintf(path, sizeof path, "%s/cnn.ckpt", tu_tmpdir());
    ts_ckpt *ck = ts_ckpt_new();
    CHECK_OK(ts_ckpt_add_tensors(ck, "model.", &sd));
    CHECK_OK(ts_ckpt_set_bytes(ck, "train.model", "cnn", 3));
    CHECK_OK(ts_ckpt_save(ck, path));
    ts_ckpt_free(ck);
    CHECK_STATUS(ts_weights_load(mlp, path), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS(path);
    CHECK_ERR_MENTIONS("this is a cnn checkpoint; the model is mlp");
    CHECK_OK(ts_weights_load(cnn, path)); /* and the right model loads it */
    ts_tensor_list_clear(&sd);
    ts_module_free(cnn);
    ts_module_free(mlp);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--logits") == 0) return logits_main(argc, argv);
    static const tu_test tests[] = {T(test_round_trip), T(test_read_dtypes), T(test_corrupt), T(test_many_entries), T(test_save_errors),
                                    T(test_export_and_weights), T(test_report_bounds),
                                    T(test_report_other_model)};
    return tu_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
