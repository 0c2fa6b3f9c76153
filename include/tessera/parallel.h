/*
 * tessera/parallel.h — one process, many devices: the data-parallel
 * primitives of torch.nn.parallel (replicate, scatter, gather,
 * parallel_apply, data_parallel, DataParallel), model parallelism in depth,
 * pipeline parallelism (GPipe and 1F1B schedules) and tile (spatial)
 * parallelism.
 *
 * Devices are "cpu", the virtual CPU devices "cpu:0".."cpu:N-1" (see
 * tessera/core.h: each has its own memory and its own worker thread, so
 * replicas really run at the same time) and, later, "cuda:K". Autograd follows
 * tensors across devices: every function here records what backward needs, so
 * a loss computed on one device sends gradients back to every device that
 * took part.
 *
 * Wrapper modules (DataParallel, ModelParallel, PipelineParallel, TileParallel) take
 * ownership of the module they wrap and hold it as their child "module", so
 * their state-dict keys are the wrapped model's prefixed with "module." (as
 * PyTorch's DataParallel); ts_module_child(wrapper, "module") is the plain model.
 * Their forward takes an input on any device and returns the output on the
 * output device they were given.
 *
 * Sections of this header are filled in by the engineers building each part;
 * every declaration here is implemented and tested.
 */
#ifndef TESSERA_PARALLEL_H
#define TESSERA_PARALLEL_H

#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- data-parallel primitives ------------------------------------------------------------------ */
/* torch.nn.parallel in C (seed 002): the batch is split along dim 0, every
 * device runs a replica of the module on its share, and the outputs are
 * concatenated on one device. The primitives can be used on their own and
 * compose exactly as PyTorch's data_parallel():
 *
 *   ts_replicate(model, devs, n, replicas);          parameters broadcast (with autograd)
 *   ts_scatter(x, devs, n, chunks, &m);              m <= n chunks of x
 *   ts_parallel_apply(replicas, chunks, devs, m, outs);
 *   ts_gather(outs, m, devs[0], &y);                 backward: scatter, then sum into model
 *
 * ts_data_parallel / the DataParallel module do the same in ONE autograd node
 * whose backward runs the replicas' backward passes concurrently, each on its
 * device's worker thread, and sums their parameter gradients into the model's
 * (the composition above gives the same gradients, with a serial backward).
 *
 * Devices: every function takes devs[0..n) (borrowed, non-NULL, each at most
 * once: a duplicate is TS_ERR_INVALID_ARG naming it). The module must have all
 * its parameters and buffers on devs[0] (PyTorch's rule; otherwise
 * TS_ERR_DEVICE naming the first tensor elsewhere and both devices).
 *
 * Replicas: a replica is a module tree of the same types whose tensors live on
 * its device; it borrows its source's configuration (layer types and sizes), so
 * free replicas with ts_module_free before the source. BatchNorm2d in training
 * mode: each replica normalises its own chunk with its chunk's statistics; the
 * running statistics of the replica on devs[0] are the source's own buffers, so
 * they are updated from devs[0]'s chunk only, and the other replicas' updates
 * are dropped with the replicas (exactly PyTorch's DataParallel). Dropout
 * layers draw from the generator they were given, which the replicas share, so
 * a module with a Dropout in training mode runs its replicas' forwards one after
 * another (their backward still runs concurrently). */

/* torch.chunk's split of size rows into at most `chunks` pieces: pieces of
 * ceil(size / chunks) rows, the last one smaller, so there may be fewer pieces
 * than asked (10 over 4 -> 3, 3, 3, 1; 2 over 4 -> 1, 1; 6 over 4 -> 2, 2, 2).
 * size 0 gives `chunks` empty pieces (as torch.chunk). Writes the sizes to
 * sizes[0..count) (sizes has room for `chunks`) and returns count (0 when
 * chunks < 1 or size < 0). */
int ts_chunk_sizes(int64_t size, int chunks, int64_t *sizes);

/* replicate: replicas[i] (a new module owned by the caller) is a copy of
 * module on devs[i]. Its parameters are not leaves but copies recorded by
 * autograd (PyTorch's Broadcast; the replica on devs[0] uses the parameters
 * themselves), so a backward through any replica sums gradients into the
 * module's parameters. Buffers are copied (devs[0]'s replica shares the
 * module's own). With grad mode off nothing is recorded (torch's detach).
 * A replica serves one forward/backward, as in PyTorch, where DataParallel
 * replicates on every call. On failure no replica is left (replicas[i] NULL). */
ts_status ts_replicate(ts_module *module, ts_device *const *devs, int n, ts_module **replicas);

/* scatter: splits x (any device, ndim >= 1) along dim 0 with ts_chunk_sizes
 * and copies chunk i to devs[i]: chunks[i] for i < *count (new references;
 * chunks has room for n; entries from *count on are set to NULL). Backward
 * gathers the chunks' gradients back into x's gradient on x's device. A batch
 * of 0 gives n empty chunks (0, ...), one per device. A 0-dimensional x is
 * TS_ERR_SHAPE. */
ts_status ts_scatter(const ts_tensor *x, ts_device *const *devs, int n, ts_tensor **chunks, int *count);

/* gather: concatenates xs[0..n) (any devices, same dtype, same shape except
 * dim 0) along dim 0 on dev; *out is new. Backward splits the gradient and
 * sends each part back to its input's device. If every input is
 * 0-dimensional they are gathered as a vector of n (PyTorch warns and does
 * the same). */
ts_status ts_gather(ts_tensor *const *xs, int n, ts_device *dev, ts_tensor **out);

/* parallel_apply: outputs[i] = modules[i](inputs[i]) for i < n, each run as a
 * task on devs[i]'s worker thread, all at the same time (ts_device_run_parallel),
 * with the caller's grad mode. devs NULL: each input's own device. inputs[i]
 * must already be on devs[i] (else TS_ERR_DEVICE naming both). The first
 * failure by index is returned, its message prefixed "<device>: replica <i>:",
 * and then no output is left (all NULL). Autograd is recorded as usual; a later
 * ts_backward runs through the replicas on the calling thread. */
ts_status ts_parallel_apply(ts_module *const *modules, ts_tensor *const *inputs, ts_device *const *devs, int n,
                            ts_tensor **outputs);

/* data_parallel: module(x) evaluated in parallel over devs[0..n) — seed 002's
 *   replicate + scatter + parallel_apply + gather, with the output on
 *   output_device (NULL: devs[0]); x may be on any device. Records one autograd
 *   node (inputs: x and the module's parameters) whose backward runs every
 *   replica's backward on its own device's worker at the same time and hands
 *   the sum of the replicas' parameter gradients to the module's parameters
 *   (on devs[0]) and the input gradient to x's device. Uses only as many
 *   devices as there are chunks (a batch of 3 over 4 devices uses 3). n == 1
 *   runs the module directly on devs[0] (PyTorch does the same). *out is new. */
ts_status ts_data_parallel(ts_module *module, const ts_tensor *x, ts_device *const *devs, int n,
                           ts_device *output_device, ts_tensor **out);

/* DataParallel(module, device_ids=devs, output_device): takes ownership of
 * module (freed on failure too), moves it to devs[0] and holds it as child
 * "module"; its forward is ts_data_parallel. Its parameters are the module's,
 * so an optimizer built on ts_module_parameters(wrapper) trains the module;
 * state-dict keys are "module.<name>". devs is copied (at most 64 devices).
 * With one device it is the module run on that device. */
ts_status ts_nn_data_parallel_new(ts_module *module, ts_device *const *devs, int n, ts_device *output_device,
                                  ts_module **out);

/* ---- model parallelism ------------------------------------------------------------------------- */
/* Model parallelism in depth (seeds 001 and 002): each device holds different
 * layers; activations cross devices at stage boundaries (real copies, recorded
 * by autograd, so gradients flow back across them). One device works at a
 * time; what it buys is memory (see pipeline parallelism for overlap). */

/* ToDevice(dev): a parameter-free module whose forward is ts_to_device(x, dev)
 * (x itself when already there), e.g. seed 001's "Embedding on the CPU, the
 * rest on another device":
 *   Sequential(Embedding (on cpu), ToDevice(cpu:1), Linear (moved to cpu:1)). */
ts_status ts_nn_to_device_new(ts_device *dev, ts_module **out);

/* ModelParallel(seq): takes ownership of the Sequential seq (freed on failure
 * too) and holds it as child "module" (state-dict keys "module.<i>..."). Stage
 * i is seq's children [bounds[i-1], bounds[i]) (bounds[-1] = 0), placed on
 * devs[i]; bounds has n strictly increasing entries ending at the number of
 * children. bounds NULL: split by parameter count, the contiguous split that
 * minimises the largest stage's parameter count (ties: later boundaries), every
 * stage non-empty. Forward moves x to devs[0], runs the stages in order moving
 * the activation to the next stage's device at each boundary, and moves the
 * result to output_device (NULL: the last stage's device). Devices may repeat.
 * Errors: not a Sequential, fewer children than devices, bad bounds
 * (TS_ERR_INVALID_ARG naming them). */
ts_status ts_nn_model_parallel_new(ts_module *seq, ts_device *const *devs, int n, const int *bounds,
                                   ts_device *output_device, ts_module **out);
/* The stage boundaries of a ModelParallel module: writes min(n, max) entries of
 * bounds (as above) and returns the number of stages n, or -1 when mp is not a
 * ModelParallel module. */
int ts_model_parallel_bounds(const ts_module *mp, int *bounds, int max);

/* ---- pipeline parallelism ---------------------------------------------------------------------- */
/* ts_pp_* (after torch's Pipe) — not the data pipelines of tessera/pipeline.h (ts_pipeline_*, DALI's).
 *
 * A Sequential cut into consecutive stages, stage s on devs[s], and every
 * batch cut into micro-batches with torch.chunk's rule: micro-batches of
 * ceil(B / micro_batches) samples, the last one smaller, so a batch of B gives
 * ceil(B / ceil(B / micro_batches)) of them — fewer than asked when the count
 * does not divide B or exceeds it (B = 10, 3 -> 4, 4, 2; B = 5, 8 -> five of 1).
 *
 * Each stage runs on its device's worker thread (one task per stage and step,
 * ts_device_submit), so stage s works on micro-batch i while stage s+1 works on
 * micro-batch i-1; activations and their gradients cross stage boundaries as
 * real copies (ts_to_device). Every stage device must have a worker (a virtual
 * CPU device "cpu:K", later "cuda:K"; not "cpu") and appear once. Do not call a
 * pipeline from inside a task running on one of its stage devices.
 *
 * Schedules (the order each stage runs the forward F i and backward B i of its
 * micro-batches; ts_pp_trace records the order that really ran):
 *   TS_PP_GPIPE  fill-drain (GPipe): F 0 .. F m-1, then B m-1 .. B 0.
 *                      Every stage holds the activations of all m micro-batches.
 *   TS_PP_1F1B   PipeDream-flush: stage s (0-based) runs w = min(p-1-s, m)
 *                      warm-up forwards, then alternates F w+k, B k, then the
 *                      remaining backwards; it holds at most p - s micro-batches'
 *                      activations at a time instead of m.
 * With balanced stages both leave (p-1)/(m+p-1) of the stage-time idle (the bubble).
 *
 * BatchNorm2d in training mode normalises each micro-batch with its own
 * statistics and updates its running statistics once per micro-batch (as
 * torch's Pipe and GPipe do), so a model with BatchNorm trains like one device
 * at the micro-batch size, not at the full batch. Everything else — the loss,
 * every parameter's gradient — equals one device at the full batch. */
#define TS_PP_MAX_STAGES TS_MAX_CPU_DEVICES

typedef enum ts_pp_schedule { TS_PP_GPIPE = 0, TS_PP_1F1B = 1 } ts_pp_schedule;

/* "gpipe" or "1f1b" (case-insensitive); anything else is TS_ERR_INVALID_ARG naming it. */
ts_status ts_pp_schedule_parse(const char *name, ts_pp_schedule *out);
/* "gpipe" or "1f1b" (static string). */
const char *ts_pp_schedule_name(ts_pp_schedule s);

/* Wraps seq (a Sequential; ownership taken, also on failure) into a pipeline
 * module ("PipelineParallel") of nstages stages: stage s gets seq's children [bounds[s-1], bounds[s])
 * (bounds[-1] = 0; nstages strictly increasing entries ending at the number of
 * children, as ts_nn_model_parallel_new; NULL: as equal layer counts as
 * possible, the first stages taking the remainder — ts_pp_split_by_time gives a
 * split by measured cost) and its parameters and buffers are moved to devs[s]
 * (borrowed).
 *
 * seq may also be a GPT (ts_model_gpt): bounds then count its blocks
 * (transformer.h.<i>; NULL: equal counts), the embedding (wte, wpe, dropout)
 * runs on the first stage and ln_f with the tied head on the last, each stage
 * needs at least one block, and the GPT's state dict keeps its own names. The
 * head multiplies by its own copy of transformer.wte.weight, made on the last
 * stage's device at the start of each ts_pp_train_step; its gradient is added
 * into wte's when every stage's backward has finished (two stages never
 * accumulate into one tensor at once). Targets are then (B, T), logits (B, T, V).
 *
 * micro_batches >= 1 is
 * the count each batch is cut into. Do not ts_module_to the pipeline afterwards.
 * output_device (NULL: the last stage's device) is where ts_module_forward
 * returns the output. The wrapper holds seq as its child "module".
 *
 * ts_module_forward(pipe, x, &y): x (B, ...) on any device; every micro-batch
 * runs through the stages (forwards only, in micro-batch order) and y is the
 * concatenation on output_device. Autograd is recorded across all stages as
 * usual when grad mode is on, so forward + loss + ts_backward trains with the
 * GPipe schedule's forward and a plain (single-threaded) backward; evaluation
 * runs it under no-grad. */
ts_status ts_nn_pipeline_parallel_new(ts_module *seq, ts_device *const *devs, int nstages, const int *bounds,
                                      int micro_batches, ts_pp_schedule schedule, ts_device *output_device,
                                      ts_module **out);

/* One training step with the pipeline's schedule: forward of every
 * micro-batch, the mean cross-entropy over the whole batch (micro-batch i's
 * mean loss weighted by its size / B — by its share of the counted targets
 * when some are ignore_index -100 — so the loss and gradients equal the full
 * batch's) and the backward, each stage backpropagating on its own worker: its
 * input is a detached leaf, ts_backward(stage output, gradient from the next
 * stage) leaves the input's gradient, which is copied to the previous stage.
 * x: (B, ...) any device; y: (B) TS_I64, any device — or (B, T...) for a
 * sequence model whose logits are (B, T..., V): every position is a row, as in
 * the trainer's loss. Gradients are added to
 * the parameters' .grad (zero them between steps); *loss gets the batch loss.
 * On failure the error names the stage, device, pass and micro-batch, and the
 * gradients are partial. */
ts_status ts_pp_train_step(ts_module *pipe, const ts_tensor *x, const ts_tensor *y, float label_smoothing,
                           float *loss);

/* Measurements of the pipeline's most recent run (a forward or a train step). */
typedef struct ts_pp_stats {
    int stages;                      /* p */
    int micro_batches;               /* m: micro-batches the last batch was cut into */
    ts_pp_schedule schedule;
    bool train;                      /* the run was a ts_pp_train_step */
    int layers[TS_PP_MAX_STAGES]; /* number of the Sequential's children (a GPT's blocks) in each stage */
    double wall_s;                   /* from submitting the stages' tasks to the last one finishing */
    double busy_s[TS_PP_MAX_STAGES]; /* per stage: time computing (forward, loss, backward, copies) */
    double bubble;                   /* measured idle fraction: 1 - sum(busy_s) / (p * wall_s) */
    double bubble_ideal;             /* (p - 1) / (m + p - 1): balanced stages, no overheads */
    /* per stage, train steps: most micro-batches forwarded and not yet backwarded
     * at one time (GPipe: m; 1F1B: min(m, p - s)); 0 after a forward */
    int peak_in_flight[TS_PP_MAX_STAGES];
    /* per stage: the stage device's memory peak during the run above what was
     * allocated when it started (activations, their copies, gradients) */
    size_t peak_bytes[TS_PP_MAX_STAGES];
} ts_pp_stats;

/* Copies the stats of pipe's most recent run (the measurements are zero before the first). */
ts_status ts_pp_get_stats(const ts_module *pipe, ts_pp_stats *out);

/* Writes the events stage `stage` ran in its most recent run, in the order they
 * ran, as "F0 F1 B1 B0" into buf (n bytes); TS_ERR_INVALID_ARG if it does not fit. */
ts_status ts_pp_trace(const ts_module *pipe, int stage, char *buf, size_t n);

/* Bounds for ts_nn_pipeline_parallel_new by measured cost (torchgpipe's
 * balance_by_time): runs each child of seq forward and backward on sample
 * (borrowed; copied to each child's parameters' device) on the calling thread,
 * keeps each child's fastest of 3 timings and writes into bounds[0..nstages)
 * the contiguous split whose most expensive stage is cheapest. Call it with as
 * many threads as one stage will have (ts_set_num_threads) and a micro-batch
 * sized sample. Buffers (BatchNorm running statistics) and gradients are
 * restored afterwards. Timings vary from run to run, and so may the split;
 * the results of training do not depend on it. */
ts_status ts_pp_split_by_time(ts_module *seq, const ts_tensor *sample, int nstages, int *bounds);

/* ---- tile (spatial) parallelism ---------------------------------------------------------------- */
/* TileParallel: the convolutional part of a network runs on horizontal bands of
 * the image ("tiles", split along H only; every tile has the full width), one
 * band per device, and the result EQUALS the untiled network's — output, loss,
 * input gradient and every parameter gradient — up to float rounding (the
 * tests see <= 1e-5). The tile-parallel example of seed 002, with its
 * "boundary conditions" handled:
 *
 *   - seq must be a Sequential (nested Sequentials are walked). Its leading
 *     layers form the tiled stack: Conv2d (any kernel, stride, padding,
 *     dilation, groups), MaxPool2d (any kernel, stride, padding, dilation,
 *     ceil_mode), AvgPool2d (ceil_mode off), BatchNorm2d and ReLU. The stack
 *     ends at the first Flatten or AdaptiveAvgPool2d: from there on (the
 *     "head", e.g. Flatten + Linear layers) the layers run untiled on
 *     output_device after the tiles are gathered. Any other layer type in the
 *     stack (Dropout, SyncBatchNorm, a residual block, ...) is an error
 *     (TS_ERR_UNSUPPORTED) naming it. With no head, the output is the gathered
 *     feature map.
 *   - Halo exchange: before each Conv2d / pooling layer every tile fetches the
 *     rows its windows need from the tiles that own them (computed from kernel,
 *     stride, dilation and padding; src/parallel/tile.c has the arithmetic);
 *     zero padding (-inf for max pooling) is added only at the image's true top
 *     and bottom. The fetches are autograd-recorded slices, concats and
 *     ts_to_device copies, so a halo row's gradient flows back to the tile that
 *     owns it.
 *   - Parameters: the model lives on output_device (moved there by this call);
 *     each forward copies the stack's parameters to the tile devices with
 *     ts_to_device, so backward sums every tile's weight gradient into the
 *     model's own parameters. An optimizer built on ts_module_parameters(wrapper)
 *     (after this call) trains the model.
 *   - BatchNorm2d in training mode (or without running stats) normalises with
 *     statistics over the WHOLE batch and image: per-tile counts, means and
 *     squared deviations are combined across tiles (Chan's pairwise update, in
 *     tile order), running statistics are updated once per forward as
 *     BatchNorm2d does, and backward includes every tile's contribution to the
 *     shared mean and variance. In eval mode the running statistics are used.
 *   - Threads: in forward, the tiles of each layer run concurrently on their
 *     devices' worker threads (ts_device_run_parallel; one round per layer, two
 *     for BatchNorm2d, with the halo exchange at the start of each round).
 *     Backward runs on the calling thread (the engine is single-threaded), each
 *     kernel on its tensors' device memory.
 *   - Heights: the input's height H must be >= n (else TS_ERR_SHAPE naming
 *     both); rows are split as evenly as possible (tile t gets rows
 *     [t*H/n, (t+1)*H/n)). Each output row of a layer goes to the tile that owns
 *     the centre of its window, so when the image shrinks deeper in the net
 *     (strided layers) a tile can end up with no rows: it then drops out for the
 *     rest of the stack and fewer tiles carry on (never an error). n = 1 runs
 *     the whole stack on devs[0].
 *   - The same device may appear more than once in devs (its tiles then run one
 *     after another on its worker); "cpu" runs its tiles inline.
 *
 * devs: n >= 1 borrowed devices (the tiles' devices, top band first);
 * output_device: where the model lives, where the head runs and where the
 * output is returned (NULL: devs[0]). Takes ownership of seq, also on failure
 * (then seq is freed). *out is the wrapper ("TileParallel", child "module" =
 * seq); the forward's input may be on any device, (N, C, H, W) float32. */
ts_status ts_nn_tile_parallel_new(ts_module *seq, ts_device *const *devs, int n, ts_device *output_device,
                                  ts_module **out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_PARALLEL_H */
