/*
 * data/tokens.c — token shards in llm.c's format (tessera/data.h): the writer, the mapped reader and
 * `tessera data tokenize`'s text-files-to-shards (ts_tokenize_files).
 *
 * Layout (dev/data/data_common.py write_datafile, "gpt-2"): 256 int32 little-endian -- [0] 20240520,
 * [1] 1, [2] n -- then n uint16 little-endian. llmc/dataloader.h checks the magic, the version and that
 * the file is exactly 1024 + 2 n bytes; so does ts__tokens_check, the one parser (the fuzz target's too).
 */
#include "core/internal.h"
#include "data/tokens_internal.h"
#include "tessera/data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token shards are read in place: little-endian hosts only"
#endif

struct ts_token_shard {
    char *path;
    void *map;
    size_t map_len;
    const uint16_t *tokens;
    int64_t n;
};

static int32_t le32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

ts_status ts__tokens_check(const void *buf, size_t len, const char *what, int64_t vocab_size, int64_t *n) {
    const unsigned char *b = buf;
    *n = 0;
    if (len < TS_TOKENS_HEADER_BYTES)
        return ts_error(TS_ERR_FORMAT, "%s: %zu bytes, shorter than a token shard's 1024-byte header", what, len);
    int32_t magic = le32(b), version = le32(b + 4), count = le32(b + 8);
    if (magic != TS_TOKENS_MAGIC)
        return ts_error(TS_ERR_FORMAT, "%s: bad magic %d, expected %d (not an llm.c token shard)", what, (int)magic,
                        TS_TOKENS_MAGIC);
    if (version != TS_TOKENS_VERSION)
        return ts_error(TS_ERR_FORMAT, "%s: bad version %d, expected %d (uint16 tokens; version 7 is llama-3's uint32)",
                        what, (int)version, TS_TOKENS_VERSION);
    if (count < 0) return ts_error(TS_ERR_FORMAT, "%s: negative token count %d in the header", what, (int)count);
    uint64_t want = TS_TOKENS_HEADER_BYTES + 2 * (uint64_t)count;
    if ((uint64_t)len != want)
        return ts_error(TS_ERR_FORMAT, "%s: %zu bytes, but its header's %d tokens make %llu (1024 + 2 per token)",
                        what, len, (int)count, (unsigned long long)want);
    if (vocab_size > 0) {
        const uint16_t *t = (const uint16_t *)(b + TS_TOKENS_HEADER_BYTES);
        for (int64_t i = 0; i < count; i++)
            if (t[i] >= vocab_size)
                return ts_error(TS_ERR_FORMAT, "%s: token %u at position %lld is outside the vocabulary of %lld", what,
                                (unsigned)t[i], (long long)i, (long long)vocab_size);
    }
    *n = count;
    return TS_OK;
}

ts_status ts_tokens_write(const char *path, const uint32_t *tokens, int64_t n) {
    TS_ARG(path && path[0] && (tokens || n == 0) && n >= 0, "ts_tokens_write: NULL argument or negative count");
    char esc[TS__PATH_ESC];
    if (n > TS_TOKENS_MAX)
        return ts_error(TS_ERR_INVALID_ARG, "%s: %lld tokens, more than a shard holds (%lld)", ts__path(path, esc),
                        (long long)n, (long long)TS_TOKENS_MAX);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] > UINT16_MAX)
            return ts_error(TS_ERR_INVALID_ARG, "%s: token %u at position %lld does not fit a uint16 shard (ids < 65536)",
                            ts__path(path, esc), (unsigned)tokens[i], (long long)i);
    unsigned char header[TS_TOKENS_HEADER_BYTES] = {0};
    const int32_t h[3] = {TS_TOKENS_MAGIC, TS_TOKENS_VERSION, (int32_t)n};
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++) header[4 * k + j] = (unsigned char)((uint32_t)h[k] >> (8 * j));
    char tmp[4096];
    FILE *f = NULL;
    TS_TRY(ts__atomic_open(path, "a token shard", tmp, sizeof tmp, &f));
    int werr = fwrite(header, 1, sizeof header, f) != sizeof header ? (errno ? errno : EIO) : 0;
    uint16_t chunk[4096];
    for (int64_t i = 0; i < n && !werr; i += 4096) {
        int64_t m = TS_MIN(4096, n - i);
        for (int64_t k = 0; k < m; k++) chunk[k] = (uint16_t)tokens[i + k];
        if (fwrite(chunk, 2, (size_t)m, f) != (size_t)m) werr = errno ? errno : EIO;
    }
    return ts__atomic_close(path, tmp, f, TS_OK, werr);
}

int64_t ts_token_shard_max_id(const ts_token_shard *s) {
    int64_t most = -1;
    for (int64_t i = 0; s && i < s->n; i++) most = s->tokens[i] > most ? s->tokens[i] : most;
    return most;
}

ts_status ts_token_shard_open(const char *path, int64_t vocab_size, ts_token_shard **out) {
    TS_ARG(path && out, "ts_token_shard_open: NULL argument");
    *out = NULL;
    int fd = -1;
    uint64_t size = 0;
    char esc[TS__PATH_ESC];
    ts__path(path, esc);
    TS_TRY(ts__open_regular(path, "a token shard", &fd, &size));
    ts_token_shard *s = ts__calloc(1, sizeof *s);
    char *name = ts__strdup(path);
    if (!s || !name) {
        close(fd);
        free(s);
        free(name);
        return ts_error(TS_ERR_NOMEM, "%s: out of memory", esc);
    }
    s->path = name;
    s->map_len = (size_t)size;
    if (size) {
        s->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (s->map == MAP_FAILED) {
            int e = errno;
            close(fd);
            s->map = NULL;
            ts_token_shard_free(s);
            return ts_error(TS_ERR_IO, "%s: cannot map %llu bytes: %s", esc, (unsigned long long)size, strerror(e));
        }
    }
    close(fd);
    ts_status st = ts__tokens_check(s->map ? s->map : "", s->map_len, esc, vocab_size, &s->n);
    if (st != TS_OK) {
        ts_token_shard_free(s);
        return st;
    }
    s->tokens = (const uint16_t *)((const char *)s->map + TS_TOKENS_HEADER_BYTES);
    *out = s;
    return TS_OK;
}

void ts_token_shard_free(ts_token_shard *s) {
    if (!s) return;
    if (s->map) munmap(s->map, s->map_len);
    free(s->path);
    free(s);
}

const uint16_t *ts_token_shard_tokens(const ts_token_shard *s, int64_t *n) {
    if (n) *n = s ? s->n : 0;
    return s ? s->tokens : NULL;
}

const char *ts_token_shard_path(const ts_token_shard *s) { return s ? s->path : NULL; }

double ts_tokens_entropy_bits(const uint16_t *ids, int64_t n) {
    if (!ids || n <= 0) return 0.0;
    int64_t *count = ts__calloc(65536, sizeof *count);
    if (!count) return NAN;
    for (int64_t i = 0; i < n; i++) count[ids[i]]++;
    double h = 0.0;
    for (int k = 0; k < 65536; k++)
        if (count[k]) {
            double p = (double)count[k] / (double)n;
            h -= p * log2(p);
        }
    free(count);
    return h;
}

/* ---- text files to shards --------------------------------------------------------------------------- */
static ts_status make_dir(const char *dir) {
    char esc[TS__PATH_ESC];
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) return TS_OK;
        return ts_error(TS_ERR_IO, "%s: is a %s, expected a folder for the shards", ts__path(dir, esc),
                        ts__file_type_name((unsigned)sb.st_mode));
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ts_error(TS_ERR_IO, "%s: cannot create the folder: %s", ts__path(dir, esc), strerror(errno));
    return TS_OK;
}

/* Writes ids[0..n) as shards of at most per tokens, DIR/<name>_<split>_<*index>.bin, *index going on. */
static ts_status write_split(const ts_tokenize_opts *o, const char *split, const uint32_t *ids, int64_t n,
                             int *index, int *shards) {
    for (int64_t at = 0; at < n; at += o->shard_tokens) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s_%s_%06d.bin", o->out_dir, o->name, split, *index) >= sizeof path)
            return ts_error(TS_ERR_INVALID_ARG, "ts_tokenize_files: the shard path is too long");
        TS_TRY(ts_tokens_write(path, ids + at, TS_MIN(o->shard_tokens, n - at)));
        (*index)++;
        (*shards)++;
    }
    return TS_OK;
}

/* Reads every input, EOT before each, into *all. */
static ts_status encode_inputs(const ts_tokenize_opts *o, ts_token_list *all, ts_tokenize_result *r) {
    int64_t eot = ts_tokenizer_eot(o->tok);
    for (int i = 0; i < o->num_inputs; i++) {
        char *text = NULL;
        size_t len = 0;
        TS_TRY(ts_read_file(o->inputs[i], "a text file", (uint64_t)1 << 40, &text, &len));
        r->bytes += (int64_t)len;
        ts_status st = TS_OK;
        if (eot >= 0) st = ts_tokenizer_encode(o->tok, "<|endoftext|>", 13, true, all);
        if (st == TS_OK) st = ts_tokenizer_encode(o->tok, text, len, o->special, all);
        free(text);
        if (st != TS_OK) {
            char esc[TS__PATH_ESC];
            return ts__error_prefix(st, "%s", ts__path(o->inputs[i], esc));
        }
    }
    return TS_OK;
}

ts_status ts_tokenize_files(const ts_tokenize_opts *o, ts_tokenize_result *r) {
    TS_ARG(o && r && o->tok && o->out_dir && o->name && o->name[0] && (o->inputs || o->num_inputs == 0),
           "ts_tokenize_files: NULL argument");
    TS_ARG(o->num_inputs > 0, "ts_tokenize_files: no input files");
    TS_ARG(o->shard_tokens > 0 && o->shard_tokens <= TS_TOKENS_MAX, "ts_tokenize_files: shard_tokens %lld not in 1..%lld",
           (long long)o->shard_tokens, (long long)TS_TOKENS_MAX);
    TS_ARG(o->val_tokens >= 0 && o->val_fraction >= 0 && o->val_fraction < 1,
           "ts_tokenize_files: val_fraction %g not in [0, 1) or negative val_tokens", o->val_fraction);
    TS_ARG(ts_tokenizer_vocab_size(o->tok) <= 65536, "ts_tokenize_files: a vocabulary of %lld does not fit uint16 shards",
           (long long)ts_tokenizer_vocab_size(o->tok));
    memset(r, 0, sizeof *r);
    r->vocab_size = ts_tokenizer_vocab_size(o->tok);
    TS_TRY(make_dir(o->out_dir));
    ts_token_list all = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ts_status st = encode_inputs(o, &all, r);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    r->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    r->tokens = all.n;
    r->val_tokens = o->val_tokens > 0 ? TS_MIN(o->val_tokens, all.n) : (int64_t)(o->val_fraction * (double)all.n);
    r->train_tokens = all.n - r->val_tokens;
    int index = 0;
    if (st == TS_OK) st = write_split(o, "val", all.ids, r->val_tokens, &index, &r->val_shards);
    if (st == TS_OK) st = write_split(o, "train", all.ids + r->val_tokens, r->train_tokens, &index, &r->train_shards);
    if (st == TS_OK) { /* entropy over the training ids, narrowed as they are stored */
        uint16_t *narrow = ts__malloc((size_t)TS_MAX(r->train_tokens, 1) * sizeof *narrow);
        if (!narrow) st = ts_error(TS_ERR_NOMEM, "ts_tokenize_files: out of memory");
        for (int64_t i = 0; narrow && i < r->train_tokens; i++) narrow[i] = (uint16_t)all.ids[r->val_tokens + i];
        if (narrow) r->entropy_bits = ts_tokens_entropy_bits(narrow, r->train_tokens);
        r->entropy_nats = r->entropy_bits * log(2.0);
        free(narrow);
    }
    free(all.ids);
    return st;
}
