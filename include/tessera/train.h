/*
 * tessera/train.h — training as a library: batch sources, strategies, the
 * training step, evaluation and the trainer that owns the loop. `tessera train`
 * is a thin shell over tessera/run.h (a ts_run_config in, ts_run_open builds
 * these objects); a C program that wants its own pieces puts them together
 * with these calls:
 *
 *     ts_batch_source *train, *test;              // IDX files or an image folder
 *     ts_data_opts d = TS_DATA_OPTS_INIT;
 *     d.path = "/usr/share/datasets/fashion-mnist";
 *     d.rank = ts_pg_rank(pg); d.world_size = ts_pg_size(pg);  // this rank's share
 *     ts_data_open(&d, &train, &test);
 *
 *     ts_module *model;  ts_model_by_name("cnn", &rng, &model);
 *     ts_strategy_opts so = TS_STRATEGY_OPTS_INIT;
 *     so.kind = TS_STRATEGY_DDP; so.pg = pg;      // or NONE / DATA / MODEL / PIPELINE / TILE
 *     ts_strategy *s;  ts_strategy_new(model, &so, &s);        // owns the model now
 *
 *     ts_optimizer *opt;  ts_optimizer_by_name("sgd", params of ts_strategy_model(s), ...);
 *     ts_trainer_opts to = TS_TRAINER_OPTS_INIT;
 *     to.epochs = 4; to.eval = test; to.checkpoint = "run.ckpt";
 *     ts_trainer *t;  ts_trainer_new(s, opt, train, &to, &t);
 *     ts_train_result r;  ts_trainer_run(t, &r);   // r.eval.accuracy, r.images_per_second
 *
 * Layers: a batch source yields batches (tessera/data.h's loader + samplers,
 * or tessera/pipeline.h's DALI-style pipeline); a strategy runs forward and
 * backward of a model on its devices or ranks (tessera/ddp.h, tessera/parallel.h);
 * ts_train_step adds the optimizer; the trainer adds epochs, the learning-rate
 * schedule, evaluation, checkpoints and resume.
 *
 * Ownership: every *_new hands the caller a handle freed with its _free
 * (NULL is fine). Borrowed arguments say so and must outlive the object.
 */
#ifndef TESSERA_TRAIN_H
#define TESSERA_TRAIN_H

#include "ckpt.h"
#include "ddp.h"
#include "optim.h"
#include "parallel.h"
#include "pipeline.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- batch sources ------------------------------------------------------------------------------ */
/* One interface over every input: a source yields the batches of an epoch in
 * order and can be positioned at any batch of any epoch (resume). */
typedef struct ts_batch_source ts_batch_source;

typedef struct ts_batch {
    ts_tensor *x;           /* (size, ...) float32 samples, or (size, T) int64 token ids (ts_batch_source_tokens);
                               borrowed: valid until the next call on the source */
    ts_tensor *y;           /* (size) int64 class labels, or (size, T) int64 next tokens; borrowed likewise */
    int64_t size;           /* rows in x and y */
    int64_t real;           /* the first `real` rows are samples of this epoch; the rest repeat one to fill
                               the batch (the pipeline's pad_last_batch). Training uses every row (as DALI
                               does), evaluation only the real ones. */
    int64_t epoch, index;   /* the batch's epoch and its index in that epoch */
    const int64_t *samples; /* the data set index of each of the `size` rows, borrowed like x */
    int64_t skipped;        /* samples of this batch left out as corrupt (a pipeline's skip_corrupt); 0 when
                               the source never skips (ts_batch_source_next zeroes the batch before asking) */
} ts_batch;

/* Implementation table of a source, for sources of your own (ts_batch_source_new). */
typedef struct ts_batch_source_ops {
    /* Batches of `epoch` (an upper bound when the source may skip corrupt samples). Required. */
    int64_t (*num_batches)(void *impl, int64_t epoch);
    /* Samples in the whole data set (all ranks). Required. */
    int64_t (*num_samples)(void *impl);
    /* Position at batch `batch` (0 <= batch <= num_batches) of `epoch`. Required. */
    ts_status (*seek)(void *impl, int64_t epoch, int64_t batch);
    /* The next batch of the current epoch into *out (every field), or out->x = NULL
     * at the end of the epoch. Required. */
    ts_status (*next)(void *impl, ts_batch *out);
    /* Optional: one sample's shape (e.g. 1, 28, 28) into shape; returns its ndim (0: unknown). */
    int (*sample_shape)(void *impl, int64_t *shape);
    /* Optional: releases impl. */
    void (*destroy)(void *impl);
    /* Optional: the number of classes (labels 0..n-1), and the name of class `label` (borrowed; NULL
     * when unnamed, e.g. IDX files). */
    int64_t (*num_classes)(void *impl);
    const char *(*class_name)(void *impl, int64_t label);
} ts_batch_source_ops;

/* Wraps an implementation. ops is borrowed (usually a static table); impl is
 * owned by the source from now on (ops->destroy runs in ts_batch_source_free,
 * also when this call fails). The source starts at epoch 0, batch 0: the
 * implementation must be positioned there too. */
ts_status ts_batch_source_new(const ts_batch_source_ops *ops, void *impl, ts_batch_source **out);
void ts_batch_source_free(ts_batch_source *s);

/* A source over a dataset (borrowed; it must outlive the source), in the order
 * of torch's DistributedSampler for (rank, world_size): every epoch the indices
 * 0..N-1 shuffled with seed + epoch (torch.randperm), padded to a multiple of
 * world_size by repeating from the start, rank r taking positions r, r + R, ...
 * A single process is the world of one (rank 0 of 1), so one process at batch
 * B and R processes at batch B / R see the same samples in every step. */
typedef struct ts_dataset_source_opts {
    int64_t batch_size;  /* rows per batch on this rank (64) */
    bool shuffle;        /* false: 0..N-1 in order (evaluation) */
    uint64_t seed;       /* the shuffle's seed */
    int rank, world_size; /* this rank's share (0, 1: everything) */
    bool drop_last;      /* DistributedSampler's drop_last and the loader's: no padding, no short batch */
    ts_device *device;   /* where batches land (NULL: the CPU) */
} ts_dataset_source_opts;

#define TS_DATASET_SOURCE_OPTS_INIT ((ts_dataset_source_opts){64, true, 0, 0, 1, false, NULL})

ts_status ts_batch_source_dataset(ts_dataset *ds, const ts_dataset_source_opts *o, ts_batch_source **out);

/* A source over a DALI-style pipeline (takes ownership of p, also on failure).
 * The pipeline's reader shards the data (shard_id / num_shards): give each rank
 * its own pipeline. Seeks only when asked for a batch the pipeline is not at, so
 * an epoch that follows the previous one streams on without a restart. */
ts_status ts_batch_source_pipeline(ts_pipeline *p, ts_batch_source **out);

/* A source over llm.c token shards (tessera/data.h) in the order of llm.c's DistributedDataLoader
 * (llmc/dataloader.h): the shards in glob(3)'s sorted order; in each shard, global window g (0, 1, ...)
 * covers tokens [g R B T, (g + 1) R B T + 1) and rank r's batch is its part from p = g R B T + r B T:
 * x = tokens[p, p + B T) and y = tokens[p + 1, p + B T + 1), each as (B, T) int64. A shard holds
 * (n - 1) / (R B T) windows (rounded down; the tail is left out, as llm.c); a shard with none is skipped
 * (llm.c refuses it), and no window at all is TS_ERR_INVALID_ARG. An epoch is every window of every shard
 * once (ts_batch_source_num_batches: the sum), the same count on every rank, and ranks' windows never overlap.
 * Without shuffle (evaluation, and llm.c's default) the order is exactly llm.c's. With shuffle the shards'
 * order and each shard's windows are permuted by (seed, epoch) alone, the same on every rank (llm.c seeds
 * mt19937 with 42 + rank and draws on from epoch to epoch, so its shuffled order is not reproduced), so
 * seek(epoch, batch) lands exactly: a run resumed mid-epoch sees the batches it would have seen.
 * ts_batch.samples: each row's first token as an offset into the shards laid end to end (in the files'
 * order). Validation: a second source over the val shards with shuffle off; with R ranks each reads its
 * stride, and the windows of all ranks together cover each val shard's first (n - 1) / (R B T) R B T + 1
 * tokens once (R = 1: every full window in order). */
typedef struct ts_token_source_opts {
    const char *pattern;       /* a glob(3) pattern of shard files (their sorted list), or NULL: */
    const char *const *files;  /* the shard files in this order (borrowed while the call runs) */
    int num_files;
    int64_t batch_size, seq_len; /* B rows of T tokens (8, 1024) */
    int rank, world_size;      /* (0, 1) */
    bool shuffle;              /* false */
    uint64_t seed;             /* the shuffle's (0) */
    int64_t vocab_size;        /* > 0: every token is checked below it when the shard opens; num_classes (0) */
} ts_token_source_opts;

#define TS_TOKEN_SOURCE_OPTS_INIT ((ts_token_source_opts){NULL, NULL, 0, 8, 1024, 0, 1, false, 0, 0})

/* Opens (maps) every shard and checks it (errors name the file); *out owns them. */
ts_status ts_batch_source_tokens(const ts_token_source_opts *o, ts_batch_source **out);

/* Batches of `epoch`, and samples in the whole data set. */
int64_t ts_batch_source_num_batches(const ts_batch_source *s, int64_t epoch);
int64_t ts_batch_source_num_samples(const ts_batch_source *s);
/* The classes of the data (image folders: one per sub-folder; IDX: the largest label + 1, or its
 * classes.txt's lines), 0 when unknown; the name of class `label` (an image folder's sub-folder name,
 * an IDX set's name: ts_dataset_class_name; borrowed), NULL when unnamed. */
int64_t ts_batch_source_num_classes(const ts_batch_source *s);
const char *ts_batch_source_class_name(const ts_batch_source *s, int64_t label);
/* One sample's shape into shape (TS_MAX_DIMS entries); returns its ndim, 0 when unknown. */
int ts_batch_source_sample_shape(const ts_batch_source *s, int64_t *shape);
/* Samples left out as corrupt in the batches this source returned so far (the sum of ts_batch.skipped). */
int64_t ts_batch_source_skipped(const ts_batch_source *s);
/* Positions the source at batch `batch` of `epoch` (set_epoch: batch 0). */
ts_status ts_batch_source_seek(ts_batch_source *s, int64_t epoch, int64_t batch);
ts_status ts_batch_source_set_epoch(ts_batch_source *s, int64_t epoch);
/* The next batch of the current epoch; out->x == NULL when the epoch is over
 * (seek or set_epoch to go on). out's tensors and samples are borrowed. */
ts_status ts_batch_source_next(ts_batch_source *s, ts_batch *out);
/* The epoch and the index of the batch the next ts_batch_source_next returns. */
int64_t ts_batch_source_epoch(const ts_batch_source *s);
int64_t ts_batch_source_batch_index(const ts_batch_source *s);

/* What `tessera train --data PATH` opens: MNIST-style IDX files in a folder
 * ({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]), or images: a folder
 * with one sub-folder per class (or its train/ and val/ sub-folders: ImageNet's
 * and torchvision's ImageFolder layout; test/ instead of val/ is the layout
 * `tessera data export` writes) or a file of "path label" lines, read by the
 * DALI-style pipeline (image_size below). */
typedef struct ts_data_opts {
    const char *path;       /* required; copied */
    int64_t batch_size;     /* rows per training batch on this rank (64) */
    int64_t eval_batch_size; /* rows per evaluation batch (1000) */
    uint64_t seed;          /* shuffling (0) */
    int rank, world_size;   /* this rank's share of the training data (0, 1) */
    int threads;            /* images: decoding workers (2) */
    int image_size;         /* images: 0 reads them as the reference models' input (gray 28x28, Fashion-MNIST's
                               normalisation); > 0 as RGB image_size x image_size with ImageNet's normalisation:
                               training random-resized-crop (scale 0.08-1) + horizontal flip, evaluation the
                               central 0.875 window (Resize(S/0.875) + CenterCrop(S)), streamed (0) */
    bool eval_on_train;     /* the evaluation source reads the training split (in order, evaluation
                               preprocessing) instead of the test split: training accuracy (false) */
    ts_device *mixed_decode; /* images: the training pipeline's JPEGs decoded on this device (DALI's "mixed":
                                a CUDA device with nvJPEG), its batches landing there; evaluation decodes on
                                the workers. NULL: the workers decode everything (NULL) */
    bool skip_corrupt;      /* images: undecodable files are left out (each named in a warning, counted in
                               ts_batch.skipped) instead of failing the run (false) */
    int64_t seq_len;        /* token data: tokens per row, T (1024) */
    int64_t eval_max_batches; /* token data: evaluate on the first this many validation batches (0: all) */
} ts_data_opts;

#define TS_DATA_OPTS_INIT ((ts_data_opts){NULL, 64, 1000, 0, 0, 1, 2, 0, false, NULL, false, 1024, 0})

/* Opens the training source (shuffled; this rank's share: the distributed
 * sampler's for IDX files, the reader's shard with pad_last_batch for images)
 * and, when eval is not NULL, the evaluation source (the whole test split in
 * order: t10k-* files, the val/ or test/ folder, or the training images when
 * there is neither or eval_on_train is set). Each source owns what it read. Errors name the path. An empty
 * training or test set is TS_ERR_FORMAT naming it, and so is a test label that
 * is no class of the training set (IDX: above the training labels' largest;
 * images: test/'s class folders must be train/'s, in the same order). */
ts_status ts_data_open(const ts_data_opts *o, ts_batch_source **train, ts_batch_source **eval);
/* Whether path is a folder of token shards (`tessera data tokenize`'s output: *_train_*.bin files), which
 * ts_data_open reads as ts_batch_source_tokens: training batches of batch_size x seq_len from the train
 * shards (this rank's windows, shuffled by seed and epoch), evaluation in order over the *_val_*.bin shards
 * (eval_max_batches of them at most; the train shards when there are none), each with the vocabulary the
 * shards use (the largest id + 1) as its classes. */
bool ts_data_is_tokens(const char *path);
/* The evaluation window's share of the shorter side (torchvision's Resize(256) + CenterCrop(224)). */
#define TS_EVAL_CENTER_CROP 0.875f
/* One decoded image as ts_data_open's evaluation source presents it (for predictions on single files):
 * image_size 0: a gray image resized to 28x28 and normalised as Fashion-MNIST (1 x 28 x 28 floats);
 * > 0: torchvision's evaluation transform of an RGB image, Resize(int(image_size / TS_EVAL_CENTER_CROP))
 * + CenterCrop(image_size) + ToTensor + Normalize(ImageNet's mean and std), with Pillow's resampling
 * (ts_image_resize_center_crop_normalize; 3 x image_size x image_size floats, CHW). The wrong channel
 * count is TS_ERR_INVALID_ARG. */
ts_status ts_data_preprocess(const ts_image *im, int image_size, float *out);
/* True when path names images rather than IDX files (how ts_data_open decides):
 * a file (a "path label" list), or a folder with sub-folders and without
 * train-images-idx3-ubyte[.gz]. */
bool ts_data_is_images(const char *path);
/* Points o's file_root / file_list at the images path names for `split`
 * ("train", "test"): a file is a file list; a folder with a `split` sub-folder
 * means that sub-folder; any other folder is a file_root. buf (n bytes) holds
 * the joined path o may point to. Returns false when split's sub-folder is
 * absent (the folder itself is used). */
bool ts_data_reader_opts(const char *path, const char *split, ts_reader_opts *o, char *buf, size_t n);

/* ---- strategies ------------------------------------------------------------------------------------ */
/* How a model is spread over devices or ranks. Every strategy takes the model
 * built on the CPU, owns it from then on, and offers the same three things: a
 * module whose forward takes a CPU batch and returns CPU logits (evaluation),
 * a forward + cross-entropy + backward that leaves the batch's gradients in the
 * model's parameters, and the plain model (state dict with the model's own
 * keys, parameters for the optimizer), so checkpoints do not depend on the
 * strategy: one written under any strategy resumes under any other. */
typedef enum ts_strategy_kind {
    TS_STRATEGY_NONE = 0, /* the model on the CPU */
    TS_STRATEGY_DDP,      /* one rank of a process group; gradients averaged over ranks (tessera/ddp.h) */
    TS_STRATEGY_DATA,     /* replicas on every device, each batch split between them (DataParallel) */
    TS_STRATEGY_MODEL,    /* consecutive layers on each device, balanced by parameter count */
    TS_STRATEGY_PIPELINE, /* stages on the devices, micro-batches flowing through them (GPipe / 1F1B) */
    TS_STRATEGY_TILE,     /* every image cut into bands of rows, one per device, with halo exchange */
    TS_STRATEGY_COUNT
} ts_strategy_kind;

typedef struct ts_strategy_opts {
    size_t size;          /* sizeof(ts_strategy_opts) */
    unsigned int magic;   /* TS_STRATEGY_OPTS_MAGIC */
    unsigned int version; /* TS_STRATEGY_OPTS_VERSION */
    ts_strategy_kind kind;
    /* DATA, MODEL, PIPELINE, TILE: the devices (borrowed list, copied); NULL: every virtual CPU device */
    ts_device *const *devices;
    int num_devices;
    /* DDP: the process group (borrowed; must outlive the strategy) and DDP's options (NULL: defaults) */
    ts_process_group *pg;
    const ts_ddp_options *ddp;
    bool sync_bn;         /* DDP: BatchNorm2d layers become SyncBatchNorm over pg (a group of 1: no-op) */
    /* MODEL, PIPELINE: stage boundaries as ts_nn_model_parallel_new's (NULL: MODEL by parameter count,
     * PIPELINE by the layers' measured time on sample_shape, else equal layer counts; a GPT's: blocks, equal counts) */
    const int *bounds;
    int micro_batches;    /* PIPELINE: micro-batches per batch (8) */
    ts_pp_schedule schedule; /* PIPELINE: TS_PP_1F1B */
    int sample_ndim;      /* PIPELINE: one sample's shape, to time the layers (0: split by layer count) */
    int64_t sample_shape[TS_MAX_DIMS];
} ts_strategy_opts;

#define TS_STRATEGY_OPTS_MAGIC 0x7e5a7001u
#define TS_STRATEGY_OPTS_VERSION 1u
#define TS_STRATEGY_OPTS_INIT                                                                                  \
    ((ts_strategy_opts){sizeof(ts_strategy_opts), TS_STRATEGY_OPTS_MAGIC, TS_STRATEGY_OPTS_VERSION,           \
                        TS_STRATEGY_NONE, NULL, 0, NULL, NULL, false, NULL, 8, TS_PP_1F1B, 0, {0}})

/* "none", "ddp", "data", "model", "pipeline", "tile" (static), or NULL for an unknown kind. */
const char *ts_strategy_kind_name(ts_strategy_kind k);
/* The kind called name; an unknown name is TS_ERR_INVALID_ARG listing the known ones. */
ts_status ts_strategy_kind_parse(const char *name, ts_strategy_kind *out);
/* One line on what the kind does (static). */
const char *ts_strategy_kind_help(ts_strategy_kind k);

typedef struct ts_strategy ts_strategy;

/* Wraps model (a Sequential for MODEL and TILE, a Sequential or a GPT for PIPELINE; ownership taken, also
 * on failure) as o says. DDP is a collective: every rank of o->pg calls it, and
 * rank 0's parameters and buffers go to all. Errors name the strategy. */
ts_status ts_strategy_new(ts_module *model, const ts_strategy_opts *o, ts_strategy **out);
/* Frees the strategy and the model. NULL is fine. */
void ts_strategy_free(ts_strategy *s);

ts_strategy_kind ts_strategy_kind_of(const ts_strategy *s);
/* The plain model (borrowed): its parameters are what an optimizer updates,
 * its state dict (plain keys) what checkpoints hold. */
ts_module *ts_strategy_model(ts_strategy *s);
/* What runs (borrowed): forward takes a batch on any device and returns the
 * logits on the CPU. For DDP and NONE it is the model itself (its forward does
 * no communication: use it for evaluation). */
ts_module *ts_strategy_module(ts_strategy *s);
/* This process's rank and the number of ranks (DDP: the group's; else 0 and 1). */
int ts_strategy_rank(const ts_strategy *s);
int ts_strategy_world_size(const ts_strategy *s);
/* The devices the model is spread over (DATA, MODEL, PIPELINE, TILE; borrowed)
 * into devs (up to max); returns their number (0 for NONE and DDP). */
int ts_strategy_devices(const ts_strategy *s, ts_device **devs, int max);
/* The DDP wrapper (borrowed), or NULL for other kinds. */
ts_ddp *ts_strategy_ddp(ts_strategy *s);
/* A one-line description ("pipeline over cpu:0, cpu:1: 1f1b, 8 micro-batches, stages of 4, 8 layers")
 * into buf (n bytes, always terminated). */
void ts_strategy_describe(const ts_strategy *s, char *buf, size_t n);

/* Training mode on (true) or off for the model and its wrappers. */
void ts_strategy_train(ts_strategy *s, bool training);
/* Forward of x (B, ...) and the mean cross-entropy over its B rows against y
 * (B) int64 with label smoothing, then backward: the model's parameters get
 * the batch's gradients (DDP: averaged over the ranks, as if the global batch
 * had run in one process). *loss (may be NULL) gets this rank's batch loss. */
ts_status ts_strategy_forward_backward(ts_strategy *s, const ts_tensor *x, const ts_tensor *y, float label_smoothing,
                                       float *loss);

/* ---- one step, and evaluation -------------------------------------------------------------------------- */
/* ts_strategy_forward_backward, then opt's step and zero_grad (the gradients
 * are cleared also when a call fails). opt must be built on the parameters of
 * ts_strategy_model(s). */
ts_status ts_train_step(ts_strategy *s, ts_optimizer *opt, const ts_tensor *x, const ts_tensor *y,
                        float label_smoothing, float *loss);

typedef struct ts_eval_result {
    int64_t samples;     /* real rows evaluated (token data: every position of each real sample) */
    int64_t correct;     /* rows whose largest logit is the label (top-1) */
    double accuracy;     /* correct / samples (NaN when no sample) */
    double loss;         /* mean cross-entropy over the samples */
    int64_t correct_top5; /* rows whose label is among the 5 largest logits (all of them below 5 classes;
                             equal logits rank the lower class first) */
    double top5_accuracy; /* correct_top5 / samples */
} ts_eval_result;

/* Evaluates m (e.g. ts_strategy_module) over one whole epoch of src (from
 * epoch 0, batch 0; padded rows are left out) in eval mode without a graph;
 * m stays in eval mode. Labels outside the logits' classes are TS_ERR_FORMAT
 * naming the row; a source without samples is TS_ERR_INVALID_ARG (an empty
 * test set is not an accuracy of 0%). */
ts_status ts_evaluate(ts_module *m, ts_batch_source *src, ts_eval_result *out);
/* ts_evaluate that also counts confusion[label * classes + prediction] (classes x classes int64,
 * zeroed first; the model's classes must be at most `classes`). */
ts_status ts_evaluate_confusion(ts_module *m, ts_batch_source *src, int64_t *confusion, int64_t classes,
                                ts_eval_result *out);

/* ---- optimizer and schedule by name ----------------------------------------------------------------- */
/* The optimizers a run can name: TS_OPTIMIZER_SGD "sgd" (momentum, L2 weight decay), TS_OPTIMIZER_ADAMW
 * "adamw" (decoupled weight decay; momentum unused). */
typedef enum ts_optimizer_kind { TS_OPTIMIZER_SGD = 0, TS_OPTIMIZER_ADAMW, TS_OPTIMIZER_COUNT } ts_optimizer_kind;
/* "sgd", "adamw" (static), NULL for another value. */
const char *ts_optimizer_kind_name(ts_optimizer_kind k);
/* The kind called name (any case); another name is TS_ERR_INVALID_ARG listing the known ones. */
ts_status ts_optimizer_kind_from_name(const char *name, ts_optimizer_kind *out);
/* An optimizer of kind k over params. */
ts_status ts_optimizer_by_kind(ts_optimizer_kind k, const ts_tensor_list *params, double lr, double momentum,
                               double weight_decay, ts_optimizer **out);
/* ts_optimizer_kind_from_name, then ts_optimizer_by_kind. */
ts_status ts_optimizer_by_name(const char *name, const ts_tensor_list *params, double lr, double momentum,
                               double weight_decay, ts_optimizer **out);
/* The names of ts_lr_kind (tessera/optim.h): TS_LR_CONSTANT "none", TS_LR_STEP "step", TS_LR_COSINE "cosine"
 * (static; NULL for another value), and back (any case; TS_ERR_INVALID_ARG listing them). */
const char *ts_lr_kind_name(ts_lr_kind k);
ts_status ts_lr_kind_from_name(const char *name, ts_lr_kind *out);
/* TS_LR_CONSTANT, TS_LR_STEP (x0.1 every steps_per_epoch steps) or TS_LR_COSINE (to 0 over total_steps). */
ts_status ts_lr_schedule_by_kind(ts_lr_kind k, double lr, int64_t total_steps, int64_t steps_per_epoch,
                                 ts_lr_schedule *out);
/* "none", "step" or "cosine": ts_lr_kind_from_name, then ts_lr_schedule_by_kind. */
ts_status ts_lr_schedule_by_name(const char *name, double lr, int64_t total_steps, int64_t steps_per_epoch,
                                 ts_lr_schedule *out);

/* ---- weights in and out ------------------------------------------------------------------------------ */
/* Appends the state dict stored at path to *out: a safetensors file (any
 * producer; F16, BF16 and F64 tensors read as float32, the other dtypes as
 * tessera/safetensors.h says) or a Tessera checkpoint's model.* tensors (the
 * prefix stripped). The format is told by the file's first bytes; *format (may
 * be NULL) gets "safetensors" or "checkpoint" (static). A checkpoint without
 * model.* tensors is TS_ERR_INVALID_ARG; a file that is neither is
 * TS_ERR_FORMAT. */
ts_status ts_weights_read(const char *path, ts_tensor_list *out, const char **format);
/* ts_weights_read, then a strict ts_module_load_state_dict into model: every
 * missing, unexpected, wrongly shaped or typed tensor is named (the message
 * starts with path) and nothing is copied unless all fit. What `tessera train
 * --init-from` and `tessera ckpt import` do (fine-tuning, not resuming: no
 * optimizer state or position is read). */
ts_status ts_weights_load(ts_module *model, const char *path);
/* ts_weights_load keeping the model's own tensors under the comma-separated prefixes `exclude`
 * ("fc": fc.weight and fc.bias; NULL: none) and ignoring the file's there: fine-tuning with a new
 * classifier (`tessera train --init-from torchvision.safetensors --init-exclude fc` on 10 classes).
 * Everything else is strict as in ts_weights_load; a prefix that matches none of the model's
 * tensors is TS_ERR_INVALID_ARG. */
ts_status ts_weights_load_except(ts_module *model, const char *path, const char *exclude);

/* ---- the trainer -------------------------------------------------------------------------------------- */
typedef enum ts_train_event_kind {
    TS_TRAIN_STEP = 0,   /* after every optimizer step */
    TS_TRAIN_EPOCH_END,  /* after an epoch (or the part of it that ran), after its evaluation */
    TS_TRAIN_CHECKPOINT, /* after a checkpoint was written */
    TS_TRAIN_EVAL,       /* on the evaluating rank (0), after an evaluation every opts.eval_every steps */
} ts_train_event_kind;

typedef struct ts_train_event {
    ts_train_event_kind kind;
    int rank;                 /* this process's rank */
    int64_t epoch, epochs;    /* 0-based epoch, and the run's epochs */
    int64_t batch;            /* batches of this epoch done (the index of the next one) */
    int64_t num_batches;      /* batches in this epoch */
    int64_t step;             /* optimizer steps done in the whole run (across resumes) */
    double loss;              /* STEP: this step's loss */
    double mean_loss;         /* mean step loss over this epoch so far */
    double lr;                /* the learning rate of the latest step */
    int64_t epoch_images;     /* images trained this epoch, over all ranks */
    double epoch_seconds;     /* training time of this epoch so far */
    const ts_eval_result *eval; /* EPOCH_END and EVAL on the evaluating rank (0) with an eval source; else NULL */
    const char *checkpoint;   /* CHECKPOINT: the path written */
    int64_t micro_batches;    /* STEP: batches accumulated into this step (opts.accum_steps, fewer at an epoch's end) */
    double grad_norm;         /* STEP: the gradients' global L2 norm before clipping (opts.clip_grad_norm; else NaN) */
    int64_t epoch_tokens;     /* token data (labels (batch, positions)): positions trained this epoch, over all
                                 ranks; 0 for other data */
} ts_train_event;

/* Called on every rank; a status other than TS_OK stops the run, which returns it. */
typedef ts_status (*ts_train_callback)(const ts_train_event *ev, void *user);

typedef struct ts_trainer_opts {
    size_t size;               /* sizeof(ts_trainer_opts) */
    unsigned int magic;        /* TS_TRAINER_OPTS_MAGIC */
    unsigned int version;      /* TS_TRAINER_OPTS_VERSION */
    int64_t epochs;            /* epochs in all (1) */
    int64_t max_steps;         /* stop after this many optimizer steps in all, resumes included (0: no limit) */
    const ts_lr_schedule *schedule; /* learning rate per step (copied; NULL: the optimizer's, constant) */
    float label_smoothing;
    ts_batch_source *eval;     /* borrowed; evaluated by rank 0 after every epoch (NULL: never) */
    const char *checkpoint;    /* rank 0 saves here after every epoch and at the end (NULL: never); copied */
    const char *checkpoint_dir; /* ...and/or a new file per save in this folder, step-<step>.ckpt (NULL: none) */
    int keep;                  /* checkpoint_dir: the newest `keep` files of this run's lineage stay, older ones of
                                * it are removed (0: all); never the file just written, never a file it cannot verify
                                * as its own or its resumed checkpoint's ancestor (src/train/ckdir.h) */
    int64_t checkpoint_every;  /* also save every this many steps (0: only at epoch ends) */
    ts_train_callback callback;
    void *user;
    /* What the checkpoint records about the run; ts_trainer_resume refuses a checkpoint whose values
     * differ (names: NULL is not recorded nor checked; batch_size 0 likewise) */
    const char *model_name, *optimizer_name; /* copied */
    uint64_t seed;             /* the data order's seed */
    int64_t batch_size;        /* rows per step on each rank */
    ts_rng *rng;               /* borrowed; its state is saved and restored (NULL: none) */
    int64_t num_classes;       /* the model's outputs when they are not the data's classes (tessera train
                                  --num-classes): recorded as train.num_classes for eval/predict/export to
                                  rebuild the model (0: not recorded; readers take data.num_classes) */
    /* Gradient accumulation: each optimizer step runs forward + backward on this many batches of the source
     * (micro-batches of batch_size), adds their gradients, divides them by the count and steps once — K
     * batches of B train as one batch of K x B would (up to rounding; not BatchNorm's batch statistics).
     * Under DDP only the last micro-batch's backward all-reduces (no_sync before). An epoch whose batch count
     * is not a multiple of K ends with a shorter step. Recorded as train.accum_steps; a resumed run must
     * use the same K. (0 or 1: every batch is a step.) */
    int64_t accum_steps;
    /* Before each optimizer step, ts_clip_grad_norm(parameters, clip_grad_norm) (0: no clipping). */
    double clip_grad_norm;
    /* Seeing inside a run (`tessera train --trace / --metrics-csv`; both copied, NULL: off).
     * trace_path: every rank records a timeline of ts_trainer_run and writes it there at the end (also
     * when the run fails, best effort) as a Chrome / Perfetto trace (chrome://tracing, ui.perfetto.dev):
     * the path itself for one process, with ".rank<R>" before the extension for several (trace.json ->
     * trace.rank0.json); `tessera trace merge` puts the ranks on one timeline. Events: each step, the
     * wait for its batches, forward, backward, the optimizer step, evaluation, checkpoints; DDP's bucket
     * all-reduces as the communication thread ran them (with bytes and bucket index); pipeline stages'
     * forward and backward of each micro-batch on the stage's lane. At most 2^20 events (later ones are
     * dropped and counted in the file). One process traces one run at a time.
     * metrics_csv: rank 0 writes one row per optimizer step, flushed as written: step, epoch (from 1),
     * loss, lr, images_per_second (this step's images over all ranks / its seconds), data_wait_share
     * (the step's share waiting for batches), allreduce_seconds (DDP: this step's bucket all-reduces;
     * else 0) after a header line; a resumed run appends to a file that starts with that header. */
    const char *trace_path, *metrics_csv;
    /* Dynamic loss scaling (float16 training; NULL: none): the trainer keeps a copy of this scaler, seeds
     * every backward with its scale (the loss itself is reported unscaled), divides the gradients by it
     * before clipping and the optimizer, skips the optimizer step when a gradient is inf or NaN (on every
     * rank alike: after DDP's all-reduce), and updates the scale (ts_grad_scaler_update). The scale and its
     * growth tracker are saved in checkpoints (train.loss_scale, train.loss_scale_tracker) and resumed.
     * Strategies none, ddp, data, model and tile; pipeline is refused. */
    const ts_grad_scaler *grad_scaler;
    /* Also evaluate (rank 0, opts.eval) every this many optimizer steps, with a TS_TRAIN_EVAL event (0: at
     * epoch ends only): a language model's validation loss during a long epoch. */
    int64_t eval_every;
} ts_trainer_opts;

#define TS_TRAINER_OPTS_MAGIC 0x7e5a7101u
#define TS_TRAINER_OPTS_VERSION 1u
#define TS_TRAINER_OPTS_INIT                                                                                   \
    ((ts_trainer_opts){sizeof(ts_trainer_opts), TS_TRAINER_OPTS_MAGIC, TS_TRAINER_OPTS_VERSION, 1, 0, NULL,   \
                       0.0f, NULL, NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0, NULL, 0, 1, 0.0, NULL, NULL, NULL, 0})

typedef struct ts_trainer ts_trainer;

/* Largest epoch, batch, step, epochs, max_steps and batch size a trainer or a
 * checkpoint may hold (2^40): far beyond any run, and far from int64 overflow. */
#define TS_TRAIN_MAX_COUNT ((int64_t)1 << 40)

/* A trainer of s with opt over train (all borrowed; they must outlive it). It
 * starts at epoch 0, batch 0, step 0 (or where ts_trainer_resume puts it).
 * Refuses a training source without samples, counts above TS_TRAIN_MAX_COUNT,
 * and (on rank 0, which saves) a checkpoint path ts_ckpt_check_writable
 * refuses: a missing directory, a device, FIFO or socket fails here, before
 * any training. */
ts_status ts_trainer_new(ts_strategy *s, ts_optimizer *opt, ts_batch_source *train, const ts_trainer_opts *o,
                         ts_trainer **out);
void ts_trainer_free(ts_trainer *t);

/* What a training checkpoint says about its run (read without loading tensors' values into a model). */
typedef struct ts_train_checkpoint_info {
    int64_t epoch, batch, step; /* where the run goes on: batch `batch` of epoch `epoch`, after `step` steps */
    int64_t seed, batch_size, world_size;
    double loss;                /* the latest step's loss */
    char model[64], optimizer[64]; /* "" when not recorded (printable: other bytes as \xNN escapes) */
    int64_t accum_steps;        /* batches per optimizer step (1 when not recorded) */
    int64_t num_classes;        /* the model's outputs (ts_train_checkpoint_classes; 0 when not recorded) */
    int64_t channels, height, width; /* one training sample's shape (0 when not recorded) */
} ts_train_checkpoint_info;
/* Reads path's run description. TS_ERR_FORMAT naming the key when it is not a training checkpoint. */
ts_status ts_train_checkpoint_read(const char *path, ts_train_checkpoint_info *out);
/* The output classes of the model a training checkpoint holds: train.num_classes (ts_trainer_opts.num_classes)
 * when recorded, else data.num_classes (the training data's); false when it records neither. */
bool ts_train_checkpoint_classes(const ts_ckpt *ck, int64_t *classes);

/* ---- a checkpoint's model -------------------------------------------------------------------------------- */
/* The model a checkpoint holds and what it was trained on: what `tessera eval`, `predict`, `export`,
 * `ckpt import` and `train --resume` read and write (the layout is the trainer's: src/train/ckpt_keys.h). */
typedef struct ts_checkpoint_model_info {
    char model[64];          /* the zoo name (ts_model_info) */
    int64_t num_classes;     /* the model's outputs */
    int image_size;          /* what ts_data_opts.image_size and ts_data_preprocess take: 0 for the reference
                                models' fixed 28x28 gray input, else the RGB side the model was trained at */
    int64_t channels, height, width; /* one training sample's shape (the model's input when not recorded) */
    /* The class names (image folders' sub-folder names: the data's classes, which may be fewer than the
     * model's), owned by the info (ts_checkpoint_model_info_clear frees them); NULL and 0 when the
     * checkpoint records none (IDX files). */
    char **class_names;
    int64_t num_class_names;
    int64_t seq_len;         /* a language model (a GPT): its context length, the token data's rows; 0 otherwise */
} ts_checkpoint_model_info;
/* The name of class k: its recorded name, else "class K" written into buf (n bytes). */
const char *ts_checkpoint_class_name(const ts_checkpoint_model_info *info, int64_t k, char *buf, size_t n);
void ts_checkpoint_model_info_clear(ts_checkpoint_model_info *info);

/* Reads path's model: builds the zoo model the checkpoint names with its class count (older checkpoints
 * without one: the rows of the output layer) and loads its state dict strictly, in eval mode, on the CPU.
 * model (may be NULL): the model the caller expects; the checkpoint's must be the same (TS_ERR_INVALID_ARG
 * naming both), and it names the model of a checkpoint that records none (TS_ERR_FORMAT when neither
 * does). *out (may be NULL: the info alone, without building anything) gets the model; info (may be NULL)
 * what the checkpoint says (clear it with ts_checkpoint_model_info_clear, also after an error). Errors start
 * with path. */
ts_status ts_checkpoint_model_load(const char *path, const char *model, ts_module **out,
                                   ts_checkpoint_model_info *info);
/* The model `tessera export` writes and an example input for tracing it: the checkpoint's model
 * (ts_checkpoint_model_load; model, when not NULL, must be its model) or, without a checkpoint, the zoo's
 * `model` with fresh weights from seed; the example is float32 N(0, 1) values from seed + 1 of shape[0..ndim)
 * (ndim 0: 1 x the checkpoint's recorded input, else the model's: 1x1x28x28, 1x3x224x224). Both new; nothing
 * is left on failure. *name (may be NULL) gets the model's zoo name (static). */
ts_status ts_export_model_new(const char *checkpoint, const char *model, uint64_t seed, int ndim,
                              const int64_t *shape, ts_module **m, ts_tensor **example, const char **name);
/* Writes a checkpoint that holds model's state dict and info's name, classes, input shape (channels, height,
 * width; 0: the zoo's input for info->model and image_size) and class names (NULL: none), atomically:
 * what ts_checkpoint_model_load, `tessera eval/predict/export` and `train --init-from` read. */
ts_status ts_checkpoint_model_save(const char *path, ts_module *model, const ts_checkpoint_model_info *info);
/* `tessera ckpt import`: builds the zoo model `model` with num_classes outputs — 0: as many as the file's
 * output layer has rows (fc.weight for the ResNets, the last Linear's weight for cnn and mlp), else the
 * model's default —, loads the weights at path into it strictly (ts_weights_load: a safetensors file or a
 * checkpoint) and writes them with ts_checkpoint_model_save to out, recording image_size (0: the model's
 * default). written (may be NULL) gets what was recorded (no class names: nothing to clear), *ntensors (may
 * be NULL) the tensors written. Nothing is written unless every tensor fits. */
ts_status ts_checkpoint_import(const char *path, const char *model, int64_t num_classes, int image_size,
                               const char *out, ts_checkpoint_model_info *written, int *ntensors);

/* The newest complete training checkpoint in dir (a checkpoint_dir: step-<step>.ckpt files) into path
 * (n bytes), for restarts (`tessera train --checkpoint-dir`): of the checkpoints whose metadata reads, the
 * lineage (train.lineage) of the session that started last, and its highest step whose file loads whole
 * (whole-file CRC) and is a training checkpoint — not the highest number in a name. Damaged files, FIFOs,
 * links and other non-files are skipped with a warning naming them; checkpoints of other runs or branches
 * are counted in one warning. *found false (and TS_OK) when there is none or dir does not exist. */
ts_status ts_train_checkpoint_latest(const char *dir, char *path, size_t n, bool *found);

/* Continues the run saved at path: loads the model's state dict, the
 * optimizer's state and the rng, and positions the trainer (and the train
 * source) where the run stopped, so the rest of the run is bit-identical to an
 * uninterrupted one. Checks first, changing nothing on error: the checkpoint's
 * model and optimizer names, seed and global batch (batch size x world size)
 * must be this run's (TS_ERR_INVALID_ARG naming both values); its epoch, batch
 * and step must be in [0, TS_TRAIN_MAX_COUNT], every floating-point tensor
 * finite, and the optimizer state complete (ts_optimizer_check_state) —
 * TS_ERR_FORMAT naming the key (names from the file printed with \xNN escapes).
 * The world size may differ when the global batch is the same: the dataset
 * source's global batch k holds the same samples for any world size, so a run
 * saved by 2 ranks at 32 each goes on in one process at 64 (or 4 ranks at 16).
 * Every rank calls it. */
ts_status ts_trainer_resume(ts_trainer *t, const char *path);
/* Writes a training checkpoint of the current state to path (atomically: a
 * crash leaves the old file or the new one). Any rank may call it. */
ts_status ts_trainer_save(ts_trainer *t, const char *path);

typedef struct ts_train_result {
    int64_t steps;             /* optimizer steps in all (across resumes) */
    int64_t epochs;            /* epochs completed */
    int64_t images;            /* images trained in this call, over all ranks */
    double train_seconds;      /* time spent training in this call (not evaluating or saving) */
    double images_per_second;  /* images / train_seconds */
    double final_loss;         /* the latest step's loss (NaN when none ran) */
    ts_eval_result eval;       /* the latest evaluation on rank 0 (samples 0 when none) */
    int64_t skipped_steps;     /* loss scaling: optimizer steps skipped for inf/NaN gradients in this call */
    float loss_scale;          /* loss scaling: the scale after the last step (0 without a scaler) */
    int64_t skipped_samples;   /* training samples this rank's source left out as corrupt in this call */
    int64_t tokens;            /* token data: positions trained in this call, over all ranks (0 otherwise) */
    double tokens_per_second;  /* tokens / train_seconds */
} ts_train_result;

/* Trains until the last epoch or max_steps: every step sets the scheduled
 * learning rate and runs ts_train_step; at each epoch end rank 0 evaluates and
 * saves the checkpoint. A loss that stops being finite fails the run
 * (TS_ERR_STATE naming the step). out (may be NULL) gets the figures; on rank
 * 0 it holds an evaluation also when no epoch ended in this call. */
ts_status ts_trainer_run(ts_trainer *t, ts_train_result *out);

/* Where the trainer stands. */
int64_t ts_trainer_step(const ts_trainer *t);
int64_t ts_trainer_epoch(const ts_trainer *t);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_TRAIN_H */
