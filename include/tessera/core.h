/*
 * tessera/core.h — status codes, errors, dtypes, devices, threads, random numbers.
 *
 * Conventions for the whole public API:
 *   - Every call that can fail returns a ts_status (TS_OK == 0, errors < 0) and
 *     writes results through out-parameters. On failure, ts_last_error() gives a
 *     thread-local message with context (file, shape, rank, ...).
 *   - Objects are opaque handles. A function returning a new object through an
 *     out-parameter hands the caller one reference, released with the type's
 *     _release (or _free for non-refcounted objects). Borrowed pointers say so.
 *   - The library never calls exit() and never prints except through the logger.
 */
#ifndef TESSERA_CORE_H
#define TESSERA_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_VERSION_MAJOR 0
#define TS_VERSION_MINOR 1
#define TS_VERSION_PATCH 0

/* ---- status codes ------------------------------------------------------- */
typedef enum ts_status {
    TS_OK = 0,
    TS_ERR_INVALID_ARG = -1, /* a bad argument: NULL, out of range, wrong flag */
    TS_ERR_SHAPE = -2,       /* tensor shapes do not fit together */
    TS_ERR_DTYPE = -3,       /* unsupported or mismatched dtype */
    TS_ERR_DEVICE = -4,      /* tensors on different devices, unknown device */
    TS_ERR_NOMEM = -5,       /* allocation failed */
    TS_ERR_IO = -6,          /* a file could not be opened, read or written */
    TS_ERR_FORMAT = -7,      /* a file is malformed, truncated or corrupt */
    TS_ERR_STATE = -8,       /* call not valid in the current state */
    TS_ERR_UNSUPPORTED = -9, /* a feature that this build or device lacks */
    TS_ERR_TIMEOUT = -10,    /* an operation did not finish in time */
    TS_ERR_REMOTE = -11,     /* a peer process failed or disconnected */
    TS_ERR_INTERNAL = -12,   /* a bug in Tessera */
} ts_status;

/* Short name ("TS_ERR_SHAPE") and description of a status. Static strings. */
const char *ts_status_name(ts_status s);
const char *ts_status_str(ts_status s);
/* The last error message set on this thread (never NULL; "" when none). */
const char *ts_last_error(void);
/* Sets the thread-local error message and returns s, for libraries built on Tessera. */
ts_status ts_error(ts_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ts_clear_error(void);

/* ---- logging --------------------------------------------------------------- */
typedef enum ts_log_level { TS_LOG_DEBUG = 0, TS_LOG_INFO, TS_LOG_WARN, TS_LOG_ERROR, TS_LOG_OFF } ts_log_level;
typedef void (*ts_log_fn)(ts_log_level level, const char *msg, void *user);
/* Default level comes from TS_LOG_LEVEL (debug|info|warn|error|off), else warn. */
void ts_log_set_level(ts_log_level level);
ts_log_level ts_log_get_level(void);
/* Replace the sink (default: stderr). fn == NULL restores the default. */
void ts_log_set_sink(ts_log_fn fn, void *user);
void ts_log(ts_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- dtypes ------------------------------------------------------------------ */
typedef enum ts_dtype {
    TS_F32 = 0,
    TS_F16 = 1,  /* IEEE binary16: storage, conversions (ts_to_dtype), checkpoints */
    TS_BF16 = 2, /* bfloat16: storage, conversions (ts_to_dtype), checkpoints, DDP's bf16 all-reduce */
    TS_I64 = 3,  /* indices and labels */
    TS_I32 = 4,
    TS_U8 = 5,
    TS_DTYPE_COUNT
} ts_dtype;
size_t ts_dtype_size(ts_dtype dt);
const char *ts_dtype_name(ts_dtype dt); /* "float32", "bfloat16", ... */
/* A dtype from its name: float32|f32|fp32, float16|f16|fp16|half, bfloat16|bf16, int64, int32, uint8
 * (TS_ERR_INVALID_ARG naming the string otherwise). */
ts_status ts_dtype_parse(const char *name, ts_dtype *out);
/* F32, F16 or BF16. */
bool ts_dtype_is_float(ts_dtype dt);

/* Float32 <-> bfloat16 / float16, one value: round to nearest, ties to even (PyTorch's and the
 * hardware's rounding); overflow gives infinity; NaN stays NaN. 16 bits to float32 is exact. */
uint16_t ts_f32_to_bf16(float f);
float ts_bf16_to_f32(uint16_t h);
uint16_t ts_f32_to_f16(float f);
float ts_f16_to_f32(uint16_t h);
/* n values from src (dtype from) to dst (dtype to), both F32, F16 or BF16 (TS_ERR_DTYPE otherwise);
 * the same dtype copies. Host memory; buffers must not overlap. */
ts_status ts_convert(void *dst, ts_dtype to, const void *src, ts_dtype from, size_t n);

/* ---- devices ------------------------------------------------------------------- */
typedef struct ts_device ts_device; /* owned by the registry; never freed by users */
typedef enum ts_device_type { TS_DEVICE_CPU = 0, TS_DEVICE_CUDA = 1 } ts_device_type;

/* The host CPU device ("cpu"). Borrowed. */
ts_device *ts_device_cpu(void);
/* Look up a device by name ("cpu", "cpu:1", "cuda:0", ...). *out is borrowed. */
ts_status ts_device_get(const char *name, ts_device **out);
const char *ts_device_name(const ts_device *d);
ts_device_type ts_device_type_of(const ts_device *d);
/* N of "cuda:N" and "cpu:N"; -1 for the host "cpu". */
int ts_device_index(const ts_device *d);
/* Waits until all work queued on the device (its stream) is done. */
ts_status ts_device_synchronize(ts_device *d);
/* Returns cached free blocks of the device's allocator to the system. */
void ts_device_empty_cache(ts_device *d);
/* Bytes currently allocated to live tensors and peak since start/reset. */
size_t ts_device_memory_allocated(const ts_device *d);
size_t ts_device_memory_peak(const ts_device *d);
void ts_device_memory_reset_peak(ts_device *d);
/* Bytes the device's allocator holds from the system: live tensors plus its cache of freed blocks
 * (torch.cuda.memory_reserved). */
size_t ts_device_memory_reserved(const ts_device *d);
/* One line about the device: "NVIDIA H200, 139.8 GiB, compute capability 9.0, 132 multiprocessors",
 * "host CPU, 2 cores", ... */
void ts_device_describe(const ts_device *d, char *buf, size_t len);

/* CUDA devices "cuda:0" ... "cuda:N-1" ("cuda" is cuda:0) exist when Tessera was built with CUDA
 * (TS_CUDA) and the driver reports GPUs; each is created on its first ts_device_get. Returns N; when
 * it is 0, why (may be NULL) says why: built without CUDA, no driver, no GPU. */
int ts_cuda_device_count(char *why, size_t why_len);

/* Virtual CPU devices "cpu:0" ... "cpu:N-1": each has its own memory pool and
 * accounting (a tensor moved between two of them is a real copy, and ops refuse
 * to mix them, exactly as with GPUs) and its own worker thread, the device's
 * stream, so work submitted to different devices runs at the same time. Work
 * submitted to a device's stream runs its kernels with that device's thread
 * budget (below); ops called on the caller's own thread use the caller's.
 * N comes from TS_CPU_DEVICES (default 2, at most TS_MAX_CPU_DEVICES) or from
 * ts_set_cpu_device_count before the first virtual device is used. */
#define TS_MAX_CPU_DEVICES 16
ts_status ts_set_cpu_device_count(int n); /* TS_ERR_STATE once a virtual device exists */
int ts_cpu_device_count(void);
/* Kernel threads each virtual CPU device's worker uses (default: cores / N, at least 1;
 * TS_CPU_DEVICE_THREADS overrides). Takes effect for workers started afterwards. */
void ts_set_cpu_device_threads(int n);
int ts_cpu_device_threads(void);
/* Parses a comma-separated device list ("cpu:0,cpu:1"); *out gets up to max borrowed devices. */
ts_status ts_device_list_parse(const char *list, ts_device **out, int max, int *count);

/* Streams: every device runs submitted tasks in FIFO order on its own worker
 * thread ("cpu", which has no worker, runs them inline in ts_device_submit).
 * A task's ts_status and error message come back through ts_task_wait. */
typedef struct ts_task ts_task;
typedef ts_status (*ts_task_fn)(void *arg);
/* Queues fn(arg) on d; *out (required) is waited on and freed by the caller. */
ts_status ts_device_submit(ts_device *d, ts_task_fn fn, void *arg, ts_task **out);
/* Waits for the task; returns its status (and sets this thread's error message to the task's). */
ts_status ts_task_wait(ts_task *t);
void ts_task_free(ts_task *t); /* waits first; NULL is fine */
/* Runs fn(args[i]) on devs[i] for i < n concurrently, waits for all and returns
 * the first failure (by index), its message prefixed with the device name. */
ts_status ts_device_run_parallel(ts_device *const *devs, int n, ts_task_fn fn, void *const *args);

/* ---- threads ----------------------------------------------------------------------- */
/* Number of CPU threads for kernels and BLAS, on the calling thread. The default: OMP_NUM_THREADS, else
 * the CPUs this process may run on; a rank of a launched job (torchrun, tessera run, mpirun, srun:
 * ts_pg_new finds their variables) gets its share of them, CPUs / ranks on this host, from the moment it
 * creates its first process group. ts_set_num_threads and OMP_NUM_THREADS both win over that share. */
void ts_set_num_threads(int n);
int ts_get_num_threads(void);

/* Threads that keep their speed on a busy machine: sets OMP_WAIT_POLICY=passive in this process's
 * environment unless it is set (OpenMP threads waiting for work sleep instead of spinning; a spinning
 * thread holds a core that a thread of its own team, or another program, needs, and two threads then run
 * slower than one). Returns whether it changed the environment. OpenMP reads the variable once, when it
 * loads (before main), so it acts on processes started afterwards: a launcher's children (ts_launch_run
 * gives its ranks these defaults itself), or this program started again — `tessera` execs itself once
 * when this returns true. */
bool ts_threads_env_defaults(void);

/* How CPU conv2d computes convolutions (forward and both gradients): oneDNN's convolution
 * primitives (builds with oneDNN: its JIT kernels for this CPU, the same as PyTorch's), or our own:
 * im2col + sgemm, and for 3x3 stride-1 ones Winograd's F(2x2, 3x3) (16 multiplies per 4 outputs
 * instead of 36) or F(4x4, 3x3) (36 per 16 instead of 144). Winograd's results differ from
 * im2col's by float rounding: ~1e-6 (F(2x2)) and ~5e-6 (F(4x4)) of the largest value. AUTO (the
 * default) takes oneDNN for every one-group convolution where the build has it and the GEMMs run
 * there (ts_cpu_gemm_library), else F(2x2) Winograd where it applies (3x3, stride 1, dilation 1,
 * one group, padding <= 2) with at least 16 input and output channels; WINOGRAD takes Winograd wherever it
 * applies — with oneDNN, its AVX-512 F(4x4, 3x3) kernels for 64+ input and output channels on output planes of
 * 4x4 and more and its direct kernels for the convolutions that are not 3x3 stride 1 — and otherwise ours,
 * F(4x4) where the output plane holds a 4x4 tile, the batch 64 of them and both channel counts are 64 or
 * more (faster, less exact); WINOGRAD_F2 and WINOGRAD_F4 fix the tile size (F4: F(4x4) on every
 * plane of 4x4 or more, F(2x2) below). Process-wide, like torch.backends flags; the
 * environment's TS_CONV_ALGO=auto|im2col|winograd|winograd-f2|winograd-f4|onednn sets the starting
 * value. */
typedef enum ts_conv_algo {
    TS_CONV_AUTO = 0,
    TS_CONV_IM2COL = 1,
    TS_CONV_WINOGRAD = 2,
    TS_CONV_WINOGRAD_F2 = 3,
    TS_CONV_WINOGRAD_F4 = 4,
    TS_CONV_ONEDNN = 5 /* oneDNN's convolution primitives for every one-group conv (builds with oneDNN;
                          else as AUTO); AUTO takes them too wherever oneDNN is built and runs the GEMMs */
} ts_conv_algo;
void ts_set_conv_algo(ts_conv_algo a);
ts_conv_algo ts_get_conv_algo(void);
/* "auto" | "im2col" | "winograd" | "winograd-f2" | "winograd-f4" | "onednn" -> *out; TS_ERR_INVALID_ARG
 * naming s otherwise. */
ts_status ts_conv_algo_parse(const char *s, ts_conv_algo *out);
const char *ts_conv_algo_name(ts_conv_algo a);

/* The precision of float32 matrix products — matmul, bmm, linear, conv2d, forward and backward — as
 * torch.set_float32_matmul_precision: TS_F32 (the default) multiplies in float32; TS_BF16 rounds both
 * operands to bfloat16 (nearest even) and accumulates the products in float32 (exact products: 8-bit
 * mantissas), on AVX512_BF16 through oneDNN where the CPU has it. Tensors, every other op (losses,
 * softmax, normalisation statistics, optimizers) and the stored weights stay float32 (`tessera train
 * --precision bf16` sets it, and ts_set_autocast(TS_BF16) too: bfloat16 activations, on the CPU and CUDA). On the CPU, convolutions run oneDNN's bf16 primitives
 * or im2col under TS_BF16 (never Winograd: its transforms would round in bfloat16). On CUDA devices
 * matmuls multiply bfloat16 copies of the operands (cuBLAS, float32 accumulation) and convolutions run
 * cuDNN in bfloat16 with float32 compute, their outputs rounded to bfloat16 once more (as autocast). Process-wide; the environment's TS_MATMUL_PRECISION=fp32|bf16
 * sets the starting value. TS_F16 rounds the operands to float16 instead (fp16 training, with the
 * trainer's loss scaling: ts_trainer_opts.grad_scaler): on the CPU an emulation at float32 speed (im2col
 * convolutions), on CUDA cuBLAS and cuDNN float16 products. Other dtypes
 * are refused (TS_ERR_INVALID_ARG). */
ts_status ts_set_matmul_precision(ts_dtype dt);
ts_dtype ts_get_matmul_precision(void);
/* Autocast, as torch.autocast(dtype=torch.bfloat16): with TS_BF16, conv2d, linear, matmul and bmm cast a
 * float32 input (not the weights) to bfloat16 — a ts_to_dtype node, so its gradient goes back in float32 —
 * and return bfloat16; the ops after them follow their input's dtype: batchnorm2d (statistics, weights and
 * their gradients in float32), relu, max pooling and the residual add keep bfloat16 activations, and their
 * gradients flow back in bfloat16; ops without bfloat16 kernels compute in float32 and round their result
 * (losses return float32). Weights, optimizer state and parameter gradients stay float32. Halves the
 * activations' memory and traffic; products are bfloat16 (exact, float32 sums) as under
 * ts_set_matmul_precision(TS_BF16), which should be set too for the layers that run on float32 copies.
 * Applies on devices whose kernels take bfloat16 activations (the CPU; CUDA devices too, not yet run on a
 * GPU); elsewhere the ops behave as without it. Process-wide; TS_AUTOCAST=fp32|bf16 in the environment sets the starting value;
 * `tessera train --precision bf16` turns it on. TS_F32 turns it off; other dtypes: TS_ERR_INVALID_ARG. */
ts_status ts_set_autocast(ts_dtype dt);
ts_dtype ts_get_autocast(void);
/* What runs float32 GEMMs on the CPU: "onednn" or "openblas" (TS_GEMM=openblas|onednn chooses where both
 * are built; oneDNN is the default when present). */
const char *ts_cpu_gemm_library(void);
/* Chooses it: "onednn" (TS_ERR_UNSUPPORTED in a build without oneDNN) or "openblas". Process-wide. */
ts_status ts_set_cpu_gemm_library(const char *name);

/* ---- random numbers ------------------------------------------------------------------ */
/* A seeded generator (PCG-XSL-RR 128/64); reproducible across runs and machines. */
typedef struct ts_rng {
    uint64_t state_hi, state_lo; /* 128-bit LCG state */
    uint64_t inc_hi, inc_lo;     /* stream (odd) */
    double spare_normal;         /* Box–Muller spare */
    int has_spare;
} ts_rng;

void ts_rng_seed(ts_rng *r, uint64_t seed);
uint64_t ts_rng_u64(ts_rng *r);
uint32_t ts_rng_u32(ts_rng *r);
/* Uniform in [0, 1). */
double ts_rng_uniform(ts_rng *r);
/* Uniform integer in [0, n). */
uint64_t ts_rng_below(ts_rng *r, uint64_t n);
double ts_rng_normal(ts_rng *r);
/* Fisher–Yates shuffle of idx[0..n). */
void ts_rng_shuffle_i64(ts_rng *r, int64_t *idx, int64_t n);
/* The process-wide default generator (used by initialisers when none is given). */
ts_rng *ts_rng_default(void);
void ts_manual_seed(uint64_t seed);

/* ---- input files --------------------------------------------------------------------------- */
/* Reads a whole input file: only a regular file — a FIFO, device, socket or directory is TS_ERR_IO naming
 * path, its type and `what` ("an image file"), refused without waiting on it — of at most max_bytes
 * (TS_ERR_FORMAT naming both sizes otherwise, before anything is allocated). *buf is malloc'd with a NUL
 * after the *n bytes (free it). */
ts_status ts_read_file(const char *path, const char *what, uint64_t max_bytes, char **buf, size_t *n);

/* ---- output files ------------------------------------------------------------------------- */
/* Every file the library and the command write follows one set of rules: the path must be a regular file
 * or absent — a directory, a device (/dev/full), a FIFO or a socket is TS_ERR_IO naming the path, its type
 * and `what` ("a metrics file"), and is never opened (nothing blocks, no device is written); the bytes go
 * to "<path>.tmp.<pid>" beside it (created exclusively, never through a symbolic link), which is flushed,
 * fsync'ed and renamed over path, so a reader sees the old file or the whole new one, never half of it.
 * ts_outfile_check: whether path could be written now (its directory exists and takes a new file), to check
 *   an output path before long work.
 * ts_outfile_open: *out is a new output file; write to ts_outfile_stream(*out) (stdio).
 * ts_outfile_close: puts the file in place and frees it; a write error seen on the stream, or a failed
 *   flush, fsync or rename, is TS_ERR_IO naming path (the temporary file is removed, an old file stays).
 * ts_outfile_discard: removes the temporary file and frees it (NULL is fine).
 * ts_write_file: n bytes of data as a whole file, by the same rules. */
typedef struct ts_outfile ts_outfile;
ts_status ts_outfile_check(const char *path, const char *what);
ts_status ts_outfile_open(const char *path, const char *what, ts_outfile **out);
FILE *ts_outfile_stream(ts_outfile *o);
ts_status ts_outfile_close(ts_outfile *o);
void ts_outfile_discard(ts_outfile *o);
ts_status ts_write_file(const char *path, const char *what, const void *data, size_t n);

/* ---- wall clock --------------------------------------------------------------------------- */
double ts_time_now(void); /* seconds, monotonic */

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_CORE_H */
