/*
 * tessera/optim.h — optimizers (SGD, AdamW) and learning-rate schedules.
 *
 * An optimizer updates a named list of parameters (usually from
 * ts_module_parameters) exactly as torch.optim does, one fused kernel per
 * tensor on the parameter's device. Parameters whose gradient is NULL are
 * skipped (their state is not created or advanced), as in PyTorch.
 *
 * Config structs are versioned (size, magic, version first) and must be
 * initialised with their macro, then edited:
 *     ts_sgd_config c = TS_SGD_CONFIG_INIT;
 *     c.lr = 0.1f; c.momentum = 0.9f;
 *     ts_optim_sgd_new(&params, &c, &opt);
 *
 * State (for checkpoints) is a named tensor list:
 *     "step"                       TS_I64 [1]  number of ts_optimizer_step calls
 *     "lr"                         TS_F32 [1]  the current learning rate
 *     SGD:   "<param>.momentum_buffer"          (when momentum != 0 and created)
 *     AdamW: "<param>.step" (TS_I64 [1]), "<param>.exp_avg", "<param>.exp_avg_sq",
 *            "<param>.max_exp_avg_sq" (amsgrad)
 * Parameters without state yet (never had a gradient) have no entries.
 */
#ifndef TESSERA_OPTIM_H
#define TESSERA_OPTIM_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_OPTIM_CONFIG_MAGIC 0x4f505431u /* "OPT1" */
#define TS_OPTIM_CONFIG_VERSION 1u

/* torch.optim.SGD. nesterov needs momentum > 0 and dampening == 0. */
typedef struct ts_sgd_config {
    size_t size;           /* sizeof(ts_sgd_config) */
    unsigned int magic;    /* TS_OPTIM_CONFIG_MAGIC */
    unsigned int version;  /* TS_OPTIM_CONFIG_VERSION */
    float lr;              /* default 1e-3 */
    float momentum;        /* default 0 */
    float dampening;       /* default 0 */
    float weight_decay;    /* L2 penalty added to the gradient; default 0 */
    bool nesterov;         /* default false */
    bool maximize;         /* default false */
} ts_sgd_config;
#define TS_SGD_CONFIG_INIT \
    ((ts_sgd_config){sizeof(ts_sgd_config), TS_OPTIM_CONFIG_MAGIC, TS_OPTIM_CONFIG_VERSION, 1e-3f, 0.0f, 0.0f, 0.0f, false, false})

/* torch.optim.AdamW (decoupled weight decay, bias correction). */
typedef struct ts_adamw_config {
    size_t size;           /* sizeof(ts_adamw_config) */
    unsigned int magic;    /* TS_OPTIM_CONFIG_MAGIC */
    unsigned int version;  /* TS_OPTIM_CONFIG_VERSION */
    float lr;              /* default 1e-3 */
    float beta1, beta2;    /* default 0.9, 0.999 */
    float eps;             /* default 1e-8 */
    float weight_decay;    /* default 1e-2 */
    bool amsgrad;          /* default false */
    bool maximize;         /* default false */
} ts_adamw_config;
#define TS_ADAMW_CONFIG_INIT                                                                                   \
    ((ts_adamw_config){sizeof(ts_adamw_config), TS_OPTIM_CONFIG_MAGIC, TS_OPTIM_CONFIG_VERSION, 1e-3f, 0.9f, \
                       0.999f, 1e-8f, 1e-2f, false, false})

typedef struct ts_optimizer ts_optimizer;

/* Creates an optimizer over params (borrowed list; the optimizer copies the
 * names and retains the tensors, which must be F32, contiguous leaves).
 * The config is copied. *out is freed with ts_optimizer_free. */
ts_status ts_optim_sgd_new(const ts_tensor_list *params, const ts_sgd_config *config, ts_optimizer **out);
ts_status ts_optim_adamw_new(const ts_tensor_list *params, const ts_adamw_config *config, ts_optimizer **out);
/* Releases the optimizer's state and its references to the parameters. NULL is fine. */
void ts_optimizer_free(ts_optimizer *opt);

/* One update of every parameter with a gradient. Runs with grad mode off. */
ts_status ts_optimizer_step(ts_optimizer *opt);
/* Sets every parameter's gradient to NULL (set_to_none). */
void ts_optimizer_zero_grad(ts_optimizer *opt);
void ts_optimizer_set_lr(ts_optimizer *opt, float lr);
float ts_optimizer_get_lr(const ts_optimizer *opt);
/* Number of ts_optimizer_step calls so far (restored by ts_optimizer_load_state). */
int64_t ts_optimizer_step_count(const ts_optimizer *opt);
/* "SGD" or "AdamW". Static string. */
const char *ts_optimizer_name(const ts_optimizer *opt);

/* Appends the state (see the top of this file) to *out. Buffers are new
 * references to the optimizer's live state tensors (clone them for a snapshot
 * that must not change with later steps); "step", "lr" and per-parameter
 * steps are fresh CPU tensors. */
ts_status ts_optimizer_state(const ts_optimizer *opt, ts_tensor_list *out);
/* Replaces the state with copies of the entries of st (borrowed; tensors may
 * be on any device; they are copied to each parameter's device). Checks
 * everything first: a key that names no parameter or state of this optimizer,
 * a shape mismatch, or an incomplete AdamW state is an error naming the key,
 * and nothing is changed. Parameters without entries get no state (fresh). */
ts_status ts_optimizer_load_state(ts_optimizer *opt, const ts_tensor_list *st);
/* Checks a saved state (from a checkpoint) for this optimizer without loading
 * it: every key names a state of this optimizer (no repeats), buffers have
 * their parameter's shape, "step" and per-parameter steps are integers in
 * [0, 2^53] (AdamW's in [1, "step"]), "lr" is finite and >= 0, and the state is
 * complete: once "step" > 0, every parameter that requires grad has every
 * state entry of this optimizer (SGD with momentum: momentum_buffer; AdamW:
 * exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad, and its step), and no
 * parameter has only part of them. TS_ERR_FORMAT naming the key otherwise.
 * (Values are not checked for finiteness here; ts_trainer_resume does that.) */
ts_status ts_optimizer_check_state(const ts_optimizer *opt, const ts_tensor_list *st);

/* ---- weight-decay groups ------------------------------------------------------------------------- */
/* Which parameters the configured weight_decay (SGD's L2 term, AdamW's decoupled decay) applies to;
 * the others are updated as with weight_decay 0 — torch.optim's parameter groups with "weight_decay": 0.
 * By default every parameter decays (TS_DECAY_ALL). The rule is configuration, not state: set it again
 * after building the optimizer for a resumed run.
 *   TS_DECAY_MATRICES  nanoGPT's and llm.c's rule: parameters with 2 or more dims decay (linear and
 *                      Conv1D weights, convolution kernels, the token and position embeddings); those
 *                      with fewer (biases, LayerNorm and BatchNorm weights and biases) do not. */
typedef enum ts_decay_rule { TS_DECAY_ALL = 0, TS_DECAY_MATRICES = 1 } ts_decay_rule;
/* Applies rule to every parameter of opt (replacing earlier marks). */
ts_status ts_optimizer_set_decay_rule(ts_optimizer *opt, ts_decay_rule rule);
/* Marks one parameter (by its name in the list opt was built on) as decaying or not; an unknown name is
 * TS_ERR_INVALID_ARG naming it. */
ts_status ts_optimizer_set_decay(ts_optimizer *opt, const char *name, bool decay);
/* Whether the parameter called name decays (false for an unknown name). */
bool ts_optimizer_decays(const ts_optimizer *opt, const char *name);

/* ---- gradients: clipping, scaling, dynamic loss scaling -------------------------------------------- */
/* torch.nn.utils.clip_grad_norm_(params, max_norm) with the L2 norm: total = sqrt(sum of the squares of
 * every element of every gradient) over the entries of params that have one (in double); when
 * max_norm / (total + 1e-6) < 1 every gradient is multiplied by that factor. *total_norm (may be NULL)
 * gets total, inf or NaN when a gradient holds one (the gradients are then left as they are, as
 * torch's error_if_nonfinite=False would poison them with NaN: the caller sees the norm instead).
 * Under DDP the gradients are already averaged and equal on every rank, so the norm is the global
 * one and every rank clips alike. Gradients must be F32 (TS_ERR_DTYPE naming the parameter). */
ts_status ts_clip_grad_norm(const ts_tensor_list *params, double max_norm, double *total_norm);
/* Multiplies every gradient of params by factor (gradient accumulation's 1/K, the loss scaler's
 * 1/scale). *finite (may be NULL) is false when any element was inf or NaN before scaling. */
ts_status ts_scale_grads(const ts_tensor_list *params, float factor, bool *finite);

/* Dynamic loss scaling for f16 training, as torch.amp.GradScaler: multiply the loss by `scale`
 * before backward, then ts_grad_scaler_unscale divides the gradients by it and says whether any
 * was inf or NaN; when one was, skip the optimizer step. ts_grad_scaler_update then backs the
 * scale off (x backoff_factor) after an overflow, or grows it (x growth_factor) after
 * growth_interval overflow-free steps in a row. The scale is float32, as torch keeps it. */
typedef struct ts_grad_scaler {
    float scale;            /* 65536 */
    double growth_factor;   /* 2 (the products are taken in double and rounded to float, as torch does) */
    double backoff_factor;  /* 0.5 */
    int64_t growth_interval; /* 2000 */
    int64_t growth_tracker; /* overflow-free steps since the last change (0) */
} ts_grad_scaler;
#define TS_GRAD_SCALER_INIT ((ts_grad_scaler){65536.0f, 2.0, 0.5, 2000, 0})
/* Checks the fields: scale finite and > 0, growth_factor > 1, backoff_factor in (0, 1), interval >= 1. */
ts_status ts_grad_scaler_check(const ts_grad_scaler *gs);
/* Gradients *= 1 / scale (in one pass that also looks for inf and NaN); *found_inf as described. */
ts_status ts_grad_scaler_unscale(const ts_grad_scaler *gs, const ts_tensor_list *params, bool *found_inf);
/* The new scale after a step whose gradients had (found_inf) or had no overflow (torch's
 * _amp_update_scale_: a grown scale that would be infinite is not taken). */
void ts_grad_scaler_update(ts_grad_scaler *gs, bool found_inf);

/* ---- learning-rate schedules ------------------------------------------------------------------ */
typedef enum ts_lr_kind {
    TS_LR_CONSTANT = 0,
    TS_LR_STEP = 1,   /* StepLR: base * gamma^floor(t / step_size) */
    TS_LR_COSINE = 2, /* CosineAnnealingLR: eta_min + (base - eta_min)(1 + cos(pi t / T_max)) / 2 */
} ts_lr_kind;

/* A closed-form schedule over t = epoch (or step) index, 0-based.
 * Optional linear warmup, as SequentialLR(LinearLR(start_factor, total_iters = warmup), main,
 * milestones = [warmup]): for t < warmup, lr = base (f + (1 - f) t / warmup) with
 * f = warmup_start_factor; from t = warmup on, the main schedule at t - warmup. */
typedef struct ts_lr_schedule {
    ts_lr_kind kind;
    double base_lr;
    int64_t step_size;          /* TS_LR_STEP, >= 1 */
    double gamma;               /* TS_LR_STEP */
    int64_t t_max;              /* TS_LR_COSINE, >= 1 */
    double eta_min;             /* TS_LR_COSINE */
    int64_t warmup;             /* warmup length (0: none) */
    double warmup_start_factor; /* in (0, 1]; PyTorch's LinearLR default 1/3 */
} ts_lr_schedule;

ts_lr_schedule ts_lr_constant(double base_lr);
ts_lr_schedule ts_lr_step(double base_lr, int64_t step_size, double gamma);
ts_lr_schedule ts_lr_cosine(double base_lr, int64_t t_max, double eta_min);
/* Returns s with a linear warmup of `warmup` epochs starting at start_factor * base. */
ts_lr_schedule ts_lr_with_warmup(ts_lr_schedule s, int64_t warmup, double start_factor);
/* Checks the fields (TS_ERR_INVALID_ARG naming the bad one). */
ts_status ts_lr_schedule_check(const ts_lr_schedule *s);
/* The learning rate at index t (t < 0 is treated as 0). Assumes a checked schedule. */
double ts_lr_schedule_at(const ts_lr_schedule *s, int64_t t);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_OPTIM_H */
