/*
 * train/strategy.h — the strategy table (internal). A strategy is one file,
 * src/train/strategy_<name>.c, defining one `const ts__strategy_impl`; the
 * table in strategy.c lists them by ts_strategy_kind. Adding a strategy: a
 * kind in tessera/train.h, its file, one line in the table.
 */
#ifndef TS_TRAIN_STRATEGY_H
#define TS_TRAIN_STRATEGY_H

#include "core/internal.h"
#include "ops/loss.h" /* ts__cross_entropy_seq, ts__class_last: the losses the strategies score */
#include "tessera/train.h"

#define TS_STRATEGY_MAX_DEVICES 64

typedef struct ts__strategy_impl {
    ts_strategy_kind kind;
    const char *name; /* "none", "ddp", ... */
    const char *help; /* one line */
    bool needs_devices; /* takes opts->devices (NULL: every virtual CPU device) */
    /* Takes ownership of model (freed on failure too) and sets s->runner (which
     * owns the model: the model itself, or a wrapper holding it as child
     * "module") and s->model. s->devs / s->ndev are already filled in. */
    ts_status (*wrap)(ts_strategy *s, ts_module *model, const ts_strategy_opts *o);
    /* Optional: forward + mean cross-entropy + backward of the batch. NULL:
     * ts_module_forward(s->runner) + ts_cross_entropy + ts_backward. */
    ts_status (*forward_backward)(ts_strategy *s, const ts_tensor *x, const ts_tensor *y, float label_smoothing,
                                  float *loss);
    /* Optional: frees what wrap added besides s->runner. */
    void (*destroy)(ts_strategy *s);
} ts__strategy_impl;

struct ts_strategy {
    const ts__strategy_impl *impl;
    ts_module *runner; /* owned: what runs; owns the model */
    ts_module *model;  /* the plain model (borrowed from runner, or runner itself) */
    ts_device *devs[TS_STRATEGY_MAX_DEVICES];
    int ndev;
    ts_process_group *pg; /* DDP: borrowed */
    ts_ddp *ddp;          /* DDP: owned */
    char desc[512];       /* what ts_strategy_describe prints, set by wrap */
    float loss_scale;     /* the seed of every backward (loss scaling; 1: none) — ts__strategy_backward */
};

/* Appends ", cpu:0, cpu:1" style device names to s->desc. */
void ts__strategy_describe_devices(ts_strategy *s);

/* One process, one device (strategies none and ddp): the device opts->devices[0] names (one entry;
 * NULL list: the CPU) into s->devs[0] / s->ndev. */
ts_status ts__strategy_one_device(ts_strategy *s, const ts_strategy_opts *o, ts_device **dev);
/* Moves model (owned by s->runner) to dev, not the CPU, and makes s->runner Sequential(ToDevice(dev), model),
 * so forward takes batches on any device; s->model stays the model. On failure s->runner still owns
 * everything there is to free. */
ts_status ts__strategy_place(ts_strategy *s, ts_module *model, ts_device *dev);
/* ts_backward(loss) seeded with s->loss_scale (a scalar on the loss's device) instead of 1: the gradients
 * of scale * loss, the loss itself unchanged. Every strategy's backward goes through here. */
/* The loss's value on the host, read after backward has been queued: on a GPU the host then queues the
 * whole step before it waits, and a device error found on the way (an out-of-range target, reported at
 * this synchronisation) comes back as the step's status instead of a NaN loss. */
ts_status ts__strategy_read_loss(const ts_tensor *lt, float *loss);
ts_status ts__strategy_backward(ts_strategy *s, ts_tensor *loss);
/* Whether the strategy's backward seed can be scaled: TS_ERR_UNSUPPORTED naming pipeline, else TS_OK. */
ts_status ts__strategy_can_scale_loss(const ts_strategy *s);
/* Sets the seed (> 0) of the strategy's backward passes; a scale other than 1 needs can_scale_loss. */
ts_status ts__strategy_set_loss_scale(ts_strategy *s, float scale);


/* x and y on dev (new references; the same tensors when they are there). */
ts_status ts__strategy_batch_to(ts_device *dev, const ts_tensor *x, const ts_tensor *y, ts_tensor **xd,
                                ts_tensor **yd);

/* The model.* tensors of a loaded training checkpoint (the prefix stripped) appended to *out;
 * TS_ERR_INVALID_ARG naming path when there are none (train/checkpoint.c). */
ts_status ts__checkpoint_model_weights(const ts_ckpt *ck, const char *path, ts_tensor_list *out);
/* m's configuration beyond its zoo name and classes (a GPT's sizes: the gpt.* keys) into ck; nothing for
 * other models (train/checkpoint.c). */
ts_status ts__checkpoint_save_model_config(ts_ckpt *ck, const ts_module *m);

extern const ts__strategy_impl ts__strategy_none, ts__strategy_ddp, ts__strategy_data, ts__strategy_model,
    ts__strategy_pipeline, ts__strategy_tile;

#endif
