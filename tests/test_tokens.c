/*
 * tests/test_tokens.c — token data for language models: llm.c's shard format (round trip, every refusal and
 * its message), the byte tokenizer, GPT-2's byte-level BPE against reference ids (tests/golden/tok: a
 * vocabulary trained on this machine and tiktoken's ids for a 91 KB text, which transformers' GPT2Tokenizer
 * gave too; scripts/gen_tok_golden.py), decode(encode(x)) == x on any bytes, the vocab/merges refusals,
 * and the token batch source against a plain reimplementation of llm.c's DistributedDataLoader.
 */
#include "core/internal.h"
#include "data/tokens_internal.h"
#include "test_util.h"

#include <stdint.h>
#include <sys/stat.h>

#define TOK_DIR TS_TEST_DIR "/golden/tok"

static const char *tmp_path(const char *name) {
    static char bufs[8][512];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%.255s/%.200s", tu_tmpdir(), name);
    return b;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

static char *read_all(const char *path, size_t *n) {
    char *b = NULL;
    *n = 0;
    CHECK_OK(ts_read_file(path, NULL, 1u << 30, &b, n));
    return b;
}

/* ---- shards ---------------------------------------------------------------------------------------- */
static void test_shard_round_trip(void) {
    uint32_t ids[1000];
    for (int i = 0; i < 1000; i++) ids[i] = (uint32_t)(i * 6151 % 65536);
    const char *p = tmp_path("a.bin");
    CHECK_OK(ts_tokens_write(p, ids, 1000));
    size_t n = 0;
    unsigned char *raw = (unsigned char *)read_all(p, &n);
    CHECK(n == 1024 + 2000);
    if (raw && n == 3024) { /* llm.c's header, byte by byte */
        int32_t h[256];
        memcpy(h, raw, sizeof h);
        CHECK(h[0] == 20240520 && h[1] == 1 && h[2] == 1000);
        bool zero = true;
        for (int i = 3; i < 256; i++) zero &= h[i] == 0;
        CHECK(zero);
        CHECK(raw[1024] == (ids[0] & 0xFF) && raw[1026] == (ids[1] & 0xFF) && raw[1027] == (ids[1] >> 8));
    }
    free(raw);
    ts_token_shard *s = NULL;
    CHECK_OK(ts_token_shard_open(p, 65536, &s));
    int64_t m = 0;
    const uint16_t *t = ts_token_shard_tokens(s, &m);
    CHECK(m == 1000 && t);
    bool same = t != NULL;
    for (int i = 0; t && i < 1000; i++) same &= t[i] == ids[i];
    CHECK(same);
    CHECK(strcmp(ts_token_shard_path(s), p) == 0);
    ts_token_shard_free(s);
    CHECK_OK(ts_tokens_write(p, NULL, 0)); /* an empty shard is a valid file */
    CHECK_OK(ts_token_shard_open(p, 0, &s));
    ts_token_shard_tokens(s, &m);
    CHECK(m == 0);
    ts_token_shard_free(s);
}

static void test_shard_refusals(void) {
    uint32_t ids[4] = {1, 2, 70000, 3};
    const char *p = tmp_path("bad.bin");
    CHECK_STATUS(ts_tokens_write(p, ids, 4), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("token 70000 at position 2");
    struct stat sb;
    CHECK(stat(p, &sb) != 0); /* nothing written */
    ids[2] = 9;
    CHECK_OK(ts_tokens_write(p, ids, 4));
    size_t n = 0;
    unsigned char *good = (unsigned char *)read_all(p, &n);
    if (!good) return;
    unsigned char buf[2048];
    ts_token_shard *s = NULL;
    memcpy(buf, good, n);
    buf[0] ^= 1;
    write_bytes(p, buf, n);
    CHECK_STATUS(ts_token_shard_open(p, 0, &s), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("bad magic");
    CHECK_ERR_MENTIONS("bad.bin");
    memcpy(buf, good, n);
    buf[4] = 7;
    write_bytes(p, buf, n);
    CHECK_STATUS(ts_token_shard_open(p, 0, &s), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("bad version 7");
    memcpy(buf, good, n);
    write_bytes(p, buf, n - 1);
    CHECK_STATUS(ts_token_shard_open(p, 0, &s), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("1031 bytes, but its header's 4 tokens make 1032");
    buf[8] = 0xFF, buf[9] = 0xFF, buf[10] = 0xFF, buf[11] = 0xFF;
    write_bytes(p, buf, n);
    CHECK_STATUS(ts_token_shard_open(p, 0, &s), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("negative token count -1");
    write_bytes(p, buf, 100);
    CHECK_STATUS(ts_token_shard_open(p, 0, &s), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("100 bytes, shorter than");
    write_bytes(p, good, n);
    CHECK_STATUS(ts_token_shard_open(p, 9, &s), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("token 9 at position 2 is outside the vocabulary of 9");
    CHECK_OK(ts_token_shard_open(p, 10, &s));
    ts_token_shard_free(s);
    CHECK_STATUS(ts_token_shard_open(tmp_path("missing.bin"), 0, &s), TS_ERR_IO);
    CHECK_ERR_MENTIONS("missing.bin");
    CHECK_STATUS(ts_token_shard_open(tu_tmpdir(), 0, &s), TS_ERR_IO);
    CHECK_ERR_MENTIONS("directory");
    CHECK(s == NULL);
    free(good);
}

/* ---- tokenizers ------------------------------------------------------------------------------------- */
static ts_tokenizer *golden_tokenizer(void) {
    ts_tokenizer *t = NULL;
    CHECK_OK(ts_tokenizer_gpt2(TOK_DIR "/vocab.json", TOK_DIR "/merges.txt", &t));
    return t;
}

static void check_round_trip(ts_tokenizer *t, const char *text, size_t n, bool special) {
    ts_token_list l = {0};
    CHECK_OK(ts_tokenizer_encode(t, text, n, special, &l));
    char *back = NULL;
    size_t m = 0;
    CHECK_OK(ts_tokenizer_decode(t, l.ids, l.n, &back, &m));
    CHECK(back && m == n && memcmp(back, text, n) == 0);
    free(back);
    free(l.ids);
}

static void test_bpe_golden(void) {
    ts_tokenizer *t = golden_tokenizer();
    if (!t) return;
    CHECK(ts_tokenizer_vocab_size(t) == 1280 && ts_tokenizer_eot(t) == 1279);
    size_t n = 0;
    char *text = read_all(TOK_DIR "/text.txt", &n);
    ts_token_shard *want = NULL;
    CHECK_OK(ts_token_shard_open(TOK_DIR "/text.ids.bin", 1280, &want));
    int64_t wn = 0;
    const uint16_t *w = ts_token_shard_tokens(want, &wn);
    for (int pass = 0; pass < 2 && text && w; pass++) { /* the second pass comes from the word cache */
        ts_token_list l = {0};
        CHECK_OK(ts_tokenizer_encode(t, text, n, true, &l));
        int64_t first = -1;
        for (int64_t i = 0; i < TS_MIN(l.n, wn) && first < 0; i++)
            if (l.ids[i] != w[i]) first = i;
        if (first >= 0 || l.n != wn)
            fprintf(stderr, "pass %d: %lld ids (want %lld), first difference at %lld: %u vs %u\n", pass, (long long)l.n,
                    (long long)wn, (long long)first, first >= 0 ? l.ids[first] : 0, first >= 0 ? w[first] : 0);
        CHECK(first < 0 && l.n == wn);
        free(l.ids);
    }
    if (text) {
        check_round_trip(t, text, n, true);
        check_round_trip(t, text, n, false);
    }
    free(text);
    ts_token_shard_free(want);
    ts_tokenizer_free(t);
}

static void test_bpe_special_and_bytes(void) {
    ts_tokenizer *t = golden_tokenizer();
    if (!t) return;
    ts_token_list a = {0}, b = {0};
    const char *s = "x<|endoftext|>y";
    CHECK_OK(ts_tokenizer_encode(t, s, strlen(s), true, &a));
    CHECK(a.n == 3 && a.ids[1] == 1279);
    CHECK_OK(ts_tokenizer_encode(t, s, strlen(s), false, &b));
    bool has_eot = false;
    for (int64_t i = 0; i < b.n; i++) has_eot |= b.ids[i] == 1279;
    CHECK(b.n > 3 && !has_eot); /* ordinary text: the bytes of "<|endoftext|>" */
    free(a.ids);
    free(b.ids);
    /* any bytes survive: invalid UTF-8, NULs, lone continuation bytes, surrogates, overlongs */
    unsigned char junk[512];
    for (int i = 0; i < 512; i++) junk[i] = (unsigned char)(i * 37 + (i >> 3));
    check_round_trip(t, (const char *)junk, sizeof junk, true);
    const char *edge = "\xff\xfe a\xc3 \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 caf\xc3\xa9 \xe2\x82";
    check_round_trip(t, edge, strlen(edge), true);
    check_round_trip(t, "", 0, true);
    uint32_t bad = 1280;
    char *out = NULL;
    size_t m = 0;
    CHECK_STATUS(ts_tokenizer_decode(t, &bad, 1, &out, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("id 1280 at position 0");
    ts_tokenizer_free(t);
    ts_tokenizer *bt = NULL;
    CHECK_OK(ts_tokenizer_new(TS_TOKENIZER_BYTES, NULL, NULL, &bt));
    CHECK(ts_tokenizer_vocab_size(bt) == 257 && ts_tokenizer_eot(bt) == 256);
    ts_token_list c = {0};
    CHECK_OK(ts_tokenizer_encode(bt, "A\xff<|endoftext|>", 15, true, &c));
    CHECK(c.n == 3 && c.ids[0] == 65 && c.ids[1] == 255 && c.ids[2] == 256);
    free(c.ids);
    check_round_trip(bt, (const char *)junk, sizeof junk, false);
    check_round_trip(bt, "a<|endoftext|>b", 15, true);
    ts_tokenizer_free(bt);
    ts_tokenizer_kind k;
    CHECK_OK(ts_tokenizer_kind_parse("gpt2", &k));
    CHECK(k == TS_TOKENIZER_GPT2 && strcmp(ts_tokenizer_kind_name(TS_TOKENIZER_BYTES), "bytes") == 0);
    CHECK_STATUS(ts_tokenizer_kind_parse("sentencepiece", &k), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("bytes or gpt2");
}

/* The pre-tokenizer alone: the pieces are Python regex's findall with GPT-2's pattern. */
static void test_pretokenizer(void) {
    static const struct {
        const char *text, *pieces; /* pieces separated by '|' */
    } cases[] = {
        {"Hello world", "Hello| world"},
        {"it's we're I've I'm you'll he'd don't", "it|'s| we|'re| I|'ve| I|'m| you|'ll| he|'d| don|'t"},
        {"IT'S ''s", "IT|'|S| ''|s"},
        {"a  b", "a| | b"},
        {"a   \n\nb  ", "a|   \n|\n|b|  "},
        {"x\ty", "x|\t|y"},
        {"12ab 3.5", "12|ab| 3|.|5"},
        {"\xce\x95\xce\xbb \xd9\xa3\xd9\xa4!", "\xce\x95\xce\xbb| \xd9\xa3\xd9\xa4|!"},
        {" \xe3\x80\x80x", " |\xe3\x80\x80|x"},
        {"\xff\xfe""ab", "\xff\xfe|ab"},
    };
    for (size_t c = 0; c < TS_ARRAY_LEN(cases); c++) {
        const unsigned char *s = (const unsigned char *)cases[c].text;
        size_t n = strlen(cases[c].text);
        char got[128] = "";
        size_t o = 0;
        for (size_t i = 0; i < n;) {
            size_t k = ts__gpt2_pretoken(s + i, n - i);
            if (o && o < sizeof got - 1) got[o++] = '|';
            for (size_t j = 0; j < k && o < sizeof got - 1; j++) got[o++] = (char)s[i + j];
            got[o] = '\0';
            i += k;
        }
        if (strcmp(got, cases[c].pieces) != 0) fprintf(stderr, "case %zu: got '%s'\n", c, got);
        CHECK(strcmp(got, cases[c].pieces) == 0);
    }
}

static ts_status gpt2_mem(const char *vocab, const char *merges, ts_tokenizer **t) {
    return ts__tokenizer_gpt2_mem(vocab, strlen(vocab), "v.json", merges, strlen(merges), "m.txt", t);
}

/* A vocab.json with the 256 byte tokens (GPT-2's spelling) plus extra members, as text. */
static char *byte_vocab(const char *extra) {
    size_t cap = 8192, o = 0;
    char *s = malloc(cap);
    o += (size_t)snprintf(s + o, cap - o, "{");
    int extra_n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)extra_n++;
        char u[4] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F));
        const char *esc = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : u;
        o += (size_t)snprintf(s + o, cap - o, "%s\"%s\":%d", b ? "," : "", esc, b);
    }
    snprintf(s + o, cap - o, "%s}", extra);
    return s;
}

static void test_vocab_refusals(void) {
    ts_tokenizer *t = NULL;
    char *v = byte_vocab(",\"ab\":256,\"<|endoftext|>\":257");
    CHECK_OK(gpt2_mem(v, "#version: 0.2\na b\n", &t));
    ts_token_list l = {0};
    CHECK_OK(ts_tokenizer_encode(t, "abab", 4, true, &l));
    CHECK(l.n == 2 && l.ids[0] == 256 && l.ids[1] == 256);
    free(l.ids);
    ts_tokenizer_free(t);
    CHECK_STATUS(gpt2_mem(v, "a b\nab c\n", &t), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("m.txt:2: the result of the merge is not in the vocabulary");
    CHECK_STATUS(gpt2_mem(v, "a b\nzz q\n", &t), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("m.txt:2: the first part");
    CHECK_STATUS(gpt2_mem(v, "ab\n", &t), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("m.txt:1: expected two tokens");
    free(v);
    v = byte_vocab(",\"ab\":258");
    CHECK_STATUS(gpt2_mem(v, "", &t), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("integer too large");
    free(v);
    v = byte_vocab(",\"ab\":255");
    CHECK_STATUS(gpt2_mem(v, "", &t), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("id 255 appears twice");
    free(v);
    v = byte_vocab(",\"\xe4\xb8\xad\":256");
    CHECK_STATUS(gpt2_mem(v, "", &t), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("not spelled in GPT-2's byte characters");
    free(v);
    CHECK_STATUS(gpt2_mem("{\"a\":0}", "", &t), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("v.json: 1 tokens");
    CHECK_STATUS(gpt2_mem("[1, 2]", "", &t), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("v.json");
    CHECK_STATUS(ts_tokenizer_gpt2(tmp_path("none.json"), TOK_DIR "/merges.txt", &t), TS_ERR_IO);
    CHECK_ERR_MENTIONS("none.json");
    CHECK(t == NULL);
}

static void test_entropy(void) {
    uint16_t ids[8] = {1, 1, 2, 2, 3, 3, 4, 4};
    CHECK_NEAR(ts_tokens_entropy_bits(ids, 8), 2.0, 1e-12);
    CHECK_NEAR(ts_tokens_entropy_bits(ids, 2), 0.0, 1e-12);
    CHECK_NEAR(ts_tokens_entropy_bits(ids, 0), 0.0, 0);
}


/* ---- the batch source ---------------------------------------------------------------------------------- */
#define NSHARDS 3
static const int64_t shard_len[NSHARDS] = {1000, 37, 2501}; /* the middle one holds no window of most sizes */
static uint16_t *shard_tok[NSHARDS];

static void make_shards(void) {
    ts_rng r;
    ts_rng_seed(&r, 7);
    for (int k = 0; k < NSHARDS; k++) {
        uint32_t *ids = malloc((size_t)shard_len[k] * sizeof *ids);
        shard_tok[k] = malloc((size_t)shard_len[k] * sizeof **shard_tok);
        for (int64_t i = 0; i < shard_len[k]; i++) shard_tok[k][i] = (uint16_t)(ids[i] = (uint32_t)ts_rng_below(&r, 50000));
        char name[64];
        snprintf(name, sizeof name, "s_train_%06d.bin", k);
        CHECK_OK(ts_tokens_write(tmp_path(name), ids, shard_len[k]));
        free(ids);
    }
}

static ts_batch_source *open_source(int64_t B, int64_t T, int rank, int world, bool shuffle) {
    ts_token_source_opts o = TS_TOKEN_SOURCE_OPTS_INIT;
    char pat[512];
    snprintf(pat, sizeof pat, "%s", tmp_path("s_train_*.bin"));
    o.pattern = pat;
    o.batch_size = B, o.seq_len = T, o.rank = rank, o.world_size = world, o.shuffle = shuffle, o.seed = 5;
    o.vocab_size = 50000;
    ts_batch_source *src = NULL;
    CHECK_OK(ts_batch_source_tokens(&o, &src));
    return src;
}

/* llm.c's DataLoader, written out plainly: rank r's windows as (shard, position), in order. */
static int64_t naive_windows(int64_t B, int64_t T, int r, int R, int64_t (*out)[2]) {
    int64_t n = 0;
    for (int k = 0; k < NSHARDS; k++) {
        int64_t shard_num_samples = (shard_len[k] - 1) / (R * B * T);
        for (int64_t g = 0; g < shard_num_samples; g++) {
            out[n][0] = k;
            out[n][1] = g * R * B * T + r * B * T;
            n++;
        }
    }
    return n;
}

static bool batch_is(const ts_batch *b, int64_t B, int64_t T, int k, int64_t p) {
    if (!b->x || b->size != B || b->real != B || ts_tensor_dtype(b->x) != TS_I64 || ts_tensor_dim(b->x, 1) != T)
        return false;
    const int64_t *x = ts_tensor_data(b->x), *y = ts_tensor_data(b->y);
    for (int64_t i = 0; i < B * T; i++)
        if (x[i] != shard_tok[k][p + i] || y[i] != shard_tok[k][p + i + 1]) return false;
    int64_t base = 0;
    for (int j = 0; j < k; j++) base += shard_len[j];
    return b->samples[0] == base + p && b->samples[B - 1] == base + p + (B - 1) * T;
}

static void test_source_matches_llmc(void) {
    static const int64_t cfg[][3] = {{1, 1, 1}, {2, 8, 1}, {4, 16, 2}, {3, 5, 3}, {1, 100, 4}, {2, 10, 8}};
    static int64_t want[4096][2];
    for (size_t c = 0; c < TS_ARRAY_LEN(cfg); c++) {
        int64_t B = cfg[c][0], T = cfg[c][1];
        int R = (int)cfg[c][2];
        for (int r = 0; r < R; r++) {
            int64_t n = naive_windows(B, T, r, R, want);
            ts_batch_source *src = open_source(B, T, r, R, false);
            if (!src) return;
            CHECK(ts_batch_source_num_batches(src, 0) == n && ts_batch_source_num_samples(src) == n * R * B);
            CHECK(ts_batch_source_num_classes(src) == 50000);
            bool ok = true;
            for (int epoch = 0; epoch < 2; epoch++) {
                CHECK_OK(ts_batch_source_set_epoch(src, epoch));
                ts_batch b;
                for (int64_t i = 0; i < n; i++) {
                    CHECK_OK(ts_batch_source_next(src, &b));
                    ok &= batch_is(&b, B, T, (int)want[i][0], want[i][1]) && b.index == i;
                }
                CHECK_OK(ts_batch_source_next(src, &b));
                ok &= b.x == NULL;
            }
            if (!ok) fprintf(stderr, "config B %lld T %lld rank %d of %d differs from llm.c\n", (long long)B,
                             (long long)T, r, R);
            CHECK(ok);
            ts_batch_source_free(src);
        }
    }
}

/* With shuffle: every epoch a permutation of the same windows, the same on every rank (no overlap), and a
 * seek to any batch gives what reading through gives. */
static void test_source_shuffle_and_seek(void) {
    const int64_t B = 2, T = 8;
    const int R = 2;
    static int64_t want[1024][2];
    int64_t n = naive_windows(B, T, 0, R, want);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        ts_batch_source *s0 = open_source(B, T, 0, R, shuffle), *s1 = open_source(B, T, 1, R, shuffle);
        ts_batch_source *jump = open_source(B, T, 0, R, shuffle);
        if (!s0 || !s1 || !jump) return;
        for (int epoch = 0; epoch < 3; epoch++) {
            CHECK_OK(ts_batch_source_set_epoch(s0, epoch));
            CHECK_OK(ts_batch_source_set_epoch(s1, epoch));
            int64_t *seen = calloc((size_t)n, sizeof *seen), moved = 0;
            bool ok = true;
            for (int64_t i = 0; i < n; i++) {
                ts_batch a, b, c;
                CHECK_OK(ts_batch_source_next(s0, &a));
                int64_t a0 = a.samples[0];
                CHECK_OK(ts_batch_source_next(s1, &b));
                ok &= b.samples[0] == a0 + B * T; /* the same window, rank 1's part */
                for (int64_t w = 0; w < n; w++) {
                    int64_t base = 0;
                    for (int j = 0; j < want[w][0]; j++) base += shard_len[j];
                    if (base + want[w][1] == a0) seen[w]++, moved += w != i;
                }
                if (i % 3 == 0) { /* a fresh seek lands on the same batch */
                    CHECK_OK(ts_batch_source_seek(jump, epoch, i));
                    CHECK_OK(ts_batch_source_next(jump, &c));
                    ok &= c.samples[0] == a0 && c.index == i;
                }
            }
            for (int64_t w = 0; w < n; w++) ok &= seen[w] == 1;
            CHECK(ok);
            CHECK(shuffle ? moved > 0 : moved == 0);
            free(seen);
        }
        ts_batch_source_free(s0);
        ts_batch_source_free(s1);
        ts_batch_source_free(jump);
    }
}

static void test_source_errors(void) {
    ts_token_source_opts o = TS_TOKEN_SOURCE_OPTS_INIT;
    ts_batch_source *src = NULL;
    char pat[512];
    snprintf(pat, sizeof pat, "%s", tmp_path("s_train_*.bin"));
    o.pattern = pat;
    o.batch_size = 4, o.seq_len = 1000;
    CHECK_STATUS(ts_batch_source_tokens(&o, &src), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("the largest of the 3 has 2501");
    o.seq_len = 8, o.vocab_size = 100;
    CHECK_STATUS(ts_batch_source_tokens(&o, &src), TS_ERR_FORMAT);
    CHECK_ERR_MENTIONS("s_train_000000.bin: token");
    o.vocab_size = 0, o.rank = 2, o.world_size = 2;
    CHECK_STATUS(ts_batch_source_tokens(&o, &src), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("rank 2 of 2");
    o.rank = 0, o.world_size = 1;
    o.pattern = tmp_path("nothing_*.bin");
    CHECK_STATUS(ts_batch_source_tokens(&o, &src), TS_ERR_IO);
    CHECK_ERR_MENTIONS("no files match");
    const char *files[2] = {tmp_path("s_train_000002.bin"), tmp_path("s_train_000000.bin")};
    o.pattern = NULL, o.files = files, o.num_files = 2; /* a list keeps its order */
    CHECK_OK(ts_batch_source_tokens(&o, &src));
    ts_batch b;
    CHECK_OK(ts_batch_source_next(src, &b));
    CHECK(b.x && b.samples[0] == 0 && ts_tensor_data(b.x) && ((int64_t *)ts_tensor_data(b.x))[0] == shard_tok[2][0]);
    CHECK(src == NULL || ts_batch_source_num_batches(src, 0) == (2501 - 1) / 32 + (1000 - 1) / 32);
    ts_batch_source_free(src);
    for (int k = 0; k < NSHARDS; k++) free(shard_tok[k]);
}

static void test_cleanup(void) { tu_rm_tmpdir(); }

TU_MAIN(T(test_shard_round_trip), T(test_shard_refusals), T(test_bpe_golden), T(test_bpe_special_and_bytes),
        T(test_pretokenizer), T(test_vocab_refusals), T(test_entropy),
        T(make_shards), T(test_source_matches_llmc), T(test_source_shuffle_and_seek), T(test_source_errors),
        T(test_cleanup))
