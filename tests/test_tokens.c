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

static void test_cleanup(void) { tu_rm_tmpdir(); }

TU_MAIN(T(test_shard_round_trip), T(test_shard_refusals), T(test_bpe_golden), T(test_bpe_special_and_bytes),
        T(test_pretokenizer), T(test_vocab_refusals), T(test_entropy), T(test_cleanup))
