/*
 * autograd/autograd.h — graph nodes and the hooks ops use to record them.
 *
 * Recording, in an op (after its result `o` is computed):
 *
 *     ts_node *n = NULL;
 *     TS_CHECK_GOTO(ts__node_new("conv2d", conv2d_backward, 3, in, &n));
 *     if (n) {                        // NULL, TS_OK: no graph needed
 *         ts__node_save(n, x);        // detached aliases backward needs
 *         ts__node_save(n, w);
 *         n->p.i[0] = ...;            // scalars
 *         TS_CHECK_GOTO(ts__node_attach(n, o));
 *     }
 *
 * ts__node_new gives NULL with TS_OK when grad mode is off on this thread or
 * no input requires grad, and TS_ERR_NOMEM (with a message naming the op) when
 * the node or an input's accumulate node cannot be allocated; the op then fails
 * and releases its result, so an op never returns TS_OK without the graph it
 * owes. ts__node_save may fail too (allocating the alias); the node remembers
 * the first failure and ts__node_attach reports it (releasing the node, leaving
 * the result alone), so an op may check every save or only the attach. Saved
 * tensors are detached: the node never holds a tensor that points back at a
 * node, so the graph has no cycles. Backward reads them with ts__node_saved(n,
 * i), which checks i against the slots saved.
 *
 * backward(node, gout, gin) receives the gradient of the op's output and
 * writes a new reference for input i into gin[i] when node->needs[i] (leave
 * it NULL otherwise); gin[i] must be on input i's device. It runs with grad
 * mode off, on the thread that called ts_backward.
 *
 * A backward may itself call ts_backward on a graph that is disjoint from the
 * one being run (src/parallel/data_parallel.c runs each replica's graph that
 * way, on the replica's device worker): the engine keeps its per-pass state in
 * the nodes it reached and in locals, so passes over disjoint graphs may run
 * at the same time on different threads, or nested on one thread.
 * ts__backward_retain_graph() tells such a backward whether the pass that runs
 * it keeps its graph (so the inner pass can do the same).
 *
 * The tensor layer sits below this one: it releases a dying tensor's grad_fn
 * and grad_acc through the hooks this file installs with
 * ts__tensor_set_autograd_hooks (tensor/tensor.h) when the first node is made.
 */
#ifndef TS_AUTOGRAD_H
#define TS_AUTOGRAD_H

#include "tensor/tensor.h"

/* A node takes any number of inputs. The first TS_NODE_INLINE_INPUTS are
 * stored in the node itself; a node with more gets heap arrays (one block,
 * freed with the node). Either way n->next[i], n->needs[i], n->in_ndim[i]
 * and n->in_shape[i][d] index the same way. (TS_NODE_MAX_INPUTS is the old
 * name of the inline count; ops may still use it to group work.) */
#define TS_NODE_INLINE_INPUTS 8
#define TS_NODE_MAX_INPUTS TS_NODE_INLINE_INPUTS
#define TS_NODE_MAX_SAVED 8

typedef struct ts_node ts_node;
typedef ts_status (*ts_backward_fn)(ts_node *n, ts_tensor *gout, ts_tensor **gin);

struct ts_node {
    _Atomic int refcount;
    const char *name; /* static string: the op's name */
    uint64_t seq;     /* creation order; backward runs higher seq first */
    ts_backward_fn backward;

    int ninputs;
    ts_node **next; /* [ninputs] producer of input i (owned ref) or NULL */
    bool *needs;    /* [ninputs] input i needs a gradient */
    /* shape of input i, for ops that reduce a broadcast gradient */
    int *in_ndim;                    /* [ninputs] */
    int64_t (*in_shape)[TS_MAX_DIMS]; /* [ninputs][TS_MAX_DIMS] */
    /* storage of the four arrays above for up to TS_NODE_INLINE_INPUTS inputs */
    ts_node *next_inline[TS_NODE_INLINE_INPUTS];
    bool needs_inline[TS_NODE_INLINE_INPUTS];
    int in_ndim_inline[TS_NODE_INLINE_INPUTS];
    int64_t in_shape_inline[TS_NODE_INLINE_INPUTS][TS_MAX_DIMS];
    void *inputs_heap; /* the arrays of a node with more inputs (one allocation), or NULL */

    ts_tensor *saved[TS_NODE_MAX_SAVED]; /* detached aliases (owned); read with ts__node_saved */
    int nsaved;
    ts_status save_status; /* first failing ts__node_save, reported by ts__node_attach */
    bool released; /* saved tensors freed after backward */

    /* op parameters for backward */
    union {
        int64_t i[16];
        double d[8];
        float f[16];
    } p;
    void *ctx;                        /* optional heap context */
    void (*free_ctx)(void *ctx);

    ts_tensor *leaf; /* accumulate node: the leaf (weak); NULL otherwise */

    /* engine scratch for one backward pass */
    ts_tensor *pending; /* summed incoming gradient */
    int deps;
    int state;
};

/* Records a node over inputs[0..ninputs) (inputs[i] may be NULL: a missing
 * bias). *out: the node (one reference, for ts__node_attach), or NULL with
 * TS_OK when no graph is needed (grad mode off, or no input requires grad).
 * TS_ERR_NOMEM when allocation fails (*out NULL). */
ts_status ts__node_new(const char *name, ts_backward_fn fn, int ninputs, const ts_tensor *const *inputs,
                       ts_node **out) __attribute__((warn_unused_result));
/* Saves a detached alias of t (t may be NULL) in the next slot. TS_ERR_NOMEM
 * when the alias cannot be allocated, TS_ERR_INTERNAL past TS_NODE_MAX_SAVED;
 * the first failure is kept for ts__node_attach. */
ts_status ts__node_save(ts_node *n, const ts_tensor *t);
/* out takes ownership of the caller's node reference and requires grad. If a
 * save failed, releases n, leaves out unchanged and returns that status. A
 * NULL n is TS_OK. */
ts_status ts__node_attach(ts_node *n, ts_tensor *out);
void ts__node_release(ts_node *n);

/* Saved slot i (NULL if a NULL tensor was saved there). i must be below the
 * number of slots saved: debug builds assert it, release builds give NULL
 * rather than read past them. Saved tensors are gone after a backward pass
 * without retain_graph (the engine refuses to run such a node again). */
static inline ts_tensor *ts__node_saved(const ts_node *n, int i) {
    TS_ASSERT(i >= 0 && i < n->nsaved, "node %s: saved slot %d read, %d saved", n->name, i, n->nsaved);
    return (i >= 0 && i < n->nsaved) ? n->saved[i] : NULL;
}

/* The retain_graph flag of the innermost ts_backward running on this thread
 * (false outside backward). */
bool ts__backward_retain_graph(void);

/* Sums g into *acc (allocating on first use). Used by the engine and by ops. */
ts_status ts__grad_accumulate(ts_tensor **acc, ts_tensor *g);

#endif
