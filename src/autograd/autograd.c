/*
 * autograd/autograd.c — graph recording and the backward engine.
 *
 * Engine, for one ts_backward(root):
 *   1. Walk the graph from root's node, counting for each node how many
 *      edges of the reachable graph point at it (deps).
 *   2. Ready set = nodes whose deps reached 0, starting with root's node
 *      holding the seed gradient. Always run the ready node with the highest
 *      creation sequence number, i.e. reverse order of the forward pass, so
 *      the last layers' gradients are final first (DDP's buckets rely on it).
 *      Accumulate nodes rank above every op node (bit 63 set on their sequence
 *      number; ties go to the later-created leaf), so a leaf's hooks fire as soon
 *      as its gradient is final, in every iteration.
 *   3. A node sums incoming gradients in node->pending; running it calls its
 *      backward and hands each input's gradient to the producer node.
 *   4. An accumulate node (a leaf's) adds its pending gradient to leaf->grad
 *      and fires the leaf's grad-ready hooks: every contribution of this pass
 *      has arrived because its deps count reached 0.
 *   5. Unless retain_graph, saved tensors are freed; a second backward through
 *      the same nodes fails with TS_ERR_STATE.
 *
 * Concurrency: a pass keeps its state in the nodes it reached (deps, pending,
 * state) and in locals; the only globals are the atomic sequence counter and
 * thread-locals (grad mode, the retain flag). So passes over disjoint graphs
 * may run at the same time on different threads, and a node's backward may run
 * a nested pass over a graph disjoint from the outer one (data parallelism's
 * per-replica backward does both). Two passes over one graph at once are not
 * supported (neither are they in PyTorch without reentrant care).
 *
 * Inputs: a node keeps up to TS_NODE_INLINE_INPUTS inputs' edges and shapes in
 * itself and any number beyond that in one heap block (inputs_heap).
 *
 * Failures: out of memory anywhere (recording a node, saving a tensor, the
 * engine's lists, a gradient) is TS_ERR_NOMEM with a message naming what was
 * being allocated; a failed pass leaves no per-pass state behind (every node
 * it marked is unmarked, pending gradients are dropped), so the graph can be
 * released or, with retain_graph, run again.
 *
 * Invariants, asserted in debug builds (TS_ASSERT): an edge exists exactly
 * where an input needs a gradient; an op node's inputs are older than it (so
 * the graph is acyclic); a node runs with no contributions outstanding and a
 * count never goes below zero; a backward's gradient for input i has input i's
 * shape; a pass that succeeds runs every node it reached once and consumes
 * every gradient handed out; reference counts never go below zero.
 */
#include "autograd/autograd.h"
#include "tensor/tensor.h"
#include "device/k_ew.h"

#include <stdio.h>

static _Thread_local int ts_grad_disabled;
static _Thread_local int ts_backward_retain; /* retain_graph of the innermost pass on this thread */
static _Atomic uint64_t ts_node_seq;

bool ts__backward_retain_graph(void) { return ts_backward_retain != 0; }

bool ts_grad_set_enabled(bool on) {
    bool prev = !ts_grad_disabled;
    ts_grad_disabled = !on;
    return prev;
}
bool ts_grad_is_enabled(void) { return !ts_grad_disabled; }

/* ---- nodes ---------------------------------------------------------------------------- */
static void release_leaf(ts_node *acc);
static const ts__autograd_hooks ts_hooks = {ts__node_release, release_leaf};
static _Atomic bool ts_hooks_installed;

static ts_node *node_alloc(const char *name, ts_backward_fn fn) {
    /* before any tensor can hold a node, the tensor layer learns how to let go of one */
    if (!atomic_load_explicit(&ts_hooks_installed, memory_order_relaxed)) {
        ts__tensor_set_autograd_hooks(&ts_hooks);
        atomic_store(&ts_hooks_installed, true);
    }
    ts_node *n = ts__calloc(1, sizeof *n);
    if (!n) return NULL;
    atomic_init(&n->refcount, 1);
    n->name = name;
    n->backward = fn;
    n->seq = atomic_fetch_add(&ts_node_seq, 1);
    n->next = n->next_inline;
    n->needs = n->needs_inline;
    n->in_ndim = n->in_ndim_inline;
    n->in_shape = n->in_shape_inline;
    return n;
}

/* Points the input arrays of n at heap storage for ninputs > TS_NODE_INLINE_INPUTS. */
static bool node_inputs_alloc(ts_node *n, int ninputs) {
    if (ninputs <= TS_NODE_INLINE_INPUTS) return true;
    size_t k = (size_t)ninputs;
    /* one zeroed block: shapes (8-byte aligned) first, then edges, ndims, flags */
    size_t shapes = k * sizeof(int64_t[TS_MAX_DIMS]), edges = k * sizeof(ts_node *), ndims = k * sizeof(int);
    char *b = ts__calloc(1, shapes + edges + ndims + k * sizeof(bool));
    if (!b) return false;
    n->inputs_heap = b;
    n->in_shape = (int64_t(*)[TS_MAX_DIMS])b;
    n->next = (ts_node **)(b + shapes);
    n->in_ndim = (int *)(b + shapes + edges);
    n->needs = (bool *)(b + shapes + edges + ndims);
    return true;
}

static ts_node *retain_node(ts_node *n) {
    if (n) {
        int prev = atomic_fetch_add(&n->refcount, 1);
        TS_ASSERT(prev >= 1, "node %s retained after it was freed (reference count %d)", n->name, prev);
    }
    return n;
}

static void node_free_saved(ts_node *n) {
    for (int i = 0; i < n->nsaved; i++) {
        ts_tensor_release(n->saved[i]);
        n->saved[i] = NULL;
    }
    if (n->ctx && n->free_ctx) n->free_ctx(n->ctx);
    n->ctx = NULL;
}

void ts__node_release(ts_node *n) {
    /* iterative over chains so deep graphs cannot overflow the stack */
    ts_node *stack[64];
    int top = 0;
    if (n) stack[top++] = n;
    while (top > 0) {
        ts_node *x = stack[--top];
        int prev = atomic_fetch_sub(&x->refcount, 1);
        TS_ASSERT(prev >= 1, "node %s released once too often (reference count was %d)", x->name, prev);
        if (prev != 1) continue;
        TS_ASSERT(x->ninputs >= 0, "node %s has %d inputs", x->name, x->ninputs);
        node_free_saved(x);
        ts_tensor_release(x->pending);
        for (int i = 0; i < x->ninputs; i++) {
            if (!x->next[i]) continue;
            if (top < (int)TS_ARRAY_LEN(stack))
                stack[top++] = x->next[i];
            else
                ts__node_release(x->next[i]);
        }
        free(x->inputs_heap);
        free(x);
    }
}

/* The tensor layer's hook: the leaf that owns accumulate node acc dies. */
static void release_leaf(ts_node *acc) {
    TS_ASSERT(acc->backward == NULL, "node %s is a leaf's accumulate node but has a backward", acc->name);
    acc->leaf = NULL;
    ts__node_release(acc);
}

/* The accumulate node of a leaf that requires grad (created on first use). */
static ts_node *leaf_acc_node(ts_tensor *t) {
    if (!t->grad_acc) {
        t->grad_acc = node_alloc("AccumulateGrad", NULL);
        if (!t->grad_acc) return NULL;
        /* above every op node, as PyTorch's AccumulateGrad (sequence_nr UINT64_MAX): a
         * leaf's gradient is accumulated and its hooks fire as soon as it is final,
         * not when the rest of backward is done (DDP overlaps on this) */
        t->grad_acc->seq |= UINT64_C(1) << 63; /* ties: the later-created leaf first */
        t->grad_acc->leaf = t;
    }
    return t->grad_acc;
}

ts_status ts__node_new(const char *name, ts_backward_fn fn, int ninputs, const ts_tensor *const *inputs,
                       ts_node **out) {
    TS_ASSERT(out != NULL && fn != NULL && ninputs >= 0 && (ninputs == 0 || inputs != NULL),
              "ts__node_new(%s): bad arguments (%d inputs)", name, ninputs);
    *out = NULL;
    if (ts_grad_disabled) return TS_OK;
    bool any = false;
    for (int i = 0; i < ninputs; i++)
        if (inputs[i] && inputs[i]->requires_grad) any = true;
    if (!any) return TS_OK;
    ts_node *n = node_alloc(name, fn);
    if (!n || !node_inputs_alloc(n, ninputs)) {
        free(n);
        return ts__error_prefix(TS_ERR_NOMEM, "%s: recording the autograd node (%d inputs)", name, ninputs);
    }
    n->ninputs = ninputs;
    for (int i = 0; i < ninputs; i++) {
        ts_tensor *t = (ts_tensor *)inputs[i];
        if (!t) continue;
        n->in_ndim[i] = t->ndim;
        memcpy(n->in_shape[i], t->shape, sizeof(int64_t) * (size_t)t->ndim);
        if (!t->requires_grad) continue;
        ts_node *next = t->grad_fn ? t->grad_fn : leaf_acc_node(t);
        if (!next) { /* the leaf's accumulate node: the edges taken so far go with n */
            ts__node_release(n);
            return ts__error_prefix(TS_ERR_NOMEM, "%s: recording the autograd node (input %d's accumulate node)",
                                    name, i);
        }
        n->needs[i] = true;
        n->next[i] = retain_node(next);
    }
    *out = n;
    return TS_OK;
}

ts_status ts__node_save(ts_node *n, const ts_tensor *t) {
    ts_status st = TS_OK;
    TS_ASSERT(n->nsaved < TS_NODE_MAX_SAVED, "node %s saves more than %d tensors", n->name, TS_NODE_MAX_SAVED);
    if (n->nsaved >= TS_NODE_MAX_SAVED) {
        st = ts_error(TS_ERR_INTERNAL, "%s: more than %d tensors saved for backward", n->name, TS_NODE_MAX_SAVED);
    } else {
        int slot = n->nsaved++;
        if (t) st = ts_tensor_detach(t, &n->saved[slot]);
        if (st != TS_OK) st = ts__error_prefix(st, "%s: saving tensor %d for backward", n->name, slot);
    }
    if (st != TS_OK && n->save_status == TS_OK) n->save_status = st;
    return st;
}

ts_status ts__node_attach(ts_node *n, ts_tensor *out) {
    if (!n) return TS_OK;
    if (n->save_status != TS_OK) {
        ts_status st = n->save_status;
        ts__node_release(n);
        return st;
    }
    TS_ASSERT(out != NULL && out->grad_acc == NULL, "node %s attached to a leaf that has an accumulate node",
              n->name);
    if (out->grad_fn) ts__node_release(out->grad_fn);
    out->grad_fn = n;
    out->requires_grad = true;
    return TS_OK;
}

/* ---- requires_grad, .grad, hooks ------------------------------------------------------------ */
void ts_tensor_set_requires_grad(ts_tensor *t, bool on) {
    if (t->grad_fn) return; /* non-leaf: requires_grad follows its inputs */
    t->requires_grad = on;
}
bool ts_tensor_requires_grad(const ts_tensor *t) { return t->requires_grad; }
bool ts_tensor_is_leaf(const ts_tensor *t) { return t->grad_fn == NULL; }
ts_tensor *ts_tensor_grad(ts_tensor *t) { return t->grad; }

void ts_tensor_set_grad(ts_tensor *t, ts_tensor *g) {
    ts_tensor_retain(g);
    ts_tensor_release(t->grad);
    t->grad = g;
}

void ts_tensor_zero_grad(ts_tensor *t) {
    ts_tensor_release(t->grad);
    t->grad = NULL;
}

int ts_tensor_add_grad_ready_hook(ts_tensor *t, ts_grad_ready_fn fn, void *user) {
    ts_hook *h = ts__realloc(t->hooks, sizeof *h * (size_t)(t->nhooks + 1));
    if (!h) return -1;
    t->hooks = h;
    int id = ++t->next_hook_id;
    h[t->nhooks++] = (ts_hook){id, fn, user};
    return id;
}

void ts_tensor_remove_grad_ready_hook(ts_tensor *t, int id) {
    for (int i = 0; i < t->nhooks; i++) {
        if (t->hooks[i].id == id) {
            memmove(&t->hooks[i], &t->hooks[i + 1], sizeof *t->hooks * (size_t)(t->nhooks - i - 1));
            t->nhooks--;
            return;
        }
    }
}

/* ---- gradient accumulation ------------------------------------------------------------------------ */
/* acc += g, of one dtype: the device's axpy, or for 16-bit gradients on a device whose kernels take only
 * float32, through float32 copies (one rounding, as the 16-bit kernels) */
static ts_status add_into(ts_tensor *acc, const ts_tensor *g) {
    ts_device *d = acc->storage->device;
    if (acc->dtype != g->dtype)
        return ts_error(TS_ERR_DTYPE, "autograd: a %s gradient added to a %s one", ts_dtype_name(g->dtype),
                        ts_dtype_name(acc->dtype));
    if (acc->dtype == TS_F32 || d->k_ew->bf16) return d->k_ew->axpy(acc, 1.0f, g);
    ts_tensor *fa = NULL, *fg = NULL;
    ts_status st = ts__new(d, TS_F32, acc->ndim, acc->shape, &fa);
    if (st == TS_OK) st = ts__new(d, TS_F32, g->ndim, g->shape, &fg);
    if (st == TS_OK) st = d->k_ew->cast(fa, acc);
    if (st == TS_OK) st = d->k_ew->cast(fg, g);
    if (st == TS_OK) st = d->k_ew->axpy(fa, 1.0f, fg);
    if (st == TS_OK) st = d->k_ew->cast(acc, fa);
    ts_tensor_release(fa);
    ts_tensor_release(fg);
    return st;
}

ts_status ts__grad_accumulate(ts_tensor **acc, ts_tensor *g) {
    if (!*acc) {
        /* the leaf's gradient must be private and contiguous: g itself when the caller's reference is its
         * only one (a parameter's gradient, just computed: no copy of every parameter each step), else a
         * copy (g may be shared with other nodes) */
        if (atomic_load(&g->refcount) == 1 && atomic_load(&g->storage->refcount) == 1 && g->offset == 0 &&
            ts_tensor_is_contiguous(g) && !g->requires_grad && !g->grad_fn && !g->grad_acc && !g->grad &&
            g->nhooks == 0) {
            *acc = ts_tensor_retain(g);
            return TS_OK;
        }
        return ts_tensor_clone(g, acc);
    }
    if (!ts__same_shape(*acc, g)) {
        char a[96], b[96];
        return ts_error(TS_ERR_SHAPE, "autograd: gradient of shape %s added to one of shape %s",
                        ts_shape_str(g->ndim, g->shape, a, sizeof a),
                        ts_shape_str((*acc)->ndim, (*acc)->shape, b, sizeof b));
    }
    return add_into(*acc, g);
}

/* ---- the engine ------------------------------------------------------------------------------------ */
typedef struct node_vec {
    ts_node **v;
    size_t n, cap;
} node_vec;

static ts_status vec_push(node_vec *s, ts_node *x) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        ts_node **v = ts__realloc(s->v, cap * sizeof *v);
        if (!v) return ts__error_prefix(TS_ERR_NOMEM, "ts_backward: node list of %zu", cap);
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return TS_OK;
}

enum { NODE_UNSEEN = 0, NODE_SEEN = 1 };

/* Whether gradient g fits input k of node x (debug checks of a backward's result). */
static bool grad_fits_input(const ts_node *x, int k, const ts_tensor *g) {
    if (g->ndim != x->in_ndim[k]) return false;
    for (int d = 0; d < g->ndim; d++)
        if (g->shape[d] != x->in_shape[k][d]) return false;
    return true;
}

/* Hands gradient *gk for one in-edge to node y (taking the reference). */
static ts_status give_grad(ts_node *y, ts_tensor **gk) {
    if (!y->pending) {
        y->pending = *gk;
        *gk = NULL;
        return TS_OK;
    }
    /* a backward may hand one tensor to several inputs (add passes g
     * through): never sum into memory someone else can see. When the pending
     * sum is shared but the new gradient is ours alone, the sum goes into the
     * new one instead (a + b == b + a exactly): no copy (a residual block's
     * input gets its shortcut's gradient, shared with the add's other input,
     * first) */
    const bool shared = atomic_load(&y->pending->refcount) > 1 || atomic_load(&y->pending->storage->refcount) > 1;
    if (shared && atomic_load(&(*gk)->refcount) == 1 && atomic_load(&(*gk)->storage->refcount) == 1 &&
        ts_tensor_is_contiguous(*gk) && ts_tensor_is_contiguous(y->pending) && ts__same_shape(*gk, y->pending) &&
        (*gk)->dtype == y->pending->dtype) {
        ts_status st = add_into(*gk, y->pending);
        if (st != TS_OK) return st;
        ts_tensor_release(y->pending);
        y->pending = *gk;
        *gk = NULL;
        return TS_OK;
    }
    if (shared) {
        ts_tensor *own = NULL;
        TS_TRY(ts_tensor_clone(y->pending, &own));
        ts_tensor_release(y->pending);
        y->pending = own;
    }
    return add_into(y->pending, *gk);
}

ts_status ts_backward(ts_tensor *root, ts_tensor *grad, bool retain_graph) {
    TS_ARG(root, "ts_backward: NULL root");
    if (!root->requires_grad)
        return ts_error(TS_ERR_STATE, "ts_backward: the tensor does not require grad (no graph was recorded)");
    ts_node *top = root->grad_fn ? root->grad_fn : leaf_acc_node(root);
    if (!top) return ts__error_prefix(TS_ERR_NOMEM, "ts_backward: the root's accumulate node");
    ts_status st = TS_OK;
    node_vec all = {0}, ready = {0};
    ts_tensor *seed = NULL;

    if (grad) {
        if (!ts__same_shape(grad, root)) {
            char a[96], b[96];
            return ts_error(TS_ERR_SHAPE, "ts_backward: gradient shape %s for a tensor of shape %s",
                            ts_shape_str(grad->ndim, grad->shape, a, sizeof a),
                            ts_shape_str(root->ndim, root->shape, b, sizeof b));
        }
        seed = ts_tensor_retain(grad);
    } else {
        if (ts_tensor_numel(root) != 1)
            return ts_error(TS_ERR_SHAPE, "ts_backward: grad can be omitted only for a one-element tensor");
        st = ts_tensor_full(root->storage->device, root->ndim, root->shape, 1.0f, &seed);
        if (st != TS_OK) return ts__error_prefix(st, "ts_backward: the seed gradient");
    }

    /* 1. discover reachable nodes and count in-edges. A node is marked seen
     * only once it is in `all`, so the cleanup below unmarks every marked node
     * even when a push fails. */
    TS_ASSERT(top->state == NODE_UNSEEN && top->pending == NULL,
              "node %s is already in a backward pass (state %d)", top->name, top->state);
    TS_CHECK_GOTO(vec_push(&all, top));
    top->state = NODE_SEEN;
    top->deps = 0;
    for (size_t i = 0; i < all.n; i++) {
        ts_node *x = all.v[i];
        TS_ASSERT(x->ninputs >= 0, "node %s has %d inputs", x->name, x->ninputs);
        if (x->released && x->backward)
            TS_CHECK_GOTO(ts_error(TS_ERR_STATE,
                                   "ts_backward: trying to backward through the graph a second time (node %s); "
                                   "pass retain_graph=true the first time",
                                   x->name));
        for (int k = 0; k < x->ninputs; k++) {
            ts_node *y = x->next[k];
            TS_ASSERT(!y == !x->needs[k], "node %s: input %d has %s edge but needs=%d", x->name, k,
                      y ? "an" : "no", (int)x->needs[k]);
            if (!y) continue;
            /* inputs are older than their consumer (accumulate nodes rank above all) */
            TS_ASSERT(!y->backward || y->seq < x->seq, "node %s (seq %llu) feeds older node %s (seq %llu)", y->name,
                      (unsigned long long)y->seq, x->name, (unsigned long long)x->seq);
            if (y->state != NODE_SEEN) {
                TS_ASSERT(y->pending == NULL, "node %s holds a gradient from another pass", y->name);
                TS_CHECK_GOTO(vec_push(&all, y));
                y->state = NODE_SEEN;
                y->deps = 0;
            }
            y->deps++;
        }
    }
    TS_ASSERT(top->deps == 0, "root node %s is its own input", top->name);

    /* 2-4. run ready nodes, highest sequence number first */
    bool prev_mode = ts_grad_set_enabled(false);
    int prev_retain = ts_backward_retain;
    ts_backward_retain = retain_graph;
    ts_tensor *gin_inline[TS_NODE_INLINE_INPUTS], **gin_heap = NULL;
    size_t gin_cap = 0, ran = 0;
    top->pending = seed;
    seed = NULL;
    st = vec_push(&ready, top);
    while (st == TS_OK && ready.n > 0) {
        size_t best = 0;
        for (size_t i = 1; i < ready.n; i++)
            if (ready.v[i]->seq > ready.v[best]->seq) best = i;
        ts_node *x = ready.v[best];
        ready.v[best] = ready.v[--ready.n];
        TS_ASSERT(x->deps == 0 && x->state == NODE_SEEN, "node %s run with %d contributions outstanding", x->name,
                  x->deps);
        ts_tensor *g = x->pending;
        x->pending = NULL;
        ran++;

        if (!x->backward) { /* accumulate node */
            ts_tensor *leaf = x->leaf;
            TS_ASSERT(x->ninputs == 0, "accumulate node %s has %d inputs", x->name, x->ninputs);
            if (leaf && g) {
                st = ts__grad_accumulate(&leaf->grad, g);
                if (st != TS_OK) ts__error_prefix(st, "ts_backward: accumulating a leaf's gradient");
                for (int h = 0; st == TS_OK && h < leaf->nhooks; h++) leaf->hooks[h].fn(leaf, leaf->hooks[h].user);
            }
            ts_tensor_release(g);
            continue;
        }
        ts_tensor **gin = gin_inline;
        if (x->ninputs > TS_NODE_INLINE_INPUTS) {
            if ((size_t)x->ninputs > gin_cap) {
                ts_tensor **v = ts__realloc(gin_heap, sizeof *v * (size_t)x->ninputs);
                if (!v) {
                    st = ts__error_prefix(TS_ERR_NOMEM, "ts_backward: gradients of node %s (%d inputs)", x->name,
                                          x->ninputs);
                    ts_tensor_release(g);
                    break;
                }
                gin_heap = v;
                gin_cap = (size_t)x->ninputs;
            }
            gin = gin_heap;
        }
        memset(gin, 0, sizeof *gin * (size_t)(x->ninputs > TS_NODE_INLINE_INPUTS ? x->ninputs : TS_NODE_INLINE_INPUTS));
        if (g) {
            st = x->backward(x, g, gin);
            if (st != TS_OK) ts__error_prefix(st, "backward of %s", x->name);
        }
        ts_tensor_release(g);
        for (int k = 0; k < x->ninputs; k++) {
            ts_node *y = x->next[k];
            TS_ASSERT(st != TS_OK || !gin[k] || grad_fits_input(x, k, gin[k]),
                      "backward of %s gave input %d a gradient of another shape", x->name, k);
            if (!y) {
                ts_tensor_release(gin[k]);
                continue;
            }
            if (st == TS_OK && gin[k]) {
                st = give_grad(y, &gin[k]);
                if (st != TS_OK) ts__error_prefix(st, "ts_backward: summing the gradients of %s's input", y->name);
            }
            ts_tensor_release(gin[k]);
            TS_ASSERT(y->deps > 0, "node %s: more gradients arrived than it has consumers", y->name);
            if (--y->deps == 0 && st == TS_OK) st = vec_push(&ready, y);
        }
        if (!retain_graph) {
            node_free_saved(x);
            x->released = true;
        }
    }
    ts_grad_set_enabled(prev_mode);
    ts_backward_retain = prev_retain;
    free(gin_heap);
    /* a pass that succeeded ran every node it reached, each once, and every
     * gradient handed to a node was consumed */
    TS_ASSERT(st != TS_OK || ran == all.n, "ts_backward ran %zu of the %zu nodes it reached", ran, all.n);
#ifndef NDEBUG
    for (size_t i = 0; st == TS_OK && i < all.n; i++)
        TS_ASSERT(all.v[i]->deps == 0 && all.v[i]->pending == NULL,
                  "node %s left with %d outstanding contributions%s", all.v[i]->name, all.v[i]->deps,
                  all.v[i]->pending ? " and an unconsumed gradient" : "");
#endif

fail:
    for (size_t i = 0; i < all.n; i++) {
        all.v[i]->state = NODE_UNSEEN;
        ts_tensor_release(all.v[i]->pending);
        all.v[i]->pending = NULL;
    }
    ts_tensor_release(seed);
    free(all.v);
    free(ready.v);
    return st;
}
