/*
 * nn/module.h — the module struct (internal).
 *
 * A module is a small vtable (type name, forward, free of the type's extra
 * state) plus generic storage the core walks for every type: named
 * parameter slots, named buffer slots and named children. A slot may hold
 * NULL (a Linear without bias, a BatchNorm2d without affine): such slots are
 * skipped by every enumeration, as PyTorch skips parameters registered as None.
 * Layers read their tensors through the slots on every forward, so
 * ts_module_to can replace them. What a module is comes from its vtable's kind
 * (ts_module_kind); its configuration from the typed accessors of tessera/nn.h.
 */
#ifndef TS_NN_MODULE_H
#define TS_NN_MODULE_H

#include "tensor/tensor.h"
#include "tessera/nn.h"

#define TS_MODULE_MAX_SLOTS 8

/* A module type. Initialise with designated initialisers; kind left out is
 * TS_MODULE_CUSTOM. Every type Tessera defines has its own kind, and code that
 * treats types differently dispatches on ts_module_kind, never on name. */
typedef struct ts_module_vt {
    const char *name; /* type name, static, for messages */
    ts_module_kind_id kind;
    ts_status (*forward)(ts_module *m, const ts_tensor *x, ts_tensor **out);
    /* frees what the type keeps in m->impl besides the plain allocation (optional) */
    void (*free_impl)(ts_module *m);
} ts_module_vt;

/* impl and vt belong to the file that defines the type: other files use the
 * type's accessors (tessera/nn.h) and the owner hooks below, never a cast of
 * another type's impl. The slots and children are generic (every file may walk
 * them). */
struct ts_module {
    const ts_module_vt *vt;
    bool training;

    int nparams, nbuffers;
    const char *param_names[TS_MODULE_MAX_SLOTS];  /* static strings, or owned by impl (ts_nn_module_new) */
    ts_tensor *params[TS_MODULE_MAX_SLOTS];        /* owned references or NULL */
    const char *buffer_names[TS_MODULE_MAX_SLOTS];
    ts_tensor *buffers[TS_MODULE_MAX_SLOTS];

    int nchildren, cap_children;
    char **child_names;    /* owned copies */
    ts_module **children;  /* owned */

    void *impl; /* type-specific configuration (ts__calloc'd, freed by the core) */
    /* impl is borrowed from the module this one replicates (ts__module_new_replica):
     * read-only configuration shared as PyTorch's replicas share their module's
     * attributes; not freed with this module. */
    bool impl_borrowed;
    /* the zoo model this module was built as (ts_model_new, ts_model_resnet: a static name such as
     * "resnet18"), or NULL; what a state dict's mismatch message calls the model */
    const char *model_name;
    /* activation checkpointing (ts_module_set_checkpointed, nn/checkpoint.c): ts_module_forward with grad
     * mode on keeps only the input and recomputes the forward in backward */
    bool checkpointed;
};

/* A new module of type vt with impl_size zeroed bytes of configuration; training mode. */
ts_status ts__module_new(const ts_module_vt *vt, size_t impl_size, ts_module **out);
/* Registers a parameter slot; takes ownership of the reference t (may be NULL;
 * released on failure) and sets requires_grad. TS_ERR_INVALID_ARG, naming the
 * type and the slot, when m already has TS_MODULE_MAX_SLOTS parameters. */
ts_status ts__module_add_param(ts_module *m, const char *name, ts_tensor *t);
/* Registers a buffer slot; takes ownership of the reference t (may be NULL;
 * released on failure). TS_ERR_INVALID_ARG when m already has
 * TS_MODULE_MAX_SLOTS buffers. */
ts_status ts__module_add_buffer(ts_module *m, const char *name, ts_tensor *t);
/* Appends a named child; takes ownership of child (freed on failure). name NULL: the index. */
ts_status ts__module_add_child(ts_module *m, const char *name, ts_module *child);

/* ---- owner hooks: what src/parallel does to modules of types it does not define ---------- */
/* A replica shell of src (ts_replicate, src/parallel/data_parallel.c): a new
 * module of src's type (same vtable, kind and type name) sharing src's
 * configuration read-only (impl borrowed: src must outlive the replica, which
 * never frees it), with src's training flag and no slots or children yet; the
 * caller fills the slots (src's names, at most src's counts) and children. */
ts_status ts__module_new_replica(const ts_module *src, ts_module **out);

/* BatchNorm2d's configuration. It is a BatchNorm2d's whole impl, and the
 * first member of the impl of every kind TS_MODULE_SYNC_BATCHNORM module
 * (src/parallel/syncbn.c): ts_batchnorm2d_get_config reads it for both. */
typedef struct ts__bn_config {
    int64_t num_features;
    float eps, momentum; /* momentum < 0: cumulative average (PyTorch's momentum=None) */
    bool affine, track;  /* track: track_running_stats */
} ts__bn_config;

/* BatchNorm2d's argument checks, for every constructor of the BatchNorm family
 * (ts_nn_batchnorm2d_new, ts_nn_sync_batchnorm2d_new): TS_ERR_INVALID_ARG
 * naming fn and the bad argument. */
ts_status ts__batchnorm2d_check_args(const char *fn, int64_t num_features, float eps, float momentum);

/* Turns the BatchNorm2d m into a module of type vt (kind TS_MODULE_SYNC_BATCHNORM)
 * in place (ts_nn_convert_sync_batchnorm): m keeps its slots, tensors, children
 * and training flag; impl (ts__calloc'd, starting with a ts__bn_config) gets
 * m's configuration copied into its first member and becomes m's impl (owned
 * by m from then on; m's old configuration is freed unless borrowed).
 * TS_ERR_INVALID_ARG, nothing changed and impl still the caller's, when m is
 * not a BatchNorm2d (naming its type) or vt is not of kind SYNC_BATCHNORM. */
ts_status ts__batchnorm2d_convert(ts_module *m, const ts_module_vt *vt, void *impl);

/* A GPT (ts_model_gpt, nn/gpt.c) as consecutive pieces for pipeline parallelism
 * (src/parallel/pipeline_parallel.c; nn/gpt_stages.c says how the tied weight is shared):
 * *embed (token ids -> wte + wpe, dropout), the blocks — the children of *blocks,
 * transformer.h (borrowed) — and *head (ln_f, then the logits through the tied weight).
 * *embed and *head are new modules (the caller's to free) that borrow m's modules and
 * hold no parameter, so m's state dict stays the one-device model's. TS_ERR_INVALID_ARG
 * when m is not a GPT. The calls below take only these pieces. */
bool ts__is_gpt(const ts_module *m);
ts_status ts__gpt_pieces(ts_module *m, ts_module **embed, ts_module **blocks, ts_module **head);
/* Moves the GPT modules a piece reads (embed: transformer.wte, .wpe; head: transformer.ln_f) to dev. */
ts_status ts__gpt_piece_to(ts_module *piece, ts_device *dev);
/* The head piece's own copy of the tied weight transformer.wte.weight on dev, used by its
 * forwards until ts__gpt_head_retie. train: a detached leaf with wte's current values
 * (requiring grad when wte does), whose gradient ts__gpt_head_retie adds into wte's;
 * otherwise a copy recorded by autograd (with grad mode on, a backward through it adds
 * to wte itself: only for one backward on one thread). */
ts_status ts__gpt_head_untie(ts_module *head, ts_device *dev, bool train);
/* Drops the head's copy; with add, first adds the copy's gradient (if any) into wte's
 * .grad on wte's device (call it after every backward through the copy has finished). */
ts_status ts__gpt_head_retie(ts_module *head, bool add);

/* The generator a Dropout module draws from (NULL: the default), for activation checkpointing's
 * replay (nn/checkpoint.c); NULL for other kinds. */
ts_rng *ts__dropout_module_rng(const ts_module *m);
/* ts_module_forward of a checkpointed module with grad mode on (nn/checkpoint.c). */
ts_status ts__checkpoint_forward(ts_module *m, const ts_tensor *x, ts_tensor **out);

/* A new CPU F32 tensor filled with U(-bound, bound). */
ts_status ts__param_uniform(int ndim, const int64_t *shape, double bound, ts_rng *rng, ts_tensor **out);

#endif
