/*
 * train/source_tokens.c — a batch source over llm.c token shards (ts_batch_source_tokens, tessera/train.h):
 * llm.c's DistributedDataLoader (llmc/dataloader.h) made seekable.
 *
 * llm.c: shard k of n_k tokens holds W_k = (n_k - 1) / (R B T) global windows; at window g, rank r reads
 * B T + 1 tokens from g R B T + r B T. The epoch walks shard 0's windows, then shard 1's, ... Here the
 * position is (epoch, batch index): the shard and window of batch b come from the running sum of W over
 * the epoch's shard order, and with shuffle both orders are functions of (seed, epoch), never of the past.
 */
#include "core/internal.h"
#include "tessera/data.h"
#include "tessera/train.h"

#include <glob.h>

typedef struct tok_source {
    ts_token_source_opts o;
    int n;                  /* shards */
    ts_token_shard **shard;
    int64_t *windows;       /* W_k per shard (file order) */
    int64_t *base;          /* the shard's first token in the files laid end to end */
    int64_t total;          /* windows per epoch */
    int64_t *order;         /* the epoch's shard order (n) */
    int64_t *perm, perm_n;  /* the current shard's window order (shuffle), its length */
    int64_t epoch, batch;   /* the next batch */
    int64_t cur, cur_start; /* position in order of the shard holding `batch`, its first batch index */
    ts_tensor *x, *y;
    int64_t *samples;
} tok_source;

static void tok_destroy(void *impl) {
    tok_source *s = impl;
    if (!s) return;
    for (int k = 0; k < s->n; k++) ts_token_shard_free(s->shard[k]);
    free(s->shard);
    free(s->windows);
    free(s->base);
    free(s->order);
    free(s->perm);
    ts_tensor_release(s->x);
    ts_tensor_release(s->y);
    free(s->samples);
    free(s);
}

static int64_t tok_num_batches(void *impl, int64_t epoch) {
    (void)epoch;
    return ((const tok_source *)impl)->total;
}

static int64_t tok_num_samples(void *impl) {
    const tok_source *s = impl;
    return s->total * s->o.world_size * s->o.batch_size;
}

static int tok_sample_shape(void *impl, int64_t *shape) {
    shape[0] = ((const tok_source *)impl)->o.seq_len;
    return 1;
}

static int64_t tok_num_classes(void *impl) { return ((const tok_source *)impl)->o.vocab_size; }

static uint64_t epoch_seed(const tok_source *s, int64_t salt) {
    return s->o.seed ^ ((uint64_t)s->epoch * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(salt + 1) * 0xD1B54A32D192ED03ull);
}

/* Enters position `cur` of the shard order: its window order (identity without shuffle). */
static ts_status enter_shard(tok_source *s) {
    int64_t w = s->windows[s->order[s->cur]];
    if (!s->o.shuffle) return TS_OK;
    if (w > s->perm_n) {
        int64_t *p = ts__realloc(s->perm, (size_t)w * sizeof *p);
        if (!p) return ts_error(TS_ERR_NOMEM, "token source: out of memory for %lld windows", (long long)w);
        s->perm = p;
    }
    s->perm_n = TS_MAX(s->perm_n, w);
    for (int64_t i = 0; i < w; i++) s->perm[i] = i;
    ts_rng r;
    ts_rng_seed(&r, epoch_seed(s, s->order[s->cur]));
    ts_rng_shuffle_i64(&r, s->perm, w);
    return TS_OK;
}

static ts_status tok_seek(void *impl, int64_t epoch, int64_t batch) {
    tok_source *s = impl;
    s->epoch = epoch;
    s->batch = batch;
    for (int k = 0; k < s->n; k++) s->order[k] = k;
    if (s->o.shuffle) {
        ts_rng r;
        ts_rng_seed(&r, epoch_seed(s, -1));
        ts_rng_shuffle_i64(&r, s->order, s->n);
    }
    s->cur = 0;
    s->cur_start = 0;
    while (s->cur < s->n - 1 && s->cur_start + s->windows[s->order[s->cur]] <= batch)
        s->cur_start += s->windows[s->order[s->cur++]];
    return enter_shard(s);
}

static ts_status tok_next(void *impl, ts_batch *out) {
    tok_source *s = impl;
    if (s->batch >= s->total) return TS_OK; /* out->x stays NULL: the epoch is over */
    while (s->batch - s->cur_start >= s->windows[s->order[s->cur]]) {
        s->cur_start += s->windows[s->order[s->cur++]];
        TS_TRY(enter_shard(s));
    }
    int64_t k = s->order[s->cur], j = s->batch - s->cur_start;
    int64_t g = s->o.shuffle ? s->perm[j] : j;
    int64_t B = s->o.batch_size, T = s->o.seq_len, R = s->o.world_size;
    int64_t p = g * R * B * T + s->o.rank * B * T;
    const uint16_t *t = ts_token_shard_tokens(s->shard[k], NULL) + p;
    int64_t *x = ts_tensor_data(s->x), *y = ts_tensor_data(s->y);
    for (int64_t i = 0; i < B * T; i++) {
        x[i] = t[i];
        y[i] = t[i + 1];
    }
    for (int64_t b = 0; b < B; b++) s->samples[b] = s->base[k] + p + b * T;
    out->x = s->x;
    out->y = s->y;
    out->size = out->real = B;
    out->samples = s->samples;
    s->batch++;
    return TS_OK;
}

static const ts_batch_source_ops tok_ops = {tok_num_batches, tok_num_samples, tok_seek,  tok_next,
                                            tok_sample_shape, tok_destroy,   tok_num_classes, NULL};

/* Opens the shards (names from the list or the glob) and counts their windows. */
static ts_status open_shards(tok_source *s, const char *const *files, int n) {
    s->shard = ts__calloc((size_t)n, sizeof *s->shard);
    s->windows = ts__calloc((size_t)n, sizeof *s->windows);
    s->base = ts__calloc((size_t)n, sizeof *s->base);
    s->order = ts__calloc((size_t)n, sizeof *s->order);
    if (!s->shard || !s->windows || !s->base || !s->order) return TS_ERR_NOMEM;
    int64_t span = s->o.world_size * s->o.batch_size * s->o.seq_len, at = 0, most = 0;
    for (int k = 0; k < n; k++) {
        TS_TRY(ts_token_shard_open(files[k], s->o.vocab_size, &s->shard[k]));
        s->n = k + 1;
        int64_t len = 0;
        ts_token_shard_tokens(s->shard[k], &len);
        s->windows[k] = len > 0 ? (len - 1) / span : 0;
        s->base[k] = at;
        at += len;
        most = TS_MAX(most, len);
        s->total += s->windows[k];
    }
    if (s->total == 0)
        return ts_error(TS_ERR_INVALID_ARG,
                        "token source: no shard holds one window of world_size x B x T + 1 = %lld x %lld x %lld + 1 "
                        "tokens (the largest of the %d has %lld)",
                        (long long)s->o.world_size, (long long)s->o.batch_size, (long long)s->o.seq_len, n,
                        (long long)most);
    return TS_OK;
}

static ts_status tok_open(tok_source *s, const ts_token_source_opts *o) {
    ts_status st;
    if (o->pattern) {
        glob_t g;
        memset(&g, 0, sizeof g);
        int rc = glob(o->pattern, 0, NULL, &g);
        char esc[TS__PATH_ESC];
        if (rc != 0 || g.gl_pathc == 0 || g.gl_pathc > INT32_MAX) {
            globfree(&g);
            return ts_error(TS_ERR_IO, "token source: no files match %s", ts__path(o->pattern, esc));
        }
        st = open_shards(s, (const char *const *)g.gl_pathv, (int)g.gl_pathc);
        globfree(&g);
    } else
        st = open_shards(s, o->files, o->num_files);
    if (st != TS_OK) return st;
    int64_t shape[2] = {o->batch_size, o->seq_len};
    TS_TRY(ts_tensor_empty(NULL, TS_I64, 2, shape, &s->x));
    TS_TRY(ts_tensor_empty(NULL, TS_I64, 2, shape, &s->y));
    s->samples = ts__calloc((size_t)o->batch_size, sizeof *s->samples);
    if (!s->samples) return TS_ERR_NOMEM;
    return tok_seek(s, 0, 0);
}

ts_status ts_batch_source_tokens(const ts_token_source_opts *o, ts_batch_source **out) {
    TS_ARG(o && out && (o->pattern || (o->files && o->num_files > 0)),
           "ts_batch_source_tokens: NULL argument, or neither a pattern nor files");
    *out = NULL;
    TS_ARG(o->batch_size > 0 && o->seq_len > 0 && o->world_size > 0 && o->rank >= 0 && o->rank < o->world_size &&
               o->vocab_size >= 0,
           "ts_batch_source_tokens: B %lld, T %lld, rank %d of %d, vocab %lld (B, T, world_size > 0; 0 <= rank < "
           "world_size)", (long long)o->batch_size, (long long)o->seq_len, o->rank, o->world_size,
           (long long)o->vocab_size);
    TS_ARG(o->batch_size <= (INT64_C(1) << 40) / o->seq_len / o->world_size,
           "ts_batch_source_tokens: world_size x B x T is too large");
    tok_source *s = ts__calloc(1, sizeof *s);
    if (!s) return TS_ERR_NOMEM;
    s->o = *o;
    s->o.files = NULL; /* borrowed only while this call runs */
    s->o.pattern = NULL;
    ts_status st = tok_open(s, o);
    if (st != TS_OK) {
        tok_destroy(s);
        return st;
    }
    return ts_batch_source_new(&tok_ops, s, out);
}
