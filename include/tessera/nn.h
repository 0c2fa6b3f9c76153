/*
 * tessera/nn.h — modules: layers with parameters and buffers, containers,
 * state dicts, and the model builders.
 *
 * A module is an opaque tree, PyTorch style: each module owns its own
 * parameters (leaf tensors with requires_grad), its buffers (running
 * statistics; no grad) and its named children. Names are PyTorch's dotted
 * paths ("0.weight", "features.1.running_mean"), and parameters, buffers and
 * state dicts come in PyTorch's order (a module's own parameters, then its own
 * buffers, then each child's in the order the children were added), so a
 * Tessera model and the equivalent torch.nn model have the same state-dict keys.
 *
 * Ownership: a module owns its tensors and its children; ts_module_free
 * releases the whole tree. Tensors handed out through ts_tensor_list are new
 * references (released by ts_tensor_list_clear). Input tensors are borrowed.
 *
 * Initialisation follows PyTorch's defaults, drawn from a ts_rng* (NULL: the
 * process-wide default generator; a non-NULL rng is only used during the
 * constructor call):
 *   Linear, Conv2d: weight U(-b, b), b = 1/sqrt(fan_in) (kaiming_uniform_ with
 *                   a = sqrt(5)); bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
 *   BatchNorm1d/2d: weight 1, bias 0, running_mean 0, running_var 1,
 *                   num_batches_tracked 0 (TS_I64, shape []).
 *   LayerNorm, GroupNorm: weight 1, bias 0.
 *   Embedding:      weight N(0, 1).
 * Modules are created on the CPU; move them with ts_module_to.
 */
#ifndef TESSERA_NN_H
#define TESSERA_NN_H

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_module ts_module;

/* ---- every module ------------------------------------------------------------------------ */
/* Runs the module on x (borrowed); *out is a new reference. Records autograd
 * when grad mode is on. Training-mode modules (BatchNorm2d) update their
 * running statistics in place. */
ts_status ts_module_forward(ts_module *m, const ts_tensor *x, ts_tensor **out);
/* Sets training mode (true) or eval mode (false) on m and all its descendants. */
void ts_module_train(ts_module *m, bool training);
bool ts_module_is_training(const ts_module *m);
/* Activation checkpointing (torch.utils.checkpoint's reentrant form). When on, ts_module_forward(m)
 * with grad mode on runs m's forward with autograd off — the unit's intermediate activations are freed
 * as it goes — and records one node over (input, m's parameters) that keeps only the input. Its backward
 * runs m's forward again from that input with autograd on (the default generator's state and the
 * generators of m's Dropout modules as they were at the first forward, so dropout draws the same masks;
 * BatchNorm running statistics updated once, not twice) and backward through it: the same gradients, for
 * one more forward of m. m must outlive the graph, keep its parameters until backward, and not run on another
 * thread during a backward through it (the recomputation swaps stand-ins into its slots). Works under DDP,
 * pipeline parallelism and DataParallel (replicas inherit the mark). NULL m: TS_ERR_INVALID_ARG. */
ts_status ts_module_set_checkpointed(ts_module *m, bool on);
bool ts_module_is_checkpointed(const ts_module *m);
/* Marks (on) or unmarks the units of a model: a GPT's blocks (transformer.h.N), a ResNet's residual
 * blocks (BasicBlock, Bottleneck, wherever they sit in the tree). *units (optional): how many.
 * TS_ERR_INVALID_ARG naming the model when it has no such unit (the cnn, the mlp, most custom
 * modules: mark their modules with ts_module_set_checkpointed). */
ts_status ts_model_set_activation_checkpointing(ts_module *model, bool on, int *units);
/* Frees m, its children and its tensors (the tensors live on while other
 * references to them exist, e.g. in an optimizer). NULL is fine. */
void ts_module_free(ts_module *m);
/* The type name ("Linear", "Sequential", ...), for printing. Static string;
 * "" for NULL. Ask what a module is with ts_module_kind, not by its name. */
const char *ts_module_type_name(const ts_module *m);

/* What a module is: one value per module type Tessera defines (the wrappers of
 * tessera/parallel.h and SyncBatchNorm of tessera/ddp.h included). Code that
 * treats types differently switches on this value; the typed accessors below
 * give each type's configuration. */
typedef enum ts_module_kind_id {
    TS_MODULE_CUSTOM = 0,           /* a type defined outside Tessera's list (tests, extensions) */
    TS_MODULE_SEQUENTIAL,           /* ts_nn_sequential_new */
    TS_MODULE_LINEAR,               /* ts_nn_linear_new */
    TS_MODULE_CONV2D,               /* ts_nn_conv2d_new */
    TS_MODULE_BATCHNORM2D,          /* ts_nn_batchnorm2d_new */
    TS_MODULE_SYNC_BATCHNORM,       /* ts_nn_sync_batchnorm2d_new, ts_nn_convert_sync_batchnorm */
    TS_MODULE_RELU,                 /* ts_nn_relu_new */
    TS_MODULE_MAXPOOL2D,            /* ts_nn_maxpool2d_new */
    TS_MODULE_AVGPOOL2D,            /* ts_nn_avgpool2d_new */
    TS_MODULE_ADAPTIVE_AVGPOOL2D,   /* ts_nn_global_avgpool2d_new */
    TS_MODULE_FLATTEN,              /* ts_nn_flatten_new */
    TS_MODULE_DROPOUT,              /* ts_nn_dropout_new */
    TS_MODULE_EMBEDDING,            /* ts_nn_embedding_new */
    TS_MODULE_RESIDUAL_BLOCK,       /* ts_nn_residual_block_new (type name "BasicBlock") */
    TS_MODULE_DATA_PARALLEL,        /* ts_nn_data_parallel_new */
    TS_MODULE_MODEL_PARALLEL,       /* ts_nn_model_parallel_new */
    TS_MODULE_PIPELINE_PARALLEL,    /* ts_nn_pipeline_parallel_new */
    TS_MODULE_TILE_PARALLEL,        /* ts_nn_tile_parallel_new */
    TS_MODULE_TO_DEVICE,            /* ts_nn_to_device_new */
    TS_MODULE_BOTTLENECK,           /* ts_nn_bottleneck_new */
    TS_MODULE_LAYERNORM,            /* ts_nn_layernorm_new */
    TS_MODULE_GROUPNORM,            /* ts_nn_groupnorm_new */
    TS_MODULE_BATCHNORM1D,          /* ts_nn_batchnorm1d_new */
    TS_MODULE_KIND_COUNT            /* number of kinds, not a kind */
} ts_module_kind_id;

/* m's kind; TS_MODULE_CUSTOM for NULL. A replica made by ts_replicate has
 * its source's kind; a BatchNorm2d turned into a SyncBatchNorm in place has
 * kind TS_MODULE_SYNC_BATCHNORM from then on. */
ts_module_kind_id ts_module_kind(const ts_module *m);
/* The kind's name, for messages: the type name of the modules of that kind
 * ("Conv2d", "BasicBlock", ...), "Custom" for TS_MODULE_CUSTOM, "?" for a
 * value out of range. Static string. */
const char *ts_module_kind_name(ts_module_kind_id kind);
/* The descendant at a dotted path ("features.1"), or NULL. Borrowed; owned by m. */
ts_module *ts_module_child(ts_module *m, const char *path);

/* Appends every parameter (recursively, PyTorch's named_parameters order) to
 * *out as (dotted name, the parameter itself): a new reference to the live
 * leaf tensor, so an optimizer built on the list updates the module. */
ts_status ts_module_parameters(ts_module *m, ts_tensor_list *out);
/* Appends every buffer (running_mean, running_var, num_batches_tracked, ...). */
ts_status ts_module_buffers(ts_module *m, ts_tensor_list *out);
/* Appends parameters and buffers in PyTorch's state_dict order. Each entry is
 * a detached alias (shares storage with the module, no autograd): writing to
 * it writes the model; clone the tensors for a snapshot. */
ts_status ts_module_state_dict(ts_module *m, ts_tensor_list *out);
/* Copies values from sd (borrowed) into m's parameters and buffers. Checks
 * everything before copying anything: a shape or dtype mismatch is an error
 * (TS_ERR_SHAPE, naming the key and both shapes) even when !strict; when
 * strict, a key of m missing from sd or a key of sd unknown to m is an error
 * (TS_ERR_INVALID_ARG naming the key). sd's tensors may be on any device. */
ts_status ts_module_load_state_dict(ts_module *m, const ts_tensor_list *sd, bool strict);
/* The message stays short: the number of missing, unexpected and mis-shaped keys and the first
 * five of each. ts_module_load_state_dict_from also knows which zoo model sd was saved from
 * (sd_model: a checkpoint's train.model; NULL when unknown): when it is not the zoo model m was
 * built as (ts_module_model_name) and sd does not fit, the message says so first ("this is a cnn
 * checkpoint; the model is resnet18") and lists no keys. */
ts_status ts_module_load_state_dict_from(ts_module *m, const ts_tensor_list *sd, bool strict, const char *sd_model);
/* The zoo model m was built as (ts_model_new, ts_model_resnet: "resnet18", ...), else NULL. Static. */
const char *ts_module_model_name(const ts_module *m);
/* Moves every parameter and buffer to dev (gradients move too). Parameters
 * stay leaves with requires_grad. Tensors already on dev are kept. Lists taken
 * before the move (and optimizers built on them) still point at the old
 * tensors: move the model first, then build the optimizer. */
ts_status ts_module_to(ts_module *m, ts_device *dev);
/* A second module tree over m's own tensors: the same types, configuration (borrowed: m must outlive the
 * share) and names, its slots holding new references to m's parameters and buffers — not copies, so training
 * either trains both. For code that must hand a module it does not own to something that takes ownership
 * (ts_strategy_new: ts_run_open with ts_run_config.module). ts_module_to on the share replaces the share's
 * slots, not m's; a custom module's forward gets the share as self (and the same ctx). *out is new. */
ts_status ts_module_share(ts_module *m, ts_module **out);
/* Sets every parameter's gradient to NULL (set_to_none). */
void ts_module_zero_grad(ts_module *m);
/* Number of parameter elements. */
int64_t ts_module_num_parameters(ts_module *m);

/* ---- containers ------------------------------------------------------------------------------ */
/* An empty Sequential; forward runs the children in order (an empty one returns x). */
ts_status ts_nn_sequential_new(ts_module **out);
/* Appends child under `name` (NULL: its index, "0", "1", ...; a name must be
 * unique, non-empty and contain no '.'). seq takes ownership of child — also
 * on failure, when child is freed — so builders can chain calls without leaks.
 * child == NULL is an error (TS_ERR_INVALID_ARG). */
ts_status ts_nn_sequential_add(ts_module *seq, const char *name, ts_module *child);
/* Number of children of seq. */
int ts_nn_sequential_len(const ts_module *seq);

/* ---- modules of your own (PyTorch's nn.Module subclass) ---------------------------------------------- */
/* A module whose forward is your function: residual blocks, branches, shared
 * layers and any composition of ops are ordinary C. Register parameters,
 * buffers and children on it; they get PyTorch's dotted names and order like
 * every module's (state dicts, checkpoints, DDP, optimizers see them), and
 * ts_module_train / ts_module_to / ts_replicate handle them.
 *
 * The forward function gets the module itself (`self`) and must read its
 * tensors through it on every call — ts_module_param(self, "weight"),
 * ts_module_call(self, "conv1", x, &y) — never through pointers kept in ctx:
 * ts_module_to replaces the slots' tensors, and DataParallel runs the same
 * function on replicas whose slots hold other tensors. It returns a new
 * reference in *out (TS_OK) or a status with ts_last_error() set (*out is
 * then released if set). ts_module_is_training(self) says train or eval.
 *
 * Strategies: DDP, DataParallel, checkpoints and resume work with any custom
 * module. Model and pipeline parallelism split a Sequential's children between
 * devices, so a custom module is one stage's layer (wrap your blocks in a
 * Sequential to split them; pipeline parallelism also splits ts_model_gpt's
 * blocks); tile parallelism refuses a custom module by name
 * (it cannot know the module's spatial reach).
 *
 * type_name (copied; NULL: "Module") is what messages and ts_module_type_name
 * print. ctx is yours: free_ctx (may be NULL) runs on it when the module is
 * freed (also when this call fails). The module's kind is TS_MODULE_CUSTOM. */
typedef ts_status (*ts_module_forward_fn)(ts_module *self, const ts_tensor *x, ts_tensor **out);
ts_status ts_nn_module_new(const char *type_name, ts_module_forward_fn forward, void *ctx, void (*free_ctx)(void *ctx),
                           ts_module **out);
/* The ctx given to ts_nn_module_new (NULL for other modules). Replicas share it. */
void *ts_module_ctx(const ts_module *m);
/* Registers a parameter (a float32 tensor; it becomes a leaf with requires_grad),
 * a buffer (running statistics and other state without gradients) or a child
 * module under a local name (no '.'; unique among m's parameters, buffers and
 * children; a NULL child name means its index, "0", "1", ...). m must have come
 * from ts_nn_module_new. Each takes ownership of the reference t / of child, also
 * on failure. At most 8 parameters and 8 buffers per module (children: any
 * number). t may be NULL (an absent optional tensor, skipped by every walk as
 * PyTorch skips a parameter registered as None). */
ts_status ts_module_add_parameter(ts_module *m, const char *name, ts_tensor *t);
ts_status ts_module_add_buffer(ts_module *m, const char *name, ts_tensor *t);
ts_status ts_module_add_child(ts_module *m, const char *name, ts_module *child);
/* m's own parameter / buffer called `name` (any module type), or NULL. Borrowed. */
ts_tensor *ts_module_param(const ts_module *m, const char *name);
ts_tensor *ts_module_buffer(const ts_module *m, const char *name);
/* Runs the descendant at dotted `path` (ts_module_child) on x: the usual call
 * inside a forward function. Errors name the child. */
ts_status ts_module_call(ts_module *m, const char *path, const ts_tensor *x, ts_tensor **out);

/* ---- layers (each *out is a new module owned by the caller) ----------------------------------------- */
/* y = x W^T + b. x: (N, in) -> (N, out). Parameters "weight" (out, in), "bias" (out). */
ts_status ts_nn_linear_new(int64_t in_features, int64_t out_features, bool bias, ts_rng *rng, ts_module **out);
/* Conv2d(in, out, (kh, kw)) with stride/padding/dilation/groups from p.
 * Parameters "weight" (out, in/groups, kh, kw), "bias" (out). */
ts_status ts_nn_conv2d_new(int64_t in_channels, int64_t out_channels, int kh, int kw, ts_conv2d_params p, bool bias,
                           ts_rng *rng, ts_module **out);
/* BatchNorm2d(C): PyTorch defaults are eps 1e-5, momentum 0.1, affine and
 * track_running_stats true. momentum < 0 means PyTorch's momentum=None
 * (cumulative average over num_batches_tracked). Parameters "weight", "bias"
 * (when affine); buffers "running_mean", "running_var", "num_batches_tracked"
 * (when track_running_stats). */
ts_status ts_nn_batchnorm2d_new(int64_t num_features, float eps, float momentum, bool affine, bool track_running_stats,
                                ts_module **out);
/* BatchNorm1d(C): ts_nn_batchnorm2d_new's arguments, names and semantics for
 * (N, C) or (N, C, L) inputs (ts_batchnorm1d). */
ts_status ts_nn_batchnorm1d_new(int64_t num_features, float eps, float momentum, bool affine, bool track_running_stats,
                                ts_module **out);
/* LayerNorm(normalized_shape): normalises over the last ndim dims of its input,
 * which must equal normalized_shape[0..ndim) (1 <= ndim <= TS_MAX_DIMS); PyTorch's
 * default eps is 1e-5. Parameters "weight", "bias" shaped normalized_shape (when
 * elementwise_affine). */
ts_status ts_nn_layernorm_new(int ndim, const int64_t *normalized_shape, float eps, bool elementwise_affine,
                              ts_module **out);
/* GroupNorm(num_groups, num_channels): (N, C, *) inputs with C = num_channels,
 * divisible by num_groups; default eps 1e-5. Parameters "weight", "bias" (C) when affine. */
ts_status ts_nn_groupnorm_new(int num_groups, int64_t num_channels, float eps, bool affine, ts_module **out);
ts_status ts_nn_relu_new(ts_module **out);
ts_status ts_nn_maxpool2d_new(ts_pool2d_params p, ts_module **out);
ts_status ts_nn_avgpool2d_new(ts_pool2d_params p, ts_module **out);
/* PyTorch's AdaptiveAvgPool2d(1): (N, C, H, W) -> (N, C, 1, 1). */
ts_status ts_nn_global_avgpool2d_new(ts_module **out);
/* Flatten with start_dim 1: (N, C, H, W) -> (N, C*H*W). */
ts_status ts_nn_flatten_new(ts_module **out);
/* Inverted dropout with probability p in [0, 1) while training; identity in
 * eval mode. rng is borrowed and must outlive the module (NULL: the default
 * generator). */
ts_status ts_nn_dropout_new(float p, ts_rng *rng, ts_module **out);
/* Embedding(num, dim): TS_I64 indices of any shape -> shape + (dim). Parameter "weight" (num, dim). */
ts_status ts_nn_embedding_new(int64_t num_embeddings, int64_t dim, ts_rng *rng, ts_module **out);
/* torchvision's ResNet BasicBlock: conv3x3(stride)-BN-ReLU-conv3x3-BN, plus the
 * identity, or "downsample" = Sequential(conv1x1(stride), BN) when stride != 1
 * or in != out channels; then ReLU. Convolutions have no bias. Children:
 * conv1, bn1, conv2, bn2[, downsample.0, downsample.1]. */
ts_status ts_nn_residual_block_new(int64_t in_channels, int64_t out_channels, int stride, ts_rng *rng,
                                   ts_module **out);
/* torchvision's ResNet Bottleneck (v1.5: the stride on the 3x3): conv1x1(in -> width)-BN-ReLU-
 * conv3x3(width, stride)-BN-ReLU-conv1x1(width -> out)-BN, plus the identity or "downsample" =
 * Sequential(conv1x1(stride), BN) when stride != 1 or in != out; then ReLU. No conv bias. Children:
 * conv1, bn1, conv2, bn2, conv3, bn3[, downsample.0, downsample.1]. */
ts_status ts_nn_bottleneck_new(int64_t in_channels, int64_t width, int64_t out_channels, int stride, ts_rng *rng,
                               ts_module **out);

/* ---- typed configuration accessors ------------------------------------------------------------------ */
/* Each reads the configuration a layer was built with (not its tensors) into
 * the outputs that are not NULL; any output may be NULL. m is borrowed.
 * Errors: TS_ERR_INVALID_ARG when m is NULL or of another kind, with a message
 * naming the accessor, the kind it expects and m's actual type name; the
 * outputs are then left untouched. */

/* Linear: in_features, out_features, and whether it has a bias. */
ts_status ts_linear_get_config(const ts_module *m, int64_t *in_features, int64_t *out_features, bool *bias);
/* Conv2d: channels, kernel size (kh, kw), stride/padding/dilation/groups exactly
 * as given to ts_nn_conv2d_new, and whether it has a bias. */
ts_status ts_conv2d_get_config(const ts_module *m, int64_t *in_channels, int64_t *out_channels, int *kh, int *kw,
                               ts_conv2d_params *params, bool *bias);
/* MaxPool2d or AvgPool2d (ts_module_kind tells which): the parameters exactly
 * as given to the constructor (stride 0 still means = kernel, dilation 0 = 1). */
ts_status ts_pool2d_get_params(const ts_module *m, ts_pool2d_params *params);
/* BatchNorm2d or SyncBatchNorm: the constructor's arguments (momentum < 0:
 * PyTorch's momentum=None). A converted SyncBatchNorm keeps its BatchNorm2d's. */
ts_status ts_batchnorm2d_get_config(const ts_module *m, int64_t *num_features, float *eps, float *momentum,
                                    bool *affine, bool *track_running_stats);
/* BatchNorm1d: the constructor's arguments, as ts_batchnorm2d_get_config. */
ts_status ts_batchnorm1d_get_config(const ts_module *m, int64_t *num_features, float *eps, float *momentum,
                                    bool *affine, bool *track_running_stats);
/* LayerNorm: the number of normalised dims, their sizes (normalized_shape: room
 * for TS_MAX_DIMS entries), eps and whether it has weight and bias. */
ts_status ts_layernorm_get_config(const ts_module *m, int *ndim, int64_t *normalized_shape, float *eps,
                                  bool *elementwise_affine);
/* GroupNorm: the number of groups and channels, eps and whether it has weight and bias. */
ts_status ts_groupnorm_get_config(const ts_module *m, int *num_groups, int64_t *num_channels, float *eps,
                                  bool *affine);
/* Dropout: the drop probability p. */
ts_status ts_dropout_get_p(const ts_module *m, float *p);
/* Embedding: the number of embeddings and their dimension. */
ts_status ts_embedding_get_config(const ts_module *m, int64_t *num_embeddings, int64_t *dim);

/* ---- model builders ------------------------------------------------------------------------------------ */
/* The reference CNN for 1x28x28 inputs, with the names of
 *   nn.Sequential(nn.Conv2d(1,32,3,padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
 *                 nn.Conv2d(32,64,3,padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
 *                 nn.Flatten(), nn.Linear(3136,128), nn.ReLU(), nn.Linear(128,10)).
 * (N, 1, 28, 28) -> (N, 10) logits. */
ts_status ts_model_reference_cnn(ts_rng *rng, ts_module **out);
/* nn.Sequential(nn.Flatten(), nn.Linear(784,256), nn.ReLU(), nn.Linear(256,10)). */
ts_status ts_model_mlp(ts_rng *rng, ts_module **out);
/* torchvision.models.resnet<depth>(num_classes=...) (depth 18, 34, 50, 101 or 152): the same
 * state-dict keys and shapes (conv1, bn1, layer1.0.conv1, ..., layer4.1.downsample.0, fc), as a
 * Sequential named conv1, bn1, relu, maxpool, layer1..layer4 (Sequentials of BasicBlock / Bottleneck),
 * avgpool (AdaptiveAvgPool2d(1)), flatten, fc — so model and pipeline parallelism can split it.
 * torchvision's initialisation: convolutions kaiming_normal_(fan_out, relu), BatchNorm weight 1 and
 * bias 0, fc Linear's default. Input (N, 3, H, W) with H, W >= 32 (224 for ImageNet; any size works,
 * the pooling is adaptive) -> (N, num_classes) logits. */
ts_status ts_model_resnet(int depth, int64_t num_classes, ts_rng *rng, ts_module **out);

/* What the zoo knows about a model: its default class count and its input. */
typedef struct ts_model_desc {
    const char *name;    /* static */
    int64_t num_classes; /* default: 10 (cnn, mlp), 1000 (ResNets) */
    int in_channels;     /* 1 (cnn, mlp: gray) or 3 (RGB) */
    int image_size;      /* the input's side: 28 (fixed for cnn and mlp) or 224 (ResNets' default) */
    bool fixed_size;     /* true when the model takes only image_size x image_size inputs */
    bool tokens;         /* a language model (the GPT-2 presets): input token ids (B, T), T <= seq_len, output
                            (B, T, num_classes) next-token logits; num_classes is the vocabulary, in_channels and
                            image_size are 0 */
    int64_t seq_len;     /* tokens: the context length (0 for the image models) */
} ts_model_desc;

/* The zoo: "cnn", "mlp", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", and the GPT-2 presets
 * ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt2-tiny": ts_gpt_preset; ts_model_new gives the preset
 * with num_classes tokens). For other GPT sizes use ts_model_gpt.
 * ts_model_info fills *out (may be NULL) and returns true for a known name;
 * ts_model_name_at(i) lists the names (NULL past the end). */
bool ts_model_info(const char *name, ts_model_desc *out);
const char *ts_model_name_at(int i);
/* Builds the zoo model `name` with num_classes outputs (<= 0: its default). An
 * unknown name is TS_ERR_INVALID_ARG naming it and listing the known ones. */
ts_status ts_model_new(const char *name, int64_t num_classes, ts_rng *rng, ts_module **out);
/* ts_model_new(name, 0, rng, out). */
ts_status ts_model_by_name(const char *name, ts_rng *rng, ts_module **out);

/* ---- GPT-2 (Hugging Face's GPT2LMHeadModel) ------------------------------------------------------- */
/* A GPT-2 family language model: token and position embeddings, n_layer pre-LayerNorm blocks
 * (x + attn(ln_1(x)), then x + mlp(ln_2(x)); causal multi-head attention through
 * ts_scaled_dot_product_attention; the MLP n_embd -> 4 n_embd -> n_embd with GELU's tanh
 * approximation, Hugging Face's "gelu_new"), a final LayerNorm, and the output projection tied to the
 * token embedding (logits = h wte^T). LayerNorm eps as given (GPT-2's 1e-5).
 *
 * Names and shapes are those of transformers.GPT2LMHeadModel's state dict, so its safetensors files
 * load as they are and ours load into it:
 *   transformer.wte.weight (vocab, n_embd)      transformer.wpe.weight (seq_len, n_embd)
 *   transformer.h.<i>.ln_1.{weight,bias}        transformer.h.<i>.attn.c_attn.{weight (n_embd, 3 n_embd), bias}
 *   transformer.h.<i>.attn.c_proj.{weight (n_embd, n_embd), bias}   transformer.h.<i>.ln_2.{weight,bias}
 *   transformer.h.<i>.mlp.c_fc.{weight (n_embd, 4 n_embd), bias}    transformer.h.<i>.mlp.c_proj.{weight (4 n_embd, n_embd), bias}
 *   transformer.ln_f.{weight,bias}
 * The linear layers are GPT-2's Conv1D: weight stored [in, out], y = x W + b. lm_head.weight is the
 * same tensor as transformer.wte.weight and appears once, as transformer.wte.weight (as in
 * named_parameters() and in what save_pretrained writes); ts_gpt_load_state_dict accepts a
 * lm_head.weight too (it must equal wte).
 *
 * Initialisation as GPT-2 / nanoGPT / Hugging Face's _init_weights: every weight N(0, init_std) (wte and
 * wpe included), the residual projections (attn.c_proj.weight, mlp.c_proj.weight) N(0, init_std /
 * sqrt(2 n_layer)), biases 0, LayerNorm weight 1 and bias 0.
 *
 * Dropout p (training mode only) after the embedding sum and on each residual branch's output
 * (Hugging Face's embd_pdrop and resid_pdrop); there is no dropout on the attention probabilities
 * (attn_pdrop): train with dropout 0 or accept that difference.
 *
 * Forward: tokens (B, T) TS_I64 in [0, vocab_size), 1 <= T <= seq_len -> logits (B, T, vocab_size) F32. */
typedef struct ts_gpt_config {
    int64_t n_layer, n_head, n_embd; /* n_embd divisible by n_head */
    int64_t seq_len;                 /* the context length (n_positions) */
    int64_t vocab_size;
    float dropout;                   /* embedding and residual dropout, in [0, 1); default 0 */
    float layer_norm_eps;            /* default 1e-5 */
    float init_std;                  /* default 0.02 */
} ts_gpt_config;
/* GPT-2 small: 12 layers, 12 heads, 768 wide, 1024 positions, 50257 tokens. */
#define TS_GPT_CONFIG_INIT ((ts_gpt_config){12, 12, 768, 1024, 50257, 0.0f, 1e-5f, 0.02f})

/* The presets: "gpt2" (12/12/768), "gpt2-medium" (24/16/1024), "gpt2-large" (36/20/1280), "gpt2-xl"
 * (48/25/1600), all with 1024 positions and 50257 tokens; "gpt2-tiny" (2 layers, 2 heads, 64 wide,
 * 64 positions, 512 tokens: for tests). Unknown names are TS_ERR_INVALID_ARG listing the known ones. */
ts_status ts_gpt_preset(const char *name, ts_gpt_config *out);
/* The preset names in order (NULL past the end). */
const char *ts_gpt_preset_name_at(int i);
/* Checks c's fields (TS_ERR_INVALID_ARG naming the bad one). */
ts_status ts_gpt_config_check(const ts_gpt_config *c);
/* Builds the model (CPU, training mode); rng as the other builders. ts_module_model_name gives "gpt2". */
ts_status ts_model_gpt(const ts_gpt_config *c, ts_rng *rng, ts_module **out);
/* The configuration a model from ts_model_gpt was built with; TS_ERR_INVALID_ARG for other modules. */
ts_status ts_gpt_get_config(const ts_module *m, ts_gpt_config *out);

/* Loads a state dict in Hugging Face's GPT-2 names into m (strict): keys as ts_model_gpt's, or as
 * GPT2Model's (no "transformer." prefix: the original GPT-2 files); lm_head.weight, when present,
 * must equal transformer.wte.weight (an untied head is TS_ERR_UNSUPPORTED); the attention mask
 * buffers older files carry (attn.bias, attn.masked_bias) are skipped. Errors as ts_module_load_state_dict. */
ts_status ts_gpt_load_state_dict(ts_module *m, const ts_tensor_list *sd);
/* ts_safetensors_load + ts_gpt_load_state_dict. */
ts_status ts_gpt_load_safetensors(ts_module *m, const char *path);
/* Writes m's state dict (what GPT2LMHeadModel.save_pretrained writes: every parameter, no
 * lm_head.weight) to path with "__metadata__" {"format": "pt"}. */
ts_status ts_gpt_save_safetensors(ts_module *m, const char *path);

/* ---- GPT-2 inference with a key/value cache ---------------------------------------------------------- */
/* A key/value cache for one sequence (batch 1): per layer the keys and values of every position seen,
 * (1, n_head, seq_len, head_dim) each, on m's device. ts_gpt_cache_forward runs new tokens against it
 * without autograd: a single token costs one query row against the cached keys, O(T), not a forward
 * over the whole sequence. m (borrowed) must outlive the cache and keep its parameters' device. */
typedef struct ts_gpt_cache ts_gpt_cache;
ts_status ts_gpt_cache_new(ts_module *m, ts_gpt_cache **out);
void ts_gpt_cache_free(ts_gpt_cache *c);
/* Number of positions in the cache. */
int64_t ts_gpt_cache_len(const ts_gpt_cache *c);
/* Empties the cache. */
void ts_gpt_cache_reset(ts_gpt_cache *c);
/* Appends tokens[0..n) (n >= 1; cache length + n <= seq_len, else TS_ERR_INVALID_ARG naming both) and
 * returns their logits (n, vocab_size) F32 on the model's device in *logits (new reference; NULL: not
 * wanted): equal to the full forward's logits at those positions. */
ts_status ts_gpt_cache_forward(ts_gpt_cache *c, const int64_t *tokens, int64_t n, ts_tensor **logits);

/* Called with each new token (index i from 0); return false to stop early. */
typedef bool (*ts_gpt_token_fn)(int64_t i, int64_t token, void *user);
typedef struct ts_gpt_sample_config {
    int64_t max_new_tokens; /* >= 0 */
    float temperature;      /* 1; 0 (or top_k 1): greedy, the first largest logit as torch.argmax */
    int64_t top_k;          /* 0: every token; k: only the k largest logits (ties at the k-th kept) */
    uint64_t seed;          /* sampling is deterministic for a seed */
    ts_gpt_token_fn on_token; /* may be NULL */
    void *user;
} ts_gpt_sample_config;
#define TS_GPT_SAMPLE_CONFIG_INIT ((ts_gpt_sample_config){16, 1.0f, 0, 0, NULL, NULL})

/* Continues prompt[0..n_prompt) (n_prompt >= 1, ids in [0, vocab_size)) by up to max_new_tokens tokens,
 * written to out[0..) (room for max_new_tokens); *n_out (may be NULL) gets how many. Each step divides
 * the last logits by the temperature, keeps the top_k largest, and samples from their softmax with a
 * generator seeded with seed (greedy as above). The context is nanoGPT's: when the sequence is longer
 * than seq_len the model sees only its last seq_len tokens — the prompt is cropped so, and once the
 * cache is full each further token re-reads the last seq_len tokens (a full forward per token from
 * then on, as nanoGPT does without a cache). Runs in eval mode without autograd (the module's mode is
 * restored). */
ts_status ts_gpt_generate(ts_module *m, const int64_t *prompt, int64_t n_prompt, const ts_gpt_sample_config *c,
                          int64_t *out, int64_t *n_out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_NN_H */
