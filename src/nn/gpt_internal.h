/*
 * nn/gpt_internal.h — what nn/gpt.c (the model) shares with nn/gpt_generate.c (the cached inference path):
 * the context every module of one GPT shares, and the pieces of the forward both paths run.
 */
#ifndef TS_NN_GPT_INTERNAL_H
#define TS_NN_GPT_INTERNAL_H

#include "nn/module.h"

/* The ctx of every custom module of one GPT (owned by the root). */
typedef struct gpt_ctx {
    ts_gpt_config c;
} gpt_ctx;

/* The root's model_name: a GPT is recognised by this pointer. */
extern const char ts__gpt_model_name[];

/* tokens (B, T) TS_I64 -> wte(tokens) + wpe(pos0 .. pos0 + T - 1): (B, T, C). transformer: the GPT2Model. */
ts_status ts__gpt_embed(ts_module *transformer, const ts_tensor *tokens, int64_t pos0, ts_tensor **out);
/* x (B, T, C) through attn's c_attn -> q, k, v (B, n_head, T, C / n_head) (new references). */
ts_status ts__gpt_qkv(ts_module *attn, const ts_tensor *x, int64_t n_head, ts_tensor *qkv[3]);
/* attention output y (B, H, T, D) -> (B, T, H D) -> attn's c_proj. */
ts_status ts__gpt_merge_heads(ts_module *attn, const ts_tensor *y, ts_tensor **out);
/* x + block's `child`(block's `ln`(x)): one pre-LayerNorm residual branch of a block. */
ts_status ts__gpt_residual(ts_module *block, const char *ln, const char *child, const ts_tensor *x, ts_tensor **out);
/* hidden states h (..., C) -> logits (..., vocab) through the tied head. root: the GPT2LMHeadModel. */
ts_status ts__gpt_head(ts_module *root, const ts_tensor *h, ts_tensor **out);
/* h (..., C) -> logits h wte^T (..., vocab) with wte (vocab, C) given: the head on any copy of the tied weight. */
ts_status ts__gpt_logits(const ts_tensor *wte, const ts_tensor *h, ts_tensor **out);
/* tokens (B, T) checked (int64, 1 <= T <= seq_len) -> wte + wpe and dropout when the GPT2Model trains:
 * the input of the first block. transformer: the GPT2Model. */
ts_status ts__gpt_embed_input(ts_module *transformer, const ts_tensor *tokens, ts_tensor **out);

#endif
