/*
 * nn/gpt_generate.c — GPT-2 inference with a key/value cache, and sampling (temperature, top-k, greedy).
 *
 * The cache holds, per layer, the keys and values of every position seen so far in two tensors
 * (1, H, seq_len, D) on the model's device; positions [0, len) are valid. A forward over n new tokens
 * runs the same modules as the training forward (nn/gpt.c's pieces) with autograd off, writes the new
 * keys and values into the cache at [len, len + n), and attends the new queries to the cache's first
 * len + n positions:
 *   - a prefill (len 0): causal attention over the n tokens (ts_scaled_dot_product_attention);
 *   - one token (n 1): its query against all len + 1 keys, no mask: O(T) per layer, not a forward over
 *     the sequence;
 *   - several tokens after a prefill are run one at a time (the op's causal mask is top-left aligned,
 *     which is only right when the queries start at position 0).
 * A device without the attention kernel (ts_scaled_dot_product_attention gives TS_ERR_UNSUPPORTED; found
 * once, when the cache is made) runs the single-token step as matmul, softmax, matmul and its prefill
 * one token at a time: the same numbers, on any device with matmul and softmax.
 */
#include "nn/gpt_internal.h"

#include <math.h>
#include <stdio.h>

struct ts_gpt_cache {
    ts_module *m; /* borrowed */
    ts_gpt_config c;
    int64_t len;
    ts_tensor **kv; /* 2 n_layer: layer l's keys at 2l, values at 2l + 1, each (1, H, seq_len, D) */
    bool sdpa;      /* the device has the attention kernel */
};

/* Whether ts_scaled_dot_product_attention runs on dev (TS_ERR_UNSUPPORTED: no; other errors are errors). */
static ts_status probe_sdpa(ts_device *dev, bool *ok) {
    const int64_t shape[4] = {1, 1, 1, 1};
    ts_tensor *q = NULL, *y = NULL;
    TS_TRY(ts_tensor_zeros(dev, TS_F32, 4, shape, &q));
    ts_status st = ts_scaled_dot_product_attention(q, q, q, false, 0.0, &y);
    *ok = st == TS_OK;
    if (st == TS_ERR_UNSUPPORTED) {
        ts_clear_error();
        st = TS_OK;
    }
    ts_tensor_release(q);
    ts_tensor_release(y);
    return st;
}

ts_status ts_gpt_cache_new(ts_module *m, ts_gpt_cache **out) {
    TS_ARG(m && out, "ts_gpt_cache_new: NULL argument");
    *out = NULL;
    ts_gpt_config c;
    TS_TRY(ts_gpt_get_config(m, &c));
    ts_device *dev = ts_tensor_device(ts_module_param(ts_module_child(m, "transformer.wte"), "weight"));
    ts_gpt_cache *k = ts__calloc(1, sizeof *k);
    if (k) k->kv = ts__calloc((size_t)(2 * c.n_layer), sizeof *k->kv);
    if (!k || !k->kv) {
        free(k);
        return ts_error(TS_ERR_NOMEM, "ts_gpt_cache_new: out of memory");
    }
    k->m = m;
    k->c = c;
    const int64_t shape[4] = {1, c.n_head, c.seq_len, c.n_embd / c.n_head};
    ts_status st = probe_sdpa(dev, &k->sdpa);
    for (int64_t i = 0; i < 2 * c.n_layer && st == TS_OK; i++) st = ts_tensor_empty(dev, TS_F32, 4, shape, &k->kv[i]);
    if (st != TS_OK) {
        ts_gpt_cache_free(k);
        return ts__error_prefix(st, "ts_gpt_cache_new");
    }
    *out = k;
    return TS_OK;
}

void ts_gpt_cache_free(ts_gpt_cache *c) {
    if (!c) return;
    for (int64_t i = 0; c->kv && i < 2 * c->c.n_layer; i++) ts_tensor_release(c->kv[i]);
    free(c->kv);
    free(c);
}

int64_t ts_gpt_cache_len(const ts_gpt_cache *c) { return c ? c->len : 0; }
void ts_gpt_cache_reset(ts_gpt_cache *c) {
    if (c) c->len = 0;
}

/* A view of a cache tensor (1, H, seq_len, D) at positions [t0, t0 + n): (1, H, n, D), its strides. */
static ts_status cache_view(const ts_tensor *t, int64_t t0, int64_t n, ts_tensor **out) {
    const int64_t shape[4] = {1, t->shape[1], n, t->shape[3]};
    TS_TRY(ts__view(t, 4, shape, out));
    memcpy((*out)->stride, t->stride, sizeof t->stride);
    (*out)->offset = t->offset + t0 * t->stride[2];
    return TS_OK;
}

/* One query row q (1, H, 1, D) against k, v (1, H, T, D): softmax(q k^T / sqrt(D)) v, by matmuls. */
static ts_status attend_one(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v, ts_tensor **out) {
    ts_tensor *kt = NULL, *s = NULL, *ss = NULL, *p = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_transpose(k, 2, 3, &kt));
    TS_CHECK_GOTO(ts_matmul(q, kt, &s));
    TS_CHECK_GOTO(ts_scale(s, (float)(1.0 / sqrt((double)ts_tensor_dim(q, 3))), &ss));
    TS_CHECK_GOTO(ts_softmax(ss, -1, &p));
    st = ts_matmul(p, v, out);
fail:
    ts_tensor_release(kt);
    ts_tensor_release(s);
    ts_tensor_release(ss);
    ts_tensor_release(p);
    return st;
}

/* Layer l's attention for x (1, n, C) at positions [len, len + n) (len 0, or n 1): (1, n, C). */
static ts_status attn_step(ts_gpt_cache *c, ts_module *attn, int64_t l, const ts_tensor *x, ts_tensor **out) {
    const int64_t n = ts_tensor_dim(x, 1), t0 = c->len;
    ts_tensor *qkv[3], *w = NULL, *ks = NULL, *vs = NULL, *y = NULL;
    TS_TRY(ts__gpt_qkv(attn, x, c->c.n_head, qkv));
    ts_status st;
    for (int i = 0; i < 2; i++) { /* the new keys and values into the cache */
        TS_CHECK_GOTO(cache_view(c->kv[2 * l + i], t0, n, &w));
        TS_CHECK_GOTO(ts_tensor_copy_(w, qkv[1 + i]));
        ts_tensor_release(w);
        w = NULL;
    }
    TS_CHECK_GOTO(cache_view(c->kv[2 * l], 0, t0 + n, &ks));
    TS_CHECK_GOTO(cache_view(c->kv[2 * l + 1], 0, t0 + n, &vs));
    if (c->sdpa)
        TS_CHECK_GOTO(ts_scaled_dot_product_attention(qkv[0], ks, vs, t0 == 0, 0.0, &y));
    else
        TS_CHECK_GOTO(attend_one(qkv[0], ks, vs, &y));
    st = ts__gpt_merge_heads(attn, y, out);
fail:
    for (int i = 0; i < 3; i++) ts_tensor_release(qkv[i]);
    ts_tensor_release(w);
    ts_tensor_release(ks);
    ts_tensor_release(vs);
    ts_tensor_release(y);
    return st;
}

/* Block l on x (1, n, C): x + attn(ln_1(x)), then + mlp(ln_2(.)). */
static ts_status block_step(ts_gpt_cache *c, int64_t l, const ts_tensor *x, ts_tensor **out) {
    char path[64];
    snprintf(path, sizeof path, "transformer.h.%lld", (long long)l);
    ts_module *blk = ts_module_child(c->m, path);
    ts_tensor *a = NULL, *o = NULL, *h = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_module_call(blk, "ln_1", x, &a));
    TS_CHECK_GOTO(attn_step(c, ts_module_child(blk, "attn"), l, a, &o)); /* the cached attention branch */
    TS_CHECK_GOTO(ts_add(x, o, &h));
    st = ts__gpt_residual(blk, "ln_2", "mlp", h, out); /* the MLP branch as the full forward's */
fail:
    ts_tensor_release(a);
    ts_tensor_release(o);
    ts_tensor_release(h);
    return st;
}

/* tokens[0..n) at positions [len, len + n) (len 0 or n 1; grad off, eval mode): logits (n, V), or of the
 * last token only (1, V) when last_only. */
static ts_status step(ts_gpt_cache *c, const int64_t *tokens, int64_t n, bool last_only, ts_tensor **logits) {
    ts_module *tr = ts_module_child(c->m, "transformer");
    ts_device *dev = ts_tensor_device(c->kv[0]);
    ts_tensor *tok = NULL, *x = NULL, *y = NULL, *h = NULL, *hl = NULL, *lg = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_tensor_from_data(dev, TS_I64, 2, (int64_t[]){1, n}, tokens, &tok));
    TS_CHECK_GOTO(ts__gpt_embed(tr, tok, c->len, &x));
    for (int64_t l = 0; l < c->c.n_layer; l++) {
        TS_CHECK_GOTO(block_step(c, l, x, &y));
        ts_tensor_release(x);
        x = y;
        y = NULL;
    }
    TS_CHECK_GOTO(ts_module_call(tr, "ln_f", x, &h));
    TS_CHECK_GOTO(ts_reshape(h, 2, (int64_t[]){n, c->c.n_embd}, &hl));
    if (last_only && n > 1) {
        ts_tensor *r = NULL;
        TS_CHECK_GOTO(ts_slice(hl, 0, n - 1, n, &r));
        ts_tensor_release(hl);
        hl = r;
    }
    TS_CHECK_GOTO(ts__gpt_head(c->m, hl, &lg));
    c->len += n;
    *logits = lg;
    lg = NULL;
fail:
    ts_tensor_release(tok);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_release(h);
    ts_tensor_release(hl);
    ts_tensor_release(lg);
    return st;
}

/* Checks, then runs tokens through step(): in one go, or one at a time (see the top of the file). */
static ts_status cache_run(ts_gpt_cache *c, const int64_t *tokens, int64_t n, bool last_only, ts_tensor **logits) {
    const char *fn = "ts_gpt_cache_forward";
    TS_ARG(c && tokens && n >= 1, "%s: NULL argument or no tokens (n %lld)", fn, (long long)n);
    TS_ARG(c->len + n <= c->c.seq_len, "%s: %lld cached + %lld new tokens exceed seq_len %lld", fn, (long long)c->len,
           (long long)n, (long long)c->c.seq_len);
    for (int64_t i = 0; i < n; i++)
        TS_ARG(tokens[i] >= 0 && tokens[i] < c->c.vocab_size, "%s: token %lld (at %lld) is outside [0, vocab_size %lld)",
               fn, (long long)tokens[i], (long long)i, (long long)c->c.vocab_size);
    const bool was_training = ts_module_is_training(c->m), grad = ts_grad_set_enabled(false);
    ts_module_train(c->m, false);
    ts_status st = TS_OK;
    if ((c->len == 0 && c->sdpa) || n == 1) {
        st = step(c, tokens, n, last_only, logits);
    } else { /* one at a time: the rows concatenated */
        ts_tensor **rows = ts__calloc((size_t)n, sizeof *rows);
        if (!rows) st = ts_error(TS_ERR_NOMEM, "%s: out of memory", fn);
        for (int64_t i = 0; i < n && st == TS_OK; i++) st = step(c, tokens + i, 1, false, &rows[i]);
        if (st == TS_OK && last_only) *logits = ts_tensor_retain(rows[n - 1]);
        else if (st == TS_OK) st = ts_concat(rows, (int)n, 0, logits);
        for (int64_t i = 0; rows && i < n; i++) ts_tensor_release(rows[i]);
        free(rows);
    }
    ts_grad_set_enabled(grad);
    ts_module_train(c->m, was_training);
    return st;
}

ts_status ts_gpt_cache_forward(ts_gpt_cache *c, const int64_t *tokens, int64_t n, ts_tensor **logits) {
    ts_tensor *l = NULL;
    ts_status st = cache_run(c, tokens, n, false, &l);
    if (st == TS_OK && logits)
        *logits = l;
    else
        ts_tensor_release(l);
    return st;
}

/* ---- sampling ---------------------------------------------------------------------------------------------- */
static int cmp_desc(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static int64_t argmax(const float *l, int64_t V) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

/* The next token from the logits l[0..V) (modified); scratch: V floats. The softmax of l / temperature is taken as
 * exp((l - max) / temperature) in double: finite for any temperature > 0. */
static int64_t sample(float *l, int64_t V, const ts_gpt_sample_config *sc, ts_rng *r, float *scratch) {
    if (sc->temperature == 0.0f || sc->top_k == 1) return argmax(l, V);
    if (sc->top_k > 0 && sc->top_k < V) { /* nanoGPT: logits below the k-th largest -> -inf */
        memcpy(scratch, l, sizeof(float) * (size_t)V);
        qsort(scratch, (size_t)V, sizeof(float), cmp_desc);
        const float kth = scratch[sc->top_k - 1];
        for (int64_t i = 0; i < V; i++)
            if (l[i] < kth) l[i] = -INFINITY;
    }
    const double mx = l[argmax(l, V)], t = sc->temperature;
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += exp(((double)l[i] - mx) / t);
    const double u = ts_rng_uniform(r) * sum;
    double acc = 0;
    int64_t last = 0;
    for (int64_t i = 0; i < V; i++) {
        const double p = exp(((double)l[i] - mx) / t);
        if (p <= 0) continue;
        last = i;
        acc += p;
        if (acc > u) return i;
    }
    return last;
}

/* The logits of the last position of seq[0..L) (cropped to its last seq_len tokens) into row (host). */
static ts_status context_logits(ts_gpt_cache *c, const int64_t *seq, int64_t L, float *row) {
    const int64_t start = L > c->c.seq_len ? L - c->c.seq_len : 0;
    ts_tensor *lg = NULL;
    ts_gpt_cache_reset(c);
    TS_TRY(cache_run(c, seq + start, L - start, true, &lg));
    ts_status st = ts_tensor_to_host(lg, row, sizeof(float) * (size_t)c->c.vocab_size);
    ts_tensor_release(lg);
    return st;
}

static ts_status generate_loop(ts_gpt_cache *c, int64_t *seq, int64_t L, const ts_gpt_sample_config *sc, int64_t *out,
                               int64_t *n_out) {
    const int64_t V = c->c.vocab_size;
    float *row = ts__malloc(sizeof(float) * (size_t)V), *scratch = ts__malloc(sizeof(float) * (size_t)V);
    ts_rng r;
    ts_rng_seed(&r, sc->seed);
    ts_status st = row && scratch ? context_logits(c, seq, L, row) : ts_error(TS_ERR_NOMEM, "ts_gpt_generate: out of memory");
    for (int64_t i = 0; i < sc->max_new_tokens && st == TS_OK; i++) {
        const int64_t tok = sample(row, V, sc, &r, scratch);
        out[i] = seq[L++] = tok;
        if (n_out) *n_out = i + 1;
        if ((sc->on_token && !sc->on_token(i, tok, sc->user)) || i + 1 == sc->max_new_tokens) break;
        if (c->len == c->c.seq_len) { /* full: nanoGPT's crop to the last seq_len tokens */
            st = context_logits(c, seq, L, row);
        } else {
            ts_tensor *lg = NULL;
            st = cache_run(c, &tok, 1, true, &lg);
            if (st == TS_OK) st = ts_tensor_to_host(lg, row, sizeof(float) * (size_t)V);
            ts_tensor_release(lg);
        }
    }
    free(row);
    free(scratch);
    return st;
}

ts_status ts_gpt_generate(ts_module *m, const int64_t *prompt, int64_t n_prompt, const ts_gpt_sample_config *sc,
                          int64_t *out, int64_t *n_out) {
    const char *fn = "ts_gpt_generate";
    TS_ARG(m && prompt && sc && (out || sc->max_new_tokens == 0), "%s: NULL argument", fn);
    TS_ARG(n_prompt >= 1, "%s: an empty prompt (give at least one token, e.g. GPT-2's <|endoftext|> 50256)", fn);
    TS_ARG(sc->max_new_tokens >= 0, "%s: max_new_tokens %lld must be >= 0", fn, (long long)sc->max_new_tokens);
    TS_ARG(sc->temperature >= 0 && isfinite(sc->temperature), "%s: temperature %g must be finite and >= 0", fn,
           (double)sc->temperature);
    TS_ARG(sc->top_k >= 0, "%s: top_k %lld must be >= 0", fn, (long long)sc->top_k);
    if (n_out) *n_out = 0;
    ts_gpt_config cfg;
    TS_TRY(ts_gpt_get_config(m, &cfg));
    for (int64_t i = 0; i < n_prompt; i++)
        TS_ARG(prompt[i] >= 0 && prompt[i] < cfg.vocab_size, "%s: prompt token %lld (at %lld) is outside [0, vocab_size %lld)",
               fn, (long long)prompt[i], (long long)i, (long long)cfg.vocab_size);
    ts_gpt_cache *c = NULL;
    TS_TRY(ts_gpt_cache_new(m, &c));
    int64_t *seq = ts__malloc(sizeof(int64_t) * (size_t)(n_prompt + sc->max_new_tokens));
    ts_status st = seq ? TS_OK : ts_error(TS_ERR_NOMEM, "%s: out of memory", fn);
    if (st == TS_OK) {
        memcpy(seq, prompt, sizeof(int64_t) * (size_t)n_prompt);
        st = generate_loop(c, seq, n_prompt, sc, out, n_out);
    }
    free(seq);
    ts_gpt_cache_free(c);
    return st;
}
