/*
 * nn/gpt_stages.c — a GPT (nn/gpt.c) as consecutive pieces for pipeline parallelism
 * (src/parallel/pipeline_parallel.c; the hooks are declared in nn/module.h):
 *
 *   embed piece    token ids (B, T) -> wte + wpe, dropout        reads transformer.wte, transformer.wpe
 *   the blocks     transformer.h.<i> themselves
 *   head piece     ln_f, then logits h W^T (W: the tied weight)  reads transformer.ln_f
 *
 * The pieces are custom modules that borrow the GPT's modules and hold no parameter: the GPT's state dict,
 * parameter names and checkpoints stay the one-device model's, and the optimizer sees only its tensors.
 *
 * The tied weight. transformer.wte.weight is read by the embedding (the first stage) and by the head (the
 * last). The stages of a pipeline backpropagate at the same time on their own device workers, and two
 * concurrent backward passes must never accumulate into one leaf (its accumulate node keeps the engine's
 * scratch and its .grad would be summed by two threads at once). So, as Megatron-LM does with its word
 * embeddings, the head multiplies by its own copy during a training step: ts__gpt_head_untie makes it — a
 * fresh leaf on the last stage's device holding wte's current values, i.e. after the previous optimizer
 * step, so the copy can never be stale — and ts__gpt_head_retie, once every stage's backward of the whole
 * batch has finished, adds the copy's gradient into wte's and drops the copy. wte's gradient is then the
 * embedding's plus the head's, as on one device, summed in another order (a rounding difference). A lock
 * around the two accumulations would not do: the engine's per-node scratch of the shared accumulate node
 * would still be used by two backward passes at once. Forward-only runs (evaluation, or the pipeline's
 * forward + one ts_backward on the caller's thread) use a copy recorded by autograd instead, made on the
 * calling thread, so that one backward adds into wte directly.
 */
#include "nn/gpt_internal.h"

#include <stdio.h>

static const char piece_magic[] = "GPT pipeline piece";

typedef struct gpt_piece {
    const char *magic; /* piece_magic */
    ts_module *gpt;    /* borrowed: the model the piece belongs to */
    bool head;
    ts_tensor *w;   /* head: the tied weight's copy between untie and retie (owned), or NULL */
} gpt_piece;

static void piece_free(void *ctx) {
    gpt_piece *p = ctx;
    if (p) ts_tensor_release(p->w);
    free(p);
}

static ts_module *transformer_of(const gpt_piece *p) { return ts_module_child(p->gpt, "transformer"); }

static ts_tensor *wte_of(const gpt_piece *p) {
    return ts_module_param(ts_module_child(p->gpt, "transformer.wte"), "weight");
}

static ts_status embed_piece_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    return ts__gpt_embed_input(transformer_of(ts_module_ctx(self)), x, out);
}

static ts_status head_piece_forward(ts_module *self, const ts_tensor *x, ts_tensor **out) {
    gpt_piece *p = ts_module_ctx(self);
    ts_tensor *h = NULL;
    TS_TRY(ts_module_call(transformer_of(p), "ln_f", x, &h));
    ts_status st = ts__gpt_logits(p->w ? p->w : wte_of(p), h, out);
    ts_tensor_release(h);
    return st;
}

bool ts__is_gpt(const ts_module *m) { return m && m->model_name == ts__gpt_model_name; }

static ts_status piece_new(ts_module *gpt, bool head, ts_module **out) {
    gpt_piece *p = ts__calloc(1, sizeof *p);
    if (!p) return ts_error(TS_ERR_NOMEM, "GPT pipeline pieces: out of memory");
    p->magic = piece_magic;
    p->gpt = gpt;
    p->head = head;
    return ts_nn_module_new(head ? "GPT2Head" : "GPT2Embedding", head ? head_piece_forward : embed_piece_forward, p,
                            piece_free, out);
}

ts_status ts__gpt_pieces(ts_module *m, ts_module **embed, ts_module **blocks, ts_module **head) {
    TS_ARG(embed && blocks && head, "ts__gpt_pieces: NULL argument");
    *embed = *blocks = *head = NULL;
    TS_ARG(ts__is_gpt(m), "ts__gpt_pieces: the module (%s) is not a GPT from ts_model_gpt", ts_module_type_name(m));
    TS_TRY(piece_new(m, false, embed));
    ts_status st = piece_new(m, true, head);
    if (st != TS_OK) {
        ts_module_free(*embed);
        *embed = NULL;
        return st;
    }
    *blocks = ts_module_child(m, "transformer.h");
    return TS_OK;
}

/* The piece's context; layer must be NULL or a module, and a custom one only from ts__gpt_pieces (internal hooks). */
static gpt_piece *piece_of(const ts_module *layer) {
    gpt_piece *p = layer && ts_module_kind(layer) == TS_MODULE_CUSTOM ? ts_module_ctx(layer) : NULL;
    return p && p->magic == piece_magic ? p : NULL;
}

ts_status ts__gpt_piece_to(ts_module *piece, ts_device *dev) {
    gpt_piece *p = piece_of(piece);
    TS_ARG(p && dev, "ts__gpt_piece_to: not a GPT piece, or no device");
    static const char *const embed_reads[] = {"transformer.wte", "transformer.wpe", NULL};
    static const char *const head_reads[] = {"transformer.ln_f", NULL};
    for (const char *const *k = p->head ? head_reads : embed_reads; *k; k++) {
        ts_status st = ts_module_to(ts_module_child(p->gpt, *k), dev);
        if (st != TS_OK) return ts__error_prefix(st, "moving %s to %s", *k, ts_device_name(dev));
    }
    return TS_OK;
}

ts_status ts__gpt_head_untie(ts_module *head, ts_device *dev, bool train) {
    gpt_piece *p = piece_of(head);
    TS_ARG(p && p->head && dev, "ts__gpt_head_untie: not a GPT head piece, or no device");
    ts_tensor *wte = wte_of(p), *d = NULL;
    ts_tensor_release(p->w);
    p->w = NULL;
    if (!train) return ts_to_device(wte, dev, &p->w); /* recorded when grad mode is on */
    bool prev = ts_grad_set_enabled(false);
    ts_status st = ts_tensor_detach(wte, &d);
    if (st == TS_OK) st = ts_to_device(d, dev, &p->w);
    ts_grad_set_enabled(prev);
    ts_tensor_release(d);
    if (st != TS_OK)
        return ts__error_prefix(st, "the head's copy of transformer.wte.weight on %s", ts_device_name(dev));
    if (ts_tensor_device(p->w) == ts_tensor_device(wte)) { /* on wte's own device the copy must be a new leaf */
        ts_tensor *c = NULL;
        st = ts_tensor_clone(p->w, &c);
        ts_tensor_release(p->w);
        p->w = c;
        TS_TRY(st);
    }
    ts_tensor_set_requires_grad(p->w, ts_tensor_requires_grad(wte));
    return TS_OK;
}

ts_status ts__gpt_head_retie(ts_module *head, bool add) {
    gpt_piece *p = piece_of(head);
    TS_ARG(p && p->head, "ts__gpt_head_retie: not a GPT head piece");
    ts_tensor *w = p->w, *g = w && add ? ts_tensor_grad(w) : NULL, *wte = wte_of(p), *gd = NULL, *sum = NULL;
    p->w = NULL;
    ts_status st = TS_OK;
    if (g) {
        bool prev = ts_grad_set_enabled(false);
        ts_tensor *old = ts_tensor_grad(wte);
        st = ts_to_device(g, ts_tensor_device(wte), &gd);
        if (st == TS_OK) st = old ? ts_add(old, gd, &sum) : ts_tensor_clone(gd, &sum);
        if (st == TS_OK) ts_tensor_set_grad(wte, sum);
        ts_grad_set_enabled(prev);
        if (st != TS_OK) ts__error_prefix(st, "adding the head's gradient into transformer.wte.weight's");
    }
    ts_tensor_release(sum);
    ts_tensor_release(gd);
    ts_tensor_release(w);
    return st;
}
