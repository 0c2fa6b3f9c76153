/*
 * tests/fuzz/fuzz_tokens.c — libFuzzer target: the token shard check (src/data/tokens.c) and GPT-2's
 * vocab.json / merges.txt reader and encoder (src/data/tokenizer.c) on arbitrary bytes. The first byte
 * chooses:
 *   0: the rest is a shard file (ts__tokens_check, vocab bound from the second byte: 0 or 1..255 * 256);
 *   1: the rest is vocab.json, a NUL, merges.txt (ts__tokenizer_gpt2_mem); a tokenizer that loads encodes
 *      the two texts and must decode them back byte for byte;
 *   2: the rest is text for a fixed tokenizer (256 bytes and a few merges): encode, with and without special
 *      tokens, must decode back byte for byte, and the pre-tokens must tile the text.
 * Seeds: tests/fuzz/corpus/tokens.
 */
#include "data/tokens_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static ts_tokenizer *fixed;

static char *fixed_vocab(size_t *n) {
    size_t cap = 8192, o = 0;
    char *s = malloc(cap);
    o += (size_t)snprintf(s, cap, "{");
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)extra++;
        char u[3] = {0};
        if (cp < 0x80) u[0] = (char)cp;
        else u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F));
        o += (size_t)snprintf(s + o, cap - o, "%s\"%s\":%d", b ? "," : "", cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : u, b);
    }
    o += (size_t)snprintf(s + o, cap - o, ",\"\xc4\xa0t\":256,\"he\":257,\"\xc4\xa0the\":258,\"<|endoftext|>\":259}");
    *n = o;
    return s;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    ts_log_set_level(TS_LOG_OFF);
    size_t n;
    char *v = fixed_vocab(&n);
    const char *m = "#version: 0.2\n\xc4\xa0 t\nh e\n\xc4\xa0t he\n";
    if (ts__tokenizer_gpt2_mem(v, n, "v", m, strlen(m), "m", &fixed) != TS_OK) __builtin_trap();
    free(v);
    return 0;
}

static void round_trip(ts_tokenizer *t, const uint8_t *s, size_t n, bool special) {
    ts_token_list l = {0};
    if (ts_tokenizer_encode(t, (const char *)s, n, special, &l) != TS_OK) __builtin_trap();
    for (int64_t i = 0; i < l.n; i++)
        if (l.ids[i] >= ts_tokenizer_vocab_size(t)) __builtin_trap();
    char *back = NULL;
    size_t m = 0;
    if (ts_tokenizer_decode(t, l.ids, l.n, &back, &m) != TS_OK || m != n || memcmp(back, s, n) != 0) __builtin_trap();
    free(back);
    free(l.ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0] % 3;
    data++, size--;
    if (mode == 0) {
        int64_t n = -1, vocab = size ? (int64_t)data[0] * 256 : 0;
        if (ts__tokens_check(data, size, "fuzz", vocab, &n) == TS_OK && (size_t)(1024 + 2 * n) != size) __builtin_trap();
    } else if (mode == 1) {
        const uint8_t *nul = memchr(data, 0, size);
        size_t vn = nul ? (size_t)(nul - data) : size, mn = nul ? size - vn - 1 : 0;
        ts_tokenizer *t = NULL;
        if (ts__tokenizer_gpt2_mem((const char *)data, vn, "v", nul ? (const char *)nul + 1 : "", mn, "m", &t) == TS_OK) {
            round_trip(t, data, vn, true);
            round_trip(t, nul ? nul + 1 : data, mn, false);
        }
        ts_tokenizer_free(t);
    } else {
        round_trip(fixed, data, size, true);
        round_trip(fixed, data, size, false);
        for (size_t i = 0; i < size;) {
            size_t k = ts__gpt2_pretoken(data + i, size - i);
            if (k == 0 || k > size - i) __builtin_trap();
            i += k;
        }
    }
    return 0;
}
