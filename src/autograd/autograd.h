/*
 * autograd/autograd.h — graph nodes and the hooks ops use to record them.
 *
 * An op that may need a gradient calls ts__node_new(); it returns NULL when
 * grad mode is off or no input requires grad, and the op then records
 * nothing. The op saves what backward needs with ts__node_save() (a detached
 * alias: the node never holds a tensor that points back at a node, so the
 * graph has no cycles), stores scalars in node->p, and attaches the node to
 * its result with ts__node_attach().
 *
 * backward(node, gout, gin) receives the gradient of the op's output and
 * writes a new reference for input i into gin[i] when node->needs[i] (leave
 * it NULL otherwise). It runs with grad mode off.
 */
#ifndef TS_AUTOGRAD_H
#define TS_AUTOGRAD_H

#include "tensor/tensor.h"

#define TS_NODE_MAX_INPUTS 8
#define TS_NODE_MAX_SAVED 8

typedef struct ts_node ts_node;
typedef ts_status (*ts_backward_fn)(ts_node *n, ts_tensor *gout, ts_tensor **gin);

struct ts_node {
    _Atomic int refcount;
    const char *name; /* static string: the op's name */
    uint64_t seq;     /* creation order; backward runs higher seq first */
    ts_backward_fn backward;

    int ninputs;
    ts_node *next[TS_NODE_MAX_INPUTS]; /* producer of input i (owned ref) or NULL */
    bool needs[TS_NODE_MAX_INPUTS];    /* input i needs a gradient */
    /* shape of input i, for ops that reduce a broadcast gradient */
    int in_ndim[TS_NODE_MAX_INPUTS];
    int64_t in_shape[TS_NODE_MAX_INPUTS][TS_MAX_DIMS];

    ts_tensor *saved[TS_NODE_MAX_SAVED]; /* detached aliases (owned) */
    int nsaved;
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

/* NULL when nothing needs grad. inputs[i] may be NULL (a missing bias). */
ts_node *ts__node_new(const char *name, ts_backward_fn fn, int ninputs, const ts_tensor *const *inputs);
/* Saves a detached alias of t; returns its slot. t may be NULL. */
int ts__node_save(ts_node *n, const ts_tensor *t);
/* out takes ownership of the caller's node reference; sets requires_grad. */
void ts__node_attach(ts_node *n, ts_tensor *out);
void ts__node_release(ts_node *n);

/* Sums g into *acc (allocating on first use). Used by the engine and by ops. */
ts_status ts__grad_accumulate(ts_tensor **acc, ts_tensor *g);

#endif
