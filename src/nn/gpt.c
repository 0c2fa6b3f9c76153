/*
 * nn/gpt.c — the GPT-2 family model (Hugging Face's GPT2LMHeadModel: its state-dict names and shapes),
 * its presets, and its state dicts in and out. Generation with a key/value cache: nn/gpt_generate.c.
 *
 * The tree is custom modules (nn/custom.c) named as Hugging Face's:
 *   GPT2LMHeadModel                      forward: transformer, then logits = h wte^T (the tied head)
 *     transformer: GPT2Model             wte, wpe (Embedding), h (Sequential of GPT2Block), ln_f (LayerNorm)
 *       h.<i>: GPT2Block                 ln_1, attn (GPT2Attention: c_attn, c_proj), ln_2, mlp (GPT2MLP: c_fc, c_proj)
 *   Conv1D                               weight [in, out], bias [out]: y = x W + b
 * Conv1D keeps Hugging Face's [in, out] layout (a matmul, no transpose): the module's state dict is then
 * the file's, so checkpoints, ts_safetensors_export_ckpt and the optimizer state use GPT-2's names and
 * shapes with no conversion anywhere; the product is one sgemm either way (the BLAS takes either layout
 * at the same speed), and the bias is one broadcast add.
 *
 * Every custom module of one model shares one gpt_ctx (the root owns it).
 */
#include "nn/gpt_internal.h"
#include "tessera/safetensors.h"

#include <math.h>
#include <stdio.h>

const char ts__gpt_model_name[] = "gpt2";

/* ---- presets ---------------------------------------------------------------------------------------- */
static const struct {
    const char *name;
    int64_t n_layer, n_head, n_embd, seq_len, vocab;
} presets[] = {{"gpt2", 12, 12, 768, 1024, 50257},         {"gpt2-medium", 24, 16, 1024, 1024, 50257},
               {"gpt2-large", 36, 20, 1280, 1024, 50257},  {"gpt2-xl", 48, 25, 1600, 1024, 50257},
               {"gpt2-tiny", 2, 2, 64, 64, 512}};
#define NPRESETS ((int)(sizeof presets / sizeof presets[0]))

const char *ts_gpt_preset_name_at(int i) { return i >= 0 && i < NPRESETS ? presets[i].name : NULL; }

ts_status ts_gpt_preset(const char *name, ts_gpt_config *out) {
    TS_ARG(out, "ts_gpt_preset: NULL out");
    for (int i = 0; name && i < NPRESETS; i++)
        if (!strcmp(presets[i].name, name)) {
            *out = TS_GPT_CONFIG_INIT;
            out->n_layer = presets[i].n_layer;
            out->n_head = presets[i].n_head;
            out->n_embd = presets[i].n_embd;
            out->seq_len = presets[i].seq_len;
            out->vocab_size = presets[i].vocab;
            return TS_OK;
        }
    char known[160] = "";
    for (int i = 0; i < NPRESETS; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", presets[i].name);
    return ts_error(TS_ERR_INVALID_ARG, "ts_gpt_preset: unknown GPT preset '%s' (known: %s)", name ? name : "(null)",
                    known);
}

ts_status ts_gpt_config_check(const ts_gpt_config *c) {
    TS_ARG(c, "ts_gpt_config_check: NULL config");
    TS_ARG(c->n_layer >= 1, "GPT config: n_layer %lld must be >= 1", (long long)c->n_layer);
    TS_ARG(c->n_head >= 1, "GPT config: n_head %lld must be >= 1", (long long)c->n_head);
    TS_ARG(c->n_embd >= 1 && c->n_embd % c->n_head == 0, "GPT config: n_embd %lld must be >= 1 and divisible by n_head %lld",
           (long long)c->n_embd, (long long)c->n_head);
    TS_ARG(c->seq_len >= 1, "GPT config: seq_len %lld must be >= 1", (long long)c->seq_len);
    TS_ARG(c->vocab_size >= 1, "GPT config: vocab_size %lld must be >= 1", (long long)c->vocab_size);
    TS_ARG(c->dropout >= 0 && c->dropout < 1, "GPT config: dropout %g must be in [0, 1)", (double)c->dropout);
    TS_ARG(c->layer_norm_eps > 0 && isfinite(c->layer_norm_eps), "GPT config: layer_norm_eps %g must be > 0",
           (double)c->layer_norm_eps);
    TS_ARG(c->init_std >= 0 && isfinite(c->init_std), "GPT config: init_std %g must be >= 0", (double)c->init_std);
    return TS_OK;
}

/* ---- forward functions ------------------------------------------------------------------------------- */
static const gpt_ctx *ctx_of(const ts_module *m) { return ts_module_ctx(m); }

/* x: (N..., in) -> (N..., out) = x W + b, W [in, out] */
static ts_status conv1d_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    const ts_tensor *w = ts_module_param(self, "weight"), *b = ts_module_param(self, "bias");
    const int64_t in = ts_tensor_dim(w, 0), nout = ts_tensor_dim(w, 1);
    if (ts_tensor_ndim(x) < 1 || ts_tensor_dim(x, -1) != in) {
        char s[96];
        return ts_error(TS_ERR_SHAPE, "Conv1D: input %s does not end in in_features %lld",
                        ts_shape_str(ts_tensor_ndim(x), ts_tensor_shape(x), s, sizeof s), (long long)in);
    }
    int64_t shape[TS_MAX_DIMS];
    const int nd = ts_tensor_ndim(x);
    memcpy(shape, ts_tensor_shape(x), sizeof(int64_t) * (size_t)nd);
    shape[nd - 1] = nout;
    if (nd > 1) shape[0] = -1; /* the batch as -1: an exported graph keeps it symbolic */
    ts_tensor *x2 = NULL, *y = NULL, *yb = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_reshape(x, 2, (int64_t[]){-1, in}, &x2));
    TS_CHECK_GOTO(ts_matmul(x2, w, &y));
    TS_CHECK_GOTO(ts_add(y, b, &yb));
    st = ts_reshape(yb, nd, shape, out);
fail:
    ts_tensor_release(x2);
    ts_tensor_release(y);
    ts_tensor_release(yb);
    return st;
}

/* (B, T, C) -> q, k, v each (B, H, T, D) through c_attn */
ts_status ts__gpt_qkv(ts_module *attn, const ts_tensor *x, int64_t n_head, ts_tensor *qkv[3]) {
    const int64_t T = ts_tensor_dim(x, 1), C = ts_tensor_dim(x, 2);
    ts_tensor *a = NULL, *a5 = NULL, *p = NULL, *s = NULL;
    ts_status st;
    qkv[0] = qkv[1] = qkv[2] = NULL;
    TS_CHECK_GOTO(ts_module_call(attn, "c_attn", x, &a));                          /* (B, T, 3C) */
    TS_CHECK_GOTO(ts_reshape(a, 5, (int64_t[]){-1, T, 3, n_head, C / n_head}, &a5)); /* (B, T, 3, H, D) */
    TS_CHECK_GOTO(ts_permute(a5, (int[]){2, 0, 3, 1, 4}, &p));                     /* (3, B, H, T, D) */
    for (int i = 0; i < 3; i++) {
        TS_CHECK_GOTO(ts_slice(p, 0, i, i + 1, &s));
        TS_CHECK_GOTO(ts_reshape(s, 4, (int64_t[]){-1, n_head, T, C / n_head}, &qkv[i]));
        ts_tensor_release(s);
        s = NULL;
    }
fail:
    if (st != TS_OK)
        for (int i = 0; i < 3; i++) {
            ts_tensor_release(qkv[i]);
            qkv[i] = NULL;
        }
    ts_tensor_release(a);
    ts_tensor_release(a5);
    ts_tensor_release(p);
    ts_tensor_release(s);
    return st;
}

/* y (B, H, T, D) -> (B, T, C) -> c_proj */
ts_status ts__gpt_merge_heads(ts_module *attn, const ts_tensor *y, ts_tensor **out) {
    const int64_t H = ts_tensor_dim(y, 1), T = ts_tensor_dim(y, 2), D = ts_tensor_dim(y, 3);
    ts_tensor *t = NULL, *r = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_transpose(y, 1, 2, &t));
    TS_CHECK_GOTO(ts_reshape(t, 3, (int64_t[]){-1, T, H * D}, &r));
    st = ts_module_call(attn, "c_proj", r, out);
fail:
    ts_tensor_release(t);
    ts_tensor_release(r);
    return st;
}

/* dropout p when training (a new reference to x otherwise) */
static ts_status maybe_dropout(const ts_module *self, ts_tensor **x) {
    const float p = ctx_of(self)->c.dropout;
    if (p <= 0.0f || !ts_module_is_training(self)) return TS_OK;
    ts_tensor *y = NULL;
    TS_TRY(ts_dropout(*x, p, true, NULL, &y));
    ts_tensor_release(*x);
    *x = y;
    return TS_OK;
}

/* x (B, T, C) -> causal self-attention (B, T, C) */
static ts_status attn_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    if (ts_tensor_ndim(x) != 3) return ts_error(TS_ERR_SHAPE, "GPT2Attention: input must be (B, T, C)");
    ts_tensor *qkv[3], *y = NULL;
    TS_TRY(ts__gpt_qkv(self, x, ctx_of(self)->c.n_head, qkv));
    ts_status st = ts_scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], true, 0.0, &y);
    if (st == TS_OK) st = ts__gpt_merge_heads(self, y, out);
    if (st == TS_OK) st = maybe_dropout(self, out);
    for (int i = 0; i < 3; i++) ts_tensor_release(qkv[i]);
    ts_tensor_release(y);
    return st;
}

static ts_status mlp_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *h = NULL, *g = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_module_call(self, "c_fc", x, &h));
    TS_CHECK_GOTO(ts_gelu(h, true, &g));
    TS_CHECK_GOTO(ts_module_call(self, "c_proj", g, out));
    st = maybe_dropout(self, out);
fail:
    ts_tensor_release(h);
    ts_tensor_release(g);
    return st;
}

/* x + child(ln(x)) */
ts_status ts__gpt_residual(ts_module *self, const char *ln, const char *child, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *a = NULL, *b = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_module_call(self, ln, x, &a));
    TS_CHECK_GOTO(ts_module_call(self, child, a, &b));
    st = ts_add(x, b, out);
fail:
    ts_tensor_release(a);
    ts_tensor_release(b);
    return st;
}

static ts_status block_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *h = NULL;
    TS_TRY(ts__gpt_residual(self, "ln_1", "attn", x, &h));
    ts_status st = ts__gpt_residual(self, "ln_2", "mlp", h, out);
    ts_tensor_release(h);
    return st;
}

/* tokens (B, T) TS_I64 -> (B, T, C) from wte and wpe at positions pos0..pos0+T-1 */
ts_status ts__gpt_embed(ts_module *transformer, const ts_tensor *tokens, int64_t pos0, ts_tensor **out) {
    const int64_t T = ts_tensor_dim(tokens, 1);
    int64_t *pos = ts__malloc(sizeof(int64_t) * (size_t)T);
    if (!pos) return ts_error(TS_ERR_NOMEM, "GPT2Model: out of memory");
    for (int64_t t = 0; t < T; t++) pos[t] = pos0 + t;
    ts_tensor *p = NULL, *te = NULL, *pe = NULL;
    ts_device *dev = ts_tensor_device(ts_module_param(ts_module_child(transformer, "wte"), "weight"));
    ts_status st;
    TS_CHECK_GOTO(ts_tensor_from_data(dev, TS_I64, 1, &T, pos, &p));
    TS_CHECK_GOTO(ts_module_call(transformer, "wte", tokens, &te));
    TS_CHECK_GOTO(ts_module_call(transformer, "wpe", p, &pe));
    st = ts_add(te, pe, out);
fail:
    free(pos);
    ts_tensor_release(p);
    ts_tensor_release(te);
    ts_tensor_release(pe);
    return st;
}

static ts_status check_tokens(const gpt_ctx *g, const ts_tensor *x) {
    char s[96];
    ts_shape_str(ts_tensor_ndim(x), ts_tensor_shape(x), s, sizeof s);
    if (ts_tensor_dtype(x) != TS_I64 || ts_tensor_ndim(x) != 2)
        return ts_error(TS_ERR_SHAPE, "GPT2: input %s %s must be (batch, sequence) token ids of dtype int64", s,
                        ts_dtype_name(ts_tensor_dtype(x)));
    const int64_t T = ts_tensor_dim(x, 1);
    if (T < 1 || T > g->c.seq_len)
        return ts_error(TS_ERR_SHAPE, "GPT2: input %s: sequence length %lld must be in [1, seq_len %lld]", s,
                        (long long)T, (long long)g->c.seq_len);
    return TS_OK;
}

/* tokens (B, T), checked -> wte + wpe, then dropout when training: what the first block takes */
ts_status ts__gpt_embed_input(ts_module *transformer, const ts_tensor *x, ts_tensor **out) {
    TS_TRY(check_tokens(ctx_of(transformer), x));
    TS_TRY(ts__gpt_embed(transformer, x, 0, out));
    ts_status st = maybe_dropout(transformer, out);
    if (st != TS_OK) {
        ts_tensor_release(*out);
        *out = NULL;
    }
    return st;
}

/* tokens (B, T) -> hidden states (B, T, C) after ln_f */
static ts_status transformer_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *e = NULL, *h = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts__gpt_embed_input(self, x, &e));
    TS_CHECK_GOTO(ts_module_call(self, "h", e, &h));
    st = ts_module_call(self, "ln_f", h, out);
fail:
    ts_tensor_release(e);
    ts_tensor_release(h);
    return st;
}

/* h (..., C) -> logits (..., vocab) = h wte^T */
ts_status ts__gpt_head(ts_module *root, const ts_tensor *h, ts_tensor **out) {
    return ts__gpt_logits(ts_module_param(ts_module_child(root, "transformer.wte"), "weight"), h, out);
}

/* h (..., C) -> h wte^T (..., vocab) */
ts_status ts__gpt_logits(const ts_tensor *wte, const ts_tensor *h, ts_tensor **out) {
    const int nd = ts_tensor_ndim(h);
    const int64_t C = ts_tensor_dim(h, -1);
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, ts_tensor_shape(h), sizeof(int64_t) * (size_t)nd);
    shape[nd - 1] = ts_tensor_dim(wte, 0);
    if (nd > 1) shape[0] = -1; /* as in conv1d_forward */
    ts_tensor *h2 = NULL, *l = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_reshape(h, 2, (int64_t[]){-1, C}, &h2));
    TS_CHECK_GOTO(ts_linear(h2, wte, NULL, &l));
    st = ts_reshape(l, nd, shape, out);
fail:
    ts_tensor_release(h2);
    ts_tensor_release(l);
    return st;
}

static ts_status lm_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    ts_tensor *h = NULL;
    TS_TRY(ts_module_call(self, "transformer", x, &h));
    ts_status st = ts__gpt_head(self, h, out);
    ts_tensor_release(h);
    return st;
}

/* ---- construction ------------------------------------------------------------------------------------- */
/* A custom module sharing g (not owned). */
static ts_status node(const char *type, ts_module_forward_fn fwd, gpt_ctx *g, ts_module **out) {
    return ts_nn_module_new(type, fwd, g, NULL, out);
}

/* A new (rows, cols) N(0, std) parameter, or zeros when std is 0 (for biases: cols 0 means 1-D rows). */
static ts_status param(int64_t rows, int64_t cols, float std, ts_rng *rng, ts_tensor **out) {
    const int64_t shape[2] = {rows, cols};
    TS_TRY(ts_tensor_zeros(NULL, TS_F32, cols ? 2 : 1, shape, out));
    return std > 0 ? ts_tensor_normal_(*out, 0.0f, std, rng) : TS_OK;
}

static ts_status conv1d(int64_t in, int64_t nout, float std, ts_rng *rng, gpt_ctx *g, ts_module **out) {
    ts_tensor *w = NULL, *b = NULL;
    ts_status st;
    *out = NULL;
    TS_CHECK_GOTO(param(in, nout, std, rng, &w));
    TS_CHECK_GOTO(param(nout, 0, 0.0f, rng, &b));
    TS_CHECK_GOTO(node("Conv1D", conv1d_forward, g, out));
    st = ts_module_add_parameter(*out, "weight", w);
    w = NULL;
    if (st == TS_OK) st = ts_module_add_parameter(*out, "bias", b);
    b = NULL;
fail:
    ts_tensor_release(w);
    ts_tensor_release(b);
    return st;
}

/* Adds the child made by a constructor whose status is st (as models.c's add). */
static ts_status add(ts_module *m, const char *name, ts_status st, ts_module **child) {
    if (st != TS_OK) return st;
    ts_module *c = *child;
    *child = NULL;
    return ts_module_add_child(m, name, c);
}

static ts_status layernorm(const gpt_ctx *g, ts_module **out) {
    return ts_nn_layernorm_new(1, &g->c.n_embd, g->c.layer_norm_eps, true, out);
}

static ts_status block(gpt_ctx *g, ts_rng *rng, ts_module **out) {
    const int64_t C = g->c.n_embd;
    const float std = g->c.init_std, proj_std = (float)(g->c.init_std / sqrt(2.0 * (double)g->c.n_layer));
    ts_module *b = NULL, *attn = NULL, *mlp = NULL, *c = NULL;
    ts_status st;
    TS_CHECK_GOTO(node("GPT2Block", block_forward, g, &b));
    TS_CHECK_GOTO(add(b, "ln_1", layernorm(g, &c), &c));
    TS_CHECK_GOTO(node("GPT2Attention", attn_forward, g, &attn));
    TS_CHECK_GOTO(add(attn, "c_attn", conv1d(C, 3 * C, std, rng, g, &c), &c));
    TS_CHECK_GOTO(add(attn, "c_proj", conv1d(C, C, proj_std, rng, g, &c), &c));
    TS_CHECK_GOTO(add(b, "attn", TS_OK, &attn));
    TS_CHECK_GOTO(add(b, "ln_2", layernorm(g, &c), &c));
    TS_CHECK_GOTO(node("GPT2MLP", mlp_forward, g, &mlp));
    TS_CHECK_GOTO(add(mlp, "c_fc", conv1d(C, 4 * C, std, rng, g, &c), &c));
    TS_CHECK_GOTO(add(mlp, "c_proj", conv1d(4 * C, C, proj_std, rng, g, &c), &c));
    TS_CHECK_GOTO(add(b, "mlp", TS_OK, &mlp));
    *out = b;
    return TS_OK;
fail:
    ts_module_free(b);
    ts_module_free(attn);
    ts_module_free(mlp);
    return st;
}

static ts_status embedding(int64_t n, int64_t dim, float std, ts_rng *rng, ts_module **out) {
    TS_TRY(ts_nn_embedding_new(n, dim, rng, out));
    return ts_tensor_normal_(ts_module_param(*out, "weight"), 0.0f, std, rng);
}

static ts_status transformer(gpt_ctx *g, ts_rng *rng, ts_module **out) {
    const ts_gpt_config *c = &g->c;
    ts_module *t = NULL, *h = NULL, *x = NULL;
    ts_status st;
    TS_CHECK_GOTO(node("GPT2Model", transformer_forward, g, &t));
    TS_CHECK_GOTO(add(t, "wte", embedding(c->vocab_size, c->n_embd, c->init_std, rng, &x), &x));
    TS_CHECK_GOTO(add(t, "wpe", embedding(c->seq_len, c->n_embd, c->init_std, rng, &x), &x));
    TS_CHECK_GOTO(ts_nn_sequential_new(&h));
    for (int64_t i = 0; i < c->n_layer; i++) {
        TS_CHECK_GOTO(block(g, rng, &x));
        st = ts_nn_sequential_add(h, NULL, x); /* takes x, also on failure */
        x = NULL;
        TS_CHECK_GOTO(st);
    }
    TS_CHECK_GOTO(add(t, "h", TS_OK, &h));
    TS_CHECK_GOTO(add(t, "ln_f", layernorm(g, &x), &x));
    *out = t;
    return TS_OK;
fail:
    ts_module_free(t);
    ts_module_free(h);
    return st;
}

ts_status ts_model_gpt(const ts_gpt_config *c, ts_rng *rng, ts_module **out) {
    TS_ARG(c && out, "ts_model_gpt: NULL argument");
    *out = NULL;
    TS_TRY(ts_gpt_config_check(c));
    gpt_ctx *g = ts__calloc(1, sizeof *g);
    if (!g) return ts_error(TS_ERR_NOMEM, "ts_model_gpt: out of memory");
    g->c = *c;
    ts_module *root = NULL, *t = NULL;
    ts_status st = ts_nn_module_new("GPT2LMHeadModel", lm_forward, g, free, &root); /* root owns g */
    if (st != TS_OK) return st;
    TS_CHECK_GOTO(add(root, "transformer", transformer(g, rng, &t), &t));
    root->model_name = ts__gpt_model_name;
    *out = root;
    return TS_OK;
fail:
    ts_module_free(root);
    return st;
}

ts_status ts_gpt_get_config(const ts_module *m, ts_gpt_config *out) {
    TS_ARG(out, "ts_gpt_get_config: NULL out");
    if (!m || m->model_name != ts__gpt_model_name)
        return ts_error(TS_ERR_INVALID_ARG, "ts_gpt_get_config: the module (%s) is not a GPT from ts_model_gpt",
                        ts_module_type_name(m));
    *out = ctx_of(m)->c;
    return TS_OK;
}

/* ---- state dicts in Hugging Face's names ------------------------------------------------------------------ */
static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* lm_head.weight must be wte (the tied head) */
static ts_status check_tied(const ts_tensor *head, const ts_tensor *wte) {
    if (!wte) return TS_OK; /* the strict load names the missing wte */
    if (!ts__same_shape(head, wte) || ts_tensor_dtype(head) != TS_F32 || ts_tensor_dtype(wte) != TS_F32)
        return ts_error(TS_ERR_UNSUPPORTED, "GPT2: lm_head.weight differs in shape or dtype from transformer.wte.weight: "
                                            "an untied output layer is not supported");
    ts_tensor *a = NULL, *b = NULL;
    ts_status st = ts__contiguous(head, &a);
    if (st == TS_OK) st = ts__contiguous(wte, &b);
    if (st == TS_OK && (a->storage->device->host_accessible && b->storage->device->host_accessible) &&
        memcmp(ts__ptr(a), ts__ptr(b), ts_tensor_nbytes(a)) != 0)
        st = ts_error(TS_ERR_UNSUPPORTED, "GPT2: lm_head.weight is not transformer.wte.weight: an untied output layer "
                                          "is not supported");
    ts_tensor_release(a);
    ts_tensor_release(b);
    return st;
}

ts_status ts_gpt_load_state_dict(ts_module *m, const ts_tensor_list *sd) {
    TS_ARG(m && sd, "ts_gpt_load_state_dict: NULL argument");
    ts_gpt_config c;
    TS_TRY(ts_gpt_get_config(m, &c));
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    const ts_tensor *head = NULL;
    char name[512];
    ts_status st = TS_OK;
    for (int i = 0; i < sd->n && st == TS_OK; i++) {
        const char *k = sd->names[i];
        if (ends_with(k, ".attn.bias") || ends_with(k, ".attn.masked_bias")) continue; /* old mask buffers */
        if (!strcmp(k, "lm_head.weight")) {
            head = sd->tensors[i];
            continue;
        }
        snprintf(name, sizeof name, "%s%s", strncmp(k, "transformer.", 12) ? "transformer." : "", k);
        st = ts_tensor_list_append(&l, name, sd->tensors[i]);
    }
    if (st == TS_OK && head) st = check_tied(head, ts_tensor_list_find(&l, "transformer.wte.weight"));
    if (st == TS_OK) st = ts_module_load_state_dict_from(m, &l, true, NULL);
    ts_tensor_list_clear(&l);
    return st;
}

ts_status ts_gpt_load_safetensors(ts_module *m, const char *path) {
    TS_ARG(m && path, "ts_gpt_load_safetensors: NULL argument");
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    TS_TRY(ts_safetensors_load(path, TS_SAFETENSORS_F32, &l, NULL));
    ts_status st = ts_gpt_load_state_dict(m, &l);
    if (st != TS_OK) st = ts__error_prefix(st, "%s", path);
    ts_tensor_list_clear(&l);
    return st;
}

ts_status ts_gpt_save_safetensors(ts_module *m, const char *path) {
    TS_ARG(m && path, "ts_gpt_save_safetensors: NULL argument");
    ts_gpt_config c;
    TS_TRY(ts_gpt_get_config(m, &c));
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_safetensors_meta meta = TS_SAFETENSORS_META_INIT;
    ts_status st = ts_module_state_dict(m, &l);
    if (st == TS_OK) st = ts_safetensors_meta_set(&meta, "format", "pt");
    if (st == TS_OK) st = ts_safetensors_save(path, &l, &meta);
    ts_safetensors_meta_clear(&meta);
    ts_tensor_list_clear(&l);
    return st;
}
