/*
 * ops/cuda/spatial.c — the spatial family on CUDA devices: conv2d through cuDNN's legacy
 * convolution API, pooling and batchnorm2d through our kernels (spatial.cu, launchers in
 * spatial_cu.h).
 *
 * Convolutions. Each call is planned once per (geometry, pass, precision) and the plan kept in a
 * per-device cache (PLAN_CACHE plans, least recently used evicted): the tensor, filter and convolution
 * descriptors (CUDNN_CROSS_CORRELATION, group count, dilation, float compute) and the algorithm.
 *
 * Precision. In float32 (the default) every operand is float32 and the math type CUDNN_FMA_MATH, so
 * float32 convolutions never use TF32 (as PyTorch with allow_tf32 off). Under ts_get_matmul_precision()
 * == TS_BF16 (the autocast rule of the CPU and of blas.c) a pass casts its two inputs (forward: x and w;
 * backward data: gout and w; backward filter: x and gout) to bfloat16 scratch copies (nearest even: ew.cu's
 * cast kernel) and runs cuDNN's PSEUDO_BFLOAT16_CONFIG: tensor and filter descriptors CUDNN_DATA_BFLOAT16,
 * convolution compute type CUDNN_DATA_FLOAT (float32 accumulation), math CUDNN_TENSOR_OP_MATH, float alpha
 * and beta. Its output goes to a bfloat16 scratch, cast back into the float32 result: unlike the CPU's
 * bf16 convolutions, the result is rounded to bfloat16 once more on the way out (the legacy API has no
 * bfloat16-in, float32-out configuration), as under PyTorch's autocast. The bias, its gradient (from the
 * float32 gout) and every tensor the op sees stay float32. Under TS_F16 (float16 training) the same runs
 * with float16 copies and PSEUDO_HALF_CONFIG (CUDNN_DATA_HALF; both paths ran on an H200, test_cuda and
 * fp16/bf16 training, 2026-11-26 and 2026-11-28). TS_CUDA_CONV_BF16=0 in the environment (read once) keeps convolutions in float32
 * whatever the precision, for A/B measurements.
 *
 * Algorithms. By default (TS_CUDNN_ALGO unset or "heuristic", read once) they come from cuDNN's heuristics
 * (cudnnGet*Algorithm_v7, ranked fastest first; no benchmarking, so the choice is the same every run): the
 * first candidate that is supported, of an allowed math type (float32: not tensor ops; bfloat16: tensor
 * ops first, then any but CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION), deterministic, of the GEMM or direct
 * families (not FFT or Winograd: see algo_inexact) and whose workspace fits in ws_cap(); failing that, a
 * non-deterministic one. With TS_CUDNN_ALGO=find (measured as torch.backends.cudnn.benchmark does, but
 * from the exact families only) a new plan measures instead: cudnnFind*AlgorithmEx on the call's own
 * buffers (the pass's output, which the real call overwrites right after; a scratch one when a float32
 * weight gradient accumulates over chunks) with a workspace of min(ws_cap(), 512 MiB) from the device's
 * allocator, taking the fastest result that succeeded, of an allowed math type and not FFT or Winograd —
 * non-deterministic algorithms included, as PyTorch's default cudnn.deterministic=False — and falling back
 * to the heuristics when no result is usable. TS_CUDNN_ALGO=benchmark measures the same way but takes the
 * fastest of every algorithm cuDNN ran successfully with an allowed math type, FFT and Winograd included:
 * the set torch.backends.cudnn.benchmark = True chooses from (PyTorch's getValidAlgorithms keeps every
 * result whose status is success, and drops non-deterministic ones only under cudnn.deterministic; with
 * TF32 off its float32 descriptors ask for FMA math, as ours do; it measures with the largest workspace
 * its allocator can give, we with find's). That trades exactness for speed, as PyTorch's does: FFT and
 * Winograd round with the magnitude of a whole transformed tile or plane, not of each output's own terms
 * (algo_inexact has a measured example), so benchmark's results may miss tolerances that find's and the
 * heuristics' meet. When no measured result is usable, benchmark too falls back to the (exact) heuristics.
 * A measurement blocks the host until the device is done with it, once per new plan. Either way a plan
 * also keeps the usable candidate with the least workspace, used when the chosen one's workspace cannot be
 * allocated; each new plan is logged at debug level (the measured time under find and benchmark).
 * Workspaces come from the device's allocator (ts__scratch_bytes) and are released right after the call
 * is queued (the allocator is stream-ordered), as are the bfloat16 scratch copies.
 *
 * cuDNN's descriptors take int sizes: a batch with more than INT_MAX elements runs in chunks of images.
 * The weight gradient adds up over chunks: in float32 with beta = 1; in bfloat16 each chunk writes its
 * own bfloat16 gradient, cast to float32 and added to the first chunk's (ts_cu_axpy).
 *
 * The cuDNN handle is the device's ctx->cudnn, created on first use and bound to the device's stream;
 * it and the plan cache are used under the device's lib_mu. The bias is added, and its gradient
 * summed (in double, deterministic), by our kernels.
 *
 * Everything here is deterministic except under TS_CUDNN_ALGO=find or benchmark (the measured choice
 * may differ from run to run and may be a non-deterministic algorithm), and a conv gradient for which
 * cuDNN offers no deterministic algorithm within the workspace cap (not seen for float32 NCHW).
 */
#include "core/env.h"
#include "ops/cuda/common.h"
#include "ops/cuda/ew_cu.h"
#include "ops/cuda/spatial_cu.h"
#include "device/k_spatial.h"

#include <cudnn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#define PLAN_CACHE 256                   /* cached conv plans per device */
#define MAX_ORDINALS 256                 /* devices with a plan cache */
#define FIND_WS_MAX ((size_t)512 << 20) /* workspace for measuring algorithms (TS_CUDNN_ALGO=find, benchmark) */

static ts_status cudnn_status(const ts_device *d, cudnnStatus_t st, const char *call) {
    if (st == CUDNN_STATUS_SUCCESS) return TS_OK;
    bool nomem = st == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                 st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
    return ts_error(nomem ? TS_ERR_NOMEM : TS_ERR_DEVICE, "%s: %s failed: %s", d->name, call, cudnnGetErrorString(st));
}
/* st = the status of cudnnFn(args...); goto fail unless it succeeded (needs `dev`, `st`, `fail:`) */
#define CUDNN_GOTO(fn, ...)                                     \
    do {                                                        \
        st = cudnn_status(dev, fn(__VA_ARGS__), #fn);           \
        if (st != TS_OK) goto fail;                             \
    } while (0)

static int64_t numel4(int64_t a, int64_t b, int64_t c, int64_t d) { return a * b * c * d; }

/* ================================ switches ================================ */

/* TS_CUDNN_ALGO: how a new plan picks its algorithm */
typedef enum {
    ALGO_HEURISTIC, /* unset or "heuristic": cuDNN's heuristics, deterministic GEMM/direct algorithms first */
    ALGO_FIND,      /* "find": measured, GEMM/direct algorithms only (exact to float rounding) */
    ALGO_BENCHMARK, /* "benchmark": measured, every algorithm (FFT and Winograd too): cudnn.benchmark's set */
} algo_mode;

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static algo_mode env_algo;   /* TS_CUDNN_ALGO */
static bool env_bf16 = true; /* TS_CUDA_CONV_BF16 is not 0: 16-bit convolutions under TS_BF16 / TS_F16 */

static void env_init(void) {
    static const algo_mode modes[] = {[TS_ENV_CUDNN_HEURISTIC] = ALGO_HEURISTIC, [TS_ENV_CUDNN_FIND] = ALGO_FIND,
                                      [TS_ENV_CUDNN_BENCHMARK] = ALGO_BENCHMARK};
    env_algo = modes[ts_env_enum(TS_ENV_CUDNN_ALGO)]; /* a bad value warns (core/env.c): heuristic */
    env_bf16 = ts_env_bool(TS_ENV_CUDA_CONV_BF16);
}

static algo_mode algo_how(void) {
    pthread_once(&env_once, env_init);
    return env_algo;
}

/* The 16-bit type a conv pass runs in now: TS_CU_BF16 for bfloat16 activations (autocast: act16, whatever
 * the precision and TS_CUDA_CONV_BF16), under TS_BF16, TS_CU_F16 under TS_F16 (float16 training), else
 * TS_CU_F32 (0: float32). */
static int conv_half(bool act16) {
    if (act16) return TS_CU_BF16;
    pthread_once(&env_once, env_init);
    ts_dtype p = ts_get_matmul_precision();
    if (!env_bf16 || p == TS_F32) return TS_CU_F32;
    return p == TS_F16 ? TS_CU_F16 : TS_CU_BF16;
}

static const char *half_name(int half) {
    return half == TS_CU_BF16 ? "bfloat16" : half == TS_CU_F16 ? "float16" : "float32";
}

/* *t = a new scratch holding n floats at src rounded to `half` (nearest even); *t NULL on failure. */
static ts_status half_copy(ts_device *dev, cudaStream_t s, int half, const float *src, int64_t n, ts_tensor **t) {
    *t = NULL;
    TS_TRY(ts__scratch_bytes(dev, 2 * (size_t)TS_MAX(n, 1), t));
    ts_status st = ts__cuda_status(dev, ts_cu_cast(ts__ptr(*t), half, src, TS_CU_F32, n, s), "conv2d: 16-bit cast");
    if (st != TS_OK) {
        ts_tensor_release(*t);
        *t = NULL;
    }
    return st;
}

/* dst (n floats) = src (n values of `half`), exactly. */
static ts_status from_half(ts_device *dev, cudaStream_t s, int half, float *dst, const void *src, int64_t n) {
    return ts__cuda_status(dev, ts_cu_cast(dst, TS_CU_F32, src, half, n, s), "conv2d: 16-bit cast");
}

/* ================================ conv2d plans ================================ */

typedef enum { PASS_FWD, PASS_BWD_DATA, PASS_BWD_FILTER } conv_pass;
static const char *const pass_name[] = {"forward", "backward data", "backward filter"};

/* The buffers of one cuDNN call, in the order cuDNN takes them: forward x, w -> y; backward data
 * w, dy -> dx; backward filter x, dy -> dw. While planning, y NULL: a measurement writes a scratch. */
typedef struct conv_io {
    const void *a, *b;
    void *y;
} conv_io;

typedef struct conv_plan {
    bool used;
    conv_pass pass;
    int half;         /* TS_CU_BF16 / TS_CU_F16 data (PSEUDO_BFLOAT16 / PSEUDO_HALF_CONFIG), 0 float32; key */
    ts_conv2d_geom g; /* the key: the call's geometry with N = its chunk of images */
    uint64_t stamp;   /* last use */
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    int algo, algo_lean; /* the chosen algorithm; the one with the least workspace */
    size_t ws, ws_lean;  /* their workspaces in bytes */
} conv_plan;

typedef struct conv_cache {
    conv_plan plans[PLAN_CACHE];
    uint64_t clock;
} conv_cache;

/* By device ordinal; caches[i] is touched only under device i's lib_mu. Lives as long as the process
 * (devices do too). */
static conv_cache *caches[MAX_ORDINALS];

static bool geom_eq(const ts_conv2d_geom *a, const ts_conv2d_geom *b) {
    return a->N == b->N && a->C == b->C && a->H == b->H && a->W == b->W && a->K == b->K && a->OH == b->OH &&
           a->OW == b->OW && a->kh == b->kh && a->kw == b->kw && a->sh == b->sh && a->sw == b->sw && a->ph == b->ph &&
           a->pw == b->pw && a->dh == b->dh && a->dw == b->dw && a->groups == b->groups;
}

static void plan_destroy(conv_plan *p) {
    if (p->xd) cudnnDestroyTensorDescriptor(p->xd);
    if (p->yd) cudnnDestroyTensorDescriptor(p->yd);
    if (p->wd) cudnnDestroyFilterDescriptor(p->wd);
    if (p->cd) cudnnDestroyConvolutionDescriptor(p->cd);
    memset(p, 0, sizeof *p);
}

/* Workspace cap for the chosen algorithm: 1/16 of the device's memory, at most 1 GiB. */
static size_t ws_cap(ts_device *dev) {
    size_t cap = ts__cuda(dev)->prop.totalGlobalMem / 16;
    return cap < ((size_t)1 << 30) ? cap : ((size_t)1 << 30);
}

/* One candidate (heuristic or measured), whatever the pass. */
typedef struct algo_cand {
    int algo;
    cudnnStatus_t status;
    cudnnDeterminism_t det;
    cudnnMathType_t math;
    size_t mem; /* measured: the workspace it ran with */
    float ms;   /* measured: its time */
} algo_cand;

#define MAX_CANDS 16

/* FFT and Winograd algorithms transform the operands: their rounding error grows with the magnitude of
 * the whole tile or plane, not with each output's own terms. Measured on an H200 against a double
 * reference, the weight gradient of a 256-channel 3x3 conv (N 8, 14x14) was off by 27x the golden
 * tests' tolerance (1e-5 + 1e-4 |ref|) with WINOGRAD_NONFUSED and by 2x with the GEMM algorithm (plain
 * float rounding over 1568-term sums). Only the GEMM and direct families are used, except under
 * TS_CUDNN_ALGO=benchmark, which trades this exactness for speed as PyTorch's cudnn.benchmark does. */
static bool algo_inexact(conv_pass pass, int a) {
    switch (pass) {
    case PASS_FWD:
        return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
               a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    case PASS_BWD_DATA:
        return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
               a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    default:
        return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
               a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD ||
               a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
    }
}

/* Math types a plan may run: float32 never tensor ops (no TF32); bfloat16 anything but
 * ALLOW_CONVERSION (a down-conversion we do not ask for). */
static bool math_ok(bool half, cudnnMathType_t m) {
    if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
    return half || m != CUDNN_TENSOR_OP_MATH;
}

/* The heuristics' ranked candidates for p's pass. */
static ts_status plan_candidates(ts_device *dev, cudnnHandle_t h, const conv_plan *p, algo_cand *c, int *nc) {
    ts_status st = TS_OK;
    int n = 0;
    *nc = 0;
    switch (p->pass) {
    case PASS_FWD: {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CUDNN_GOTO(cudnnGetConvolutionForwardAlgorithm_v7, h, p->xd, p->wd, p->cd, p->yd,
                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, r);
        for (int i = 0; i < n && i < MAX_CANDS; i++)
            c[i] = (algo_cand){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType, 0, -1.0f};
        break;
    }
    case PASS_BWD_DATA: {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CUDNN_GOTO(cudnnGetConvolutionBackwardDataAlgorithm_v7, h, p->wd, p->yd, p->cd, p->xd,
                   CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, r);
        for (int i = 0; i < n && i < MAX_CANDS; i++)
            c[i] = (algo_cand){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType, 0, -1.0f};
        break;
    }
    case PASS_BWD_FILTER: {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CUDNN_GOTO(cudnnGetConvolutionBackwardFilterAlgorithm_v7, h, p->xd, p->yd, p->cd, p->wd,
                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, r);
        for (int i = 0; i < n && i < MAX_CANDS; i++)
            c[i] = (algo_cand){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType, 0, -1.0f};
        break;
    }
    }
    *nc = n < MAX_CANDS ? n : MAX_CANDS;
fail:
    return st;
}

/* Bytes of p's output (y, dx or dw). */
static size_t plan_out_bytes(const conv_plan *p) {
    const ts_conv2d_geom *g = &p->g;
    int64_t n = p->pass == PASS_FWD        ? numel4(g->N, g->K, g->OH, g->OW)
                : p->pass == PASS_BWD_DATA ? numel4(g->N, g->C, g->H, g->W)
                                           : numel4(g->K, g->C / g->groups, g->kh, g->kw);
    return (size_t)TS_MAX(n, 1) * (p->half ? 2 : sizeof(float));
}

/* The measured candidates for p's pass, fastest first (cudnnFind*AlgorithmEx on io's buffers); none
 * (*nc = 0, TS_OK) when the measurement could not run, which sends the caller to the heuristics. */
static void plan_find(ts_device *dev, cudnnHandle_t h, const conv_plan *p, const conv_io *io, algo_cand *c,
                      int *nc) {
    *nc = 0;
    ts_tensor *wst = NULL, *yt = NULL;
    size_t wsz = TS_MIN(ws_cap(dev), FIND_WS_MAX);
    while (wsz > 0 && ts__scratch_bytes(dev, wsz, &wst) != TS_OK) { /* less when memory is short */
        wst = NULL;
        wsz = wsz >= ((size_t)2 << 20) ? wsz / 2 : 0;
    }
    void *y = io->y;
    if (!y) {
        if (ts__scratch_bytes(dev, plan_out_bytes(p), &yt) != TS_OK) {
            ts_tensor_release(wst);
            ts_log(TS_LOG_DEBUG, "%s: conv2d %s: no memory to measure algorithms in; using the heuristics", dev->name,
                   pass_name[p->pass]);
            return;
        }
        y = ts__ptr(yt);
    }
    void *ws = wst ? ts__ptr(wst) : NULL;
    if (!wst) wsz = 0;
    cudnnStatus_t cs;
    int n = 0;
    switch (p->pass) {
    case PASS_FWD: {
        cudnnConvolutionFwdAlgoPerf_t r[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        cs = cudnnFindConvolutionForwardAlgorithmEx(h, p->xd, io->a, p->wd, io->b, p->cd, p->yd, y,
                                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, r, ws, wsz);
        for (int i = 0; cs == CUDNN_STATUS_SUCCESS && i < n && i < MAX_CANDS; i++)
            c[i] = (algo_cand){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType, r[i].memory, r[i].time};
        break;
    }
    case PASS_BWD_DATA: {
        cudnnConvolutionBwdDataAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        cs = cudnnFindConvolutionBackwardDataAlgorithmEx(h, p->wd, io->a, p->yd, io->b, p->cd, p->xd, y,
                                                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, r, ws, wsz);
        for (int i = 0; cs == CUDNN_STATUS_SUCCESS && i < n && i < MAX_CANDS; i++)
            c[i] = (algo_cand){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType, r[i].memory, r[i].time};
        break;
    }
    default: {
        cudnnConvolutionBwdFilterAlgoPerf_t r[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        cs = cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p->xd, io->a, p->yd, io->b, p->cd, p->wd, y,
                                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, r, ws, wsz);
        for (int i = 0; cs == CUDNN_STATUS_SUCCESS && i < n && i < MAX_CANDS; i++)
            c[i] = (algo_cand){(int)r[i].algo, r[i].status, r[i].determinism, r[i].mathType, r[i].memory, r[i].time};
        break;
    }
    }
    ts_tensor_release(yt);
    ts_tensor_release(wst);
    if (cs != CUDNN_STATUS_SUCCESS) {
        ts_log(TS_LOG_DEBUG, "%s: conv2d %s: measuring algorithms failed (%s); using the heuristics", dev->name,
               pass_name[p->pass], cudnnGetErrorString(cs));
        return;
    }
    *nc = n < MAX_CANDS ? n : MAX_CANDS;
}

/* The workspace algorithm a needs for p (false: a does not run p). */
static bool plan_ws(cudnnHandle_t h, const conv_plan *p, int a, size_t *bytes) {
    cudnnStatus_t s;
    switch (p->pass) {
    case PASS_FWD:
        s = cudnnGetConvolutionForwardWorkspaceSize(h, p->xd, p->wd, p->cd, p->yd, (cudnnConvolutionFwdAlgo_t)a, bytes);
        break;
    case PASS_BWD_DATA:
        s = cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->wd, p->yd, p->cd, p->xd,
                                                         (cudnnConvolutionBwdDataAlgo_t)a, bytes);
        break;
    default:
        s = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->xd, p->yd, p->cd, p->wd,
                                                           (cudnnConvolutionBwdFilterAlgo_t)a, bytes);
        break;
    }
    return s == CUDNN_STATUS_SUCCESS;
}

/* Among candidates c[0..n): *best, the chosen one (-1: none), and *lean, the usable one with the least
 * workspace (-1: none); ws[i] their workspaces. Usable: cuDNN's status is success, the math type is
 * allowed, and (unless `inexact`: TS_CUDNN_ALGO=benchmark's measured candidates) the algorithm is not
 * FFT or Winograd. Measured candidates (fastest first): the first usable one, deterministic or not.
 * Heuristic ones: for bfloat16 tensor-op math first; deterministic first; then, when all usable ones
 * exceed the cap, the leanest. */
static void cands_choose(cudnnHandle_t h, const conv_plan *p, const algo_cand *c, int n, bool measured, bool inexact,
                         size_t cap, size_t *ws, int *best, int *lean) {
    bool ok[MAX_CANDS];
    for (int i = 0; i < n; i++) {
        ok[i] = c[i].status == CUDNN_STATUS_SUCCESS && (inexact || !algo_inexact(p->pass, c[i].algo)) &&
                math_ok(p->half != 0, c[i].math) && plan_ws(h, p, c[i].algo, &ws[i]);
        if (ok[i] && measured && c[i].mem > ws[i]) ws[i] = c[i].mem;
    }
    *best = *lean = -1;
    if (measured) {
        for (int i = 0; i < n && *best < 0; i++)
            if (ok[i] && ws[i] <= cap) *best = i;
    } else {
        /* tiers: (tensor ops, deterministic), (tensor ops), (deterministic), (any); float32 needs no tensor ops */
        for (int t = 0; t < 4 && *best < 0; t++) {
            const bool tensor = p->half && t < 2, strict = !(t & 1);
            for (int i = 0; i < n && *best < 0; i++)
                if (ok[i] && ws[i] <= cap && (!strict || c[i].det == CUDNN_DETERMINISTIC) &&
                    (!tensor || c[i].math == CUDNN_TENSOR_OP_MATH))
                    *best = i;
        }
    }
    for (int i = 0; i < n; i++) /* least workspace, deterministic preferred on ties */
        if (ok[i] && (*lean < 0 || ws[i] < ws[*lean] ||
                      (ws[i] == ws[*lean] && c[*lean].det != CUDNN_DETERMINISTIC && c[i].det == CUDNN_DETERMINISTIC)))
            *lean = i;
    if (!measured && *best < 0 && *lean >= 0) *best = *lean; /* everything usable is over the cap: the leanest */
}

/* Picks p->algo and p->algo_lean: measured on io's buffers under TS_CUDNN_ALGO=find or benchmark (the
 * latter with FFT and Winograd among the candidates), else (or when no measured candidate is usable) from
 * the heuristics, which never take FFT or Winograd. */
static ts_status plan_pick(ts_device *dev, cudnnHandle_t h, conv_plan *p, const conv_io *io) {
    algo_cand c[MAX_CANDS];
    size_t ws[MAX_CANDS];
    int n = 0, best = -1, lean = -1;
    bool measured = false;
    const size_t cap = ws_cap(dev);
    memset(c, 0, sizeof c);
    const algo_mode mode = algo_how();
    if (mode != ALGO_HEURISTIC) {
        plan_find(dev, h, p, io, c, &n);
        cands_choose(h, p, c, n, true, mode == ALGO_BENCHMARK, cap, ws, &best, &lean);
        measured = best >= 0;
        if (!measured && n > 0)
            ts_log(TS_LOG_DEBUG, "%s: conv2d %s: no usable measured algorithm; using the heuristics", dev->name,
                   pass_name[p->pass]);
    }
    if (!measured) {
        TS_TRY(plan_candidates(dev, h, p, c, &n));
        cands_choose(h, p, c, n, false, false, cap, ws, &best, &lean);
    }
    if (best < 0) {
        /* the heuristics gave nothing usable: the implicit-GEMM kernels, which support every geometry */
        int a = p->pass == PASS_FWD ? (int)CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
                : p->pass == PASS_BWD_DATA ? (int)CUDNN_CONVOLUTION_BWD_DATA_ALGO_1
                                           : (int)CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
        size_t b = 0;
        if (!plan_ws(h, p, a, &b))
            return ts_error(TS_ERR_UNSUPPORTED, "%s: cuDNN has no %s convolution %s algorithm for x (%lld, %lld, "
                            "%lld, %lld), w (%lld, %lld, %d, %d), stride (%d, %d), padding (%d, %d), dilation (%d, "
                            "%d), groups %d", dev->name, half_name(p->half), pass_name[p->pass],
                            (long long)p->g.N, (long long)p->g.C, (long long)p->g.H, (long long)p->g.W,
                            (long long)p->g.K, (long long)(p->g.C / p->g.groups), p->g.kh, p->g.kw, p->g.sh, p->g.sw,
                            p->g.ph, p->g.pw, p->g.dh, p->g.dw, p->g.groups);
        p->algo = p->algo_lean = a;
        p->ws = p->ws_lean = b;
        return TS_OK;
    }
    p->algo = c[best].algo;
    p->ws = ws[best];
    p->algo_lean = c[lean].algo;
    p->ws_lean = ws[lean];
    char how[48];
    if (measured)
        snprintf(how, sizeof how, "measured %.3f ms%s", (double)c[best].ms,
                 algo_inexact(p->pass, c[best].algo) ? ", FFT/Winograd" : "");
    else
        snprintf(how, sizeof how, "heuristic");
    ts_log(TS_LOG_DEBUG, "%s: conv2d %s %s x (%lld, %lld, %lld, %lld) w (%lld, %lld, %d, %d) stride (%d, %d) pad (%d, "
           "%d) dilation (%d, %d) groups %d: cuDNN algorithm %d (%s, math %d%s), workspace %zu bytes (lean: %d, %zu "
           "bytes)", dev->name, half_name(p->half), pass_name[p->pass], (long long)p->g.N,
           (long long)p->g.C, (long long)p->g.H, (long long)p->g.W, (long long)p->g.K,
           (long long)(p->g.C / p->g.groups), p->g.kh, p->g.kw, p->g.sh, p->g.sw, p->g.ph, p->g.pw, p->g.dh, p->g.dw,
           p->g.groups, p->algo, how, (int)c[best].math,
           c[best].det == CUDNN_DETERMINISTIC ? "" : ", non-deterministic", p->ws, p->algo_lean, p->ws_lean);
    return TS_OK;
}

/* Fills plan p (zeroed) for geometry g, pass and precision: descriptors, then the algorithms (measured
 * on io's buffers under TS_CUDNN_ALGO=find or benchmark). */
static ts_status plan_make(ts_device *dev, cudnnHandle_t h, const ts_conv2d_geom *g, conv_pass pass, int half,
                           const conv_io *io, conv_plan *p) {
    ts_status st = TS_OK;
    p->g = *g;
    p->pass = pass;
    p->half = half;
    /* PSEUDO_BFLOAT16_CONFIG / PSEUDO_HALF_CONFIG (16-bit data, float compute) or FLOAT_CONFIG */
    const cudnnDataType_t dt = half == TS_CU_BF16 ? CUDNN_DATA_BFLOAT16 : half == TS_CU_F16 ? CUDNN_DATA_HALF
                                                                                           : CUDNN_DATA_FLOAT;
    CUDNN_GOTO(cudnnCreateTensorDescriptor, &p->xd);
    CUDNN_GOTO(cudnnCreateTensorDescriptor, &p->yd);
    CUDNN_GOTO(cudnnCreateFilterDescriptor, &p->wd);
    CUDNN_GOTO(cudnnCreateConvolutionDescriptor, &p->cd);
    CUDNN_GOTO(cudnnSetTensor4dDescriptor, p->xd, CUDNN_TENSOR_NCHW, dt, (int)g->N, (int)g->C, (int)g->H, (int)g->W);
    CUDNN_GOTO(cudnnSetTensor4dDescriptor, p->yd, CUDNN_TENSOR_NCHW, dt, (int)g->N, (int)g->K, (int)g->OH,
               (int)g->OW);
    CUDNN_GOTO(cudnnSetFilter4dDescriptor, p->wd, dt, CUDNN_TENSOR_NCHW, (int)g->K, (int)(g->C / g->groups), g->kh,
               g->kw);
    CUDNN_GOTO(cudnnSetConvolution2dDescriptor, p->cd, g->ph, g->pw, g->sh, g->sw, g->dh, g->dw,
               CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    CUDNN_GOTO(cudnnSetConvolutionGroupCount, p->cd, g->groups);
    CUDNN_GOTO(cudnnSetConvolutionMathType, p->cd, half ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH);
    int on = 0, oc = 0, oh = 0, ow = 0;
    CUDNN_GOTO(cudnnGetConvolution2dForwardOutputDim, p->cd, p->xd, p->wd, &on, &oc, &oh, &ow);
    if (on != g->N || oc != g->K || oh != g->OH || ow != g->OW) {
        st = ts_error(TS_ERR_INVALID_ARG, "%s: conv2d: cuDNN computes output (%d, %d, %d, %d), the op (%lld, %lld, "
                      "%lld, %lld)", dev->name, on, oc, oh, ow, (long long)g->N, (long long)g->K, (long long)g->OH,
                      (long long)g->OW);
        goto fail;
    }
    TS_CHECK_GOTO(plan_pick(dev, h, p, io));
    p->used = true;
    return TS_OK;
fail:
    plan_destroy(p);
    return st;
}

/* The cached plan for (g, pass, half), made on a miss (evicting the least recently used; io: the
 * call's buffers, for a measurement). lib_mu held. */
static ts_status plan_get(ts_device *dev, cudnnHandle_t h, conv_cache *cc, const ts_conv2d_geom *g, conv_pass pass,
                          int half, const conv_io *io, conv_plan **out) {
    conv_plan *victim = NULL;
    for (int i = 0; i < PLAN_CACHE; i++) {
        conv_plan *p = &cc->plans[i];
        if (p->used && p->pass == pass && p->half == half && geom_eq(&p->g, g)) {
            p->stamp = ++cc->clock;
            *out = p;
            return TS_OK;
        }
        if (!victim || (victim->used && (!p->used || p->stamp < victim->stamp))) victim = p;
    }
    if (victim->used) plan_destroy(victim);
    TS_TRY(plan_make(dev, h, g, pass, half, io, victim));
    victim->stamp = ++cc->clock;
    *out = victim;
    return TS_OK;
}

/* The device's cuDNN handle (created on first use, on the device's stream) and plan cache, with lib_mu
 * held on success. */
static ts_status cudnn_lock(ts_device *dev, cudaStream_t s, cudnnHandle_t *h, conv_cache **cc) {
    ts__cuda_ctx *c = ts__cuda(dev);
    if (c->ordinal < 0 || c->ordinal >= MAX_ORDINALS)
        return ts_error(TS_ERR_UNSUPPORTED, "%s: conv2d: cuDNN plans are kept for devices 0..%d only", dev->name,
                        MAX_ORDINALS - 1);
    pthread_mutex_lock(&c->lib_mu);
    ts_status st = TS_OK;
    if (!c->cudnn) {
        cudnnHandle_t nh = NULL;
        st = cudnn_status(dev, cudnnCreate(&nh), "cudnnCreate");
        if (st == TS_OK) st = cudnn_status(dev, cudnnSetStream(nh, s), "cudnnSetStream");
        if (st != TS_OK) {
            if (nh) cudnnDestroy(nh);
            goto fail;
        }
        c->cudnn = nh;
    }
    if (!caches[c->ordinal]) {
        caches[c->ordinal] = ts__calloc(1, sizeof(conv_cache));
        if (!caches[c->ordinal]) {
            st = TS_ERR_NOMEM; /* ts__calloc set the message */
            goto fail;
        }
    }
    *h = (cudnnHandle_t)c->cudnn;
    *cc = caches[c->ordinal];
    return TS_OK;
fail:
    pthread_mutex_unlock(&c->lib_mu);
    return st;
}

static void cudnn_unlock(ts_device *dev) { pthread_mutex_unlock(&ts__cuda(dev)->lib_mu); }

/* Workspace for plan p: its algorithm's, or the lean algorithm's when that cannot be allocated.
 * *t (NULL for none) is released by the caller once the call is queued. */
static ts_status plan_workspace(ts_device *dev, const conv_plan *p, int *algo, void **ws, size_t *bytes,
                                ts_tensor **t) {
    *t = NULL;
    *ws = NULL;
    *algo = p->algo;
    *bytes = p->ws;
    if (p->ws == 0) return TS_OK;
    ts_status st = ts__scratch_bytes(dev, p->ws, t);
    if (st == TS_ERR_NOMEM && p->ws_lean < p->ws) {
        *algo = p->algo_lean;
        *bytes = p->ws_lean;
        if (p->ws_lean == 0) return TS_OK;
        st = ts__scratch_bytes(dev, p->ws_lean, t);
    }
    if (st != TS_OK) return st;
    *ws = ts__ptr(*t);
    return TS_OK;
}

/* Images per cuDNN call, so that a chunk's x and y have at most INT_MAX elements (0: one image is
 * too large). */
static int64_t conv_chunk(const ts_conv2d_geom *g) {
    const int64_t per = TS_MAX(g->C * g->H * g->W, g->K * g->OH * g->OW);
    if (per > INT_MAX || g->K * (g->C / g->groups) * g->kh * g->kw > INT_MAX) return 0;
    return TS_MIN(g->N, per > 0 ? INT_MAX / per : g->N);
}

static ts_status conv_too_large(ts_device *dev, const ts_conv2d_geom *g) {
    return ts_error(TS_ERR_UNSUPPORTED, "%s: conv2d: one image of x (%lld, %lld, %lld), its output (%lld, %lld, "
                    "%lld) or the weight exceeds cuDNN's 32-bit sizes", dev->name, (long long)g->C, (long long)g->H,
                    (long long)g->W, (long long)g->K, (long long)g->OH, (long long)g->OW);
}

/* No cuDNN call needed: an empty input or output, or an empty filter (C/groups * kh * kw = 0). */
static bool conv_trivial(const ts_conv2d_geom *g) {
    return numel4(g->N, g->C, g->H, g->W) == 0 || numel4(g->N, g->K, g->OH, g->OW) == 0 ||
           (g->C / g->groups) * g->kh * g->kw == 0;
}

/* The launchers' type of an activation tensor: bfloat16 (autocast) or float32. */
static int act_type(const ts_tensor *t) { return t->dtype == TS_BF16 ? TS_CU_BF16 : TS_CU_F32; }

static ts_status zero_fill(ts_device *dev, cudaStream_t s, ts_tensor *t, int64_t n) {
    if (n > 0)
        TS_CU_LAUNCH(dev, "cudaMemsetAsync", cudaMemsetAsync(ts__ptr(t), 0, ts_dtype_size(t->dtype) * (size_t)n, s));
    return TS_OK;
}

// gb: (K) = per-channel sums of gout: (N, K, OHW), in double (deterministic)
static ts_status bias_grad(ts_device *dev, cudaStream_t s, const ts_conv2d_geom *g, const ts_tensor *gout,
                           ts_tensor *gb) {
    if (g->K == 0) return TS_OK;
    const int64_t OHW = g->OH * g->OW;
    const int S = ts_cu_chan_splits(g->N, g->K, OHW);
    ts_tensor *pt = NULL;
    TS_TRY(ts__scratch_bytes(dev, sizeof(double) * 2 * (size_t)(g->K * S), &pt));
    double *part = (double *)ts__ptr(pt);
    ts_status st = ts__cuda_status(dev, ts_cu_chan_partials(TS_CU_CHAN_SUM, act_type(gout), ts__ptr(gout), NULL, NULL,
                                                            g->N, g->K, OHW, S, part, s), "spatial.conv2d_bias_grad");
    if (st == TS_OK)
        st = ts__cuda_status(dev, ts_cu_chan_sum_finalize(part, g->K, S, ts__f32(gb), s), "spatial.conv2d_bias_grad");
    ts_tensor_release(pt);
    return st;
}

/* ================================ conv2d ================================ */

/* Runs plan p on io's buffers: output = conv + beta * output (alpha 1). */
static ts_status plan_run(ts_device *dev, cudnnHandle_t h, const conv_plan *p, const conv_io *io, float beta) {
    const float one = 1.0f; /* float scalars for float and bfloat16 data alike */
    ts_tensor *wst;
    void *ws;
    size_t wsz;
    int algo;
    TS_TRY(plan_workspace(dev, p, &algo, &ws, &wsz, &wst));
    cudnnStatus_t cs;
    const char *fn;
    switch (p->pass) {
    case PASS_FWD:
        fn = "cudnnConvolutionForward";
        cs = cudnnConvolutionForward(h, &one, p->xd, io->a, p->wd, io->b, p->cd, (cudnnConvolutionFwdAlgo_t)algo, ws,
                                     wsz, &beta, p->yd, io->y);
        break;
    case PASS_BWD_DATA:
        fn = "cudnnConvolutionBackwardData";
        cs = cudnnConvolutionBackwardData(h, &one, p->wd, io->a, p->yd, io->b, p->cd,
                                          (cudnnConvolutionBwdDataAlgo_t)algo, ws, wsz, &beta, p->xd, io->y);
        break;
    default:
        fn = "cudnnConvolutionBackwardFilter";
        cs = cudnnConvolutionBackwardFilter(h, &one, p->xd, io->a, p->yd, io->b, p->cd,
                                            (cudnnConvolutionBwdFilterAlgo_t)algo, ws, wsz, &beta, p->wd, io->y);
        break;
    }
    ts_tensor_release(wst);
    return cudnn_status(dev, cs, fn);
}

// out: (N, K, OH, OW) = conv(x: (N, C, H, W), w: (K, C/g, kh, kw)) through cuDNN, chunk by chunk; in
// 16-bit under conv_half(). Bfloat16 x and out (autocast) go to cuDNN as they are: only w is cast.
static ts_status conv_forward_cudnn(ts_device *dev, cudaStream_t s, const ts_conv2d_geom *g, ts_tensor *out,
                                    const ts_tensor *x, const ts_tensor *w) {
    const int64_t nb = conv_chunk(g), xi = g->C * g->H * g->W, yi = g->K * g->OH * g->OW;
    if (nb == 0) return conv_too_large(dev, g);
    const bool act16 = x->dtype == TS_BF16;
    const size_t es = ts_dtype_size(x->dtype); /* the activations' element size */
    const int hf = conv_half(act16); /* 16-bit passes: TS_CU_BF16 / TS_CU_F16; 0: float32 */
    const bool bf = hf != TS_CU_F32;
    ts_tensor *wb = NULL; /* bfloat16: w's copy */
    if (bf) TS_TRY(half_copy(dev, s, hf, ts__f32(w), numel4(g->K, g->C / g->groups, g->kh, g->kw), &wb));
    cudnnHandle_t h;
    conv_cache *cc;
    ts_status st = cudnn_lock(dev, s, &h, &cc);
    if (st != TS_OK) {
        ts_tensor_release(wb);
        return st;
    }
    for (int64_t n0 = 0; n0 < g->N; n0 += nb) {
        ts_conv2d_geom cg = *g;
        cg.N = TS_MIN(nb, g->N - n0);
        const void *px = (const char *)ts__ptr(x) + (size_t)(n0 * xi) * es;
        void *py = (char *)ts__ptr(out) + (size_t)(n0 * yi) * es;
        ts_tensor *xb = NULL, *yb = NULL; /* bfloat16: the chunk's x and y */
        conv_io io = {px, ts__f32(w), py};
        if (act16) {
            io = (conv_io){px, ts__ptr(wb), py};
        } else if (bf) {
            st = half_copy(dev, s, hf, px, cg.N * xi, &xb);
            if (st == TS_OK) st = ts__scratch_bytes(dev, 2 * (size_t)(cg.N * yi), &yb);
            if (st == TS_OK) io = (conv_io){ts__ptr(xb), ts__ptr(wb), ts__ptr(yb)};
        }
        conv_plan *p;
        if (st == TS_OK) st = plan_get(dev, h, cc, &cg, PASS_FWD, hf, &io, &p);
        if (st == TS_OK) st = plan_run(dev, h, p, &io, 0.0f);
        if (st == TS_OK && bf && !act16) st = from_half(dev, s, hf, py, ts__ptr(yb), cg.N * yi);
        ts_tensor_release(xb);
        ts_tensor_release(yb);
        if (st != TS_OK) break;
    }
    cudnn_unlock(dev);
    ts_tensor_release(wb);
    return st;
}

// out: (N, K, OH, OW) = conv(x: (N, C, H, W), w: (K, C/g, kh, kw)) + b: (K)
static ts_status cuda_conv2d(const ts_conv2d_geom *g, ts_tensor *out, const ts_tensor *x, const ts_tensor *w,
                             const ts_tensor *b) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    const int64_t on = numel4(g->N, g->K, g->OH, g->OW);
    if (on == 0) return TS_OK;
    if (conv_trivial(g))
        TS_TRY(zero_fill(dev, s, out, on));
    else
        TS_TRY(conv_forward_cudnn(dev, s, g, out, x, w));
    if (b) /* bfloat16 out: cuDNN's rounded result plus the bias, rounded again */
        TS_CU_LAUNCH(dev, "spatial.conv2d_bias",
                     ts_cu_bias_add(act_type(out), ts__ptr(out), ts__f32(b), g->N,
                                    g->K, g->OH * g->OW, s));
    return TS_OK;
}

// gx: (N, C, H, W), gw: (K, C/g, kh, kw), gb: (K) from gout: (N, K, OH, OW); each may be NULL. The conv
// passes run in 16 bits under conv_half(); gb is always summed from gout as it is. Bfloat16 gout, x and gx
// (autocast) go to cuDNN as they are; w is cast, the weight gradient comes back as float32.
static ts_status cuda_conv2d_backward(const ts_conv2d_geom *g, const ts_tensor *gout, const ts_tensor *x,
                                      const ts_tensor *w, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb) {
    ts_device *dev = ts__dev(gout);
    TS_CU_BEGIN(dev, s);
    if (gb) TS_TRY(bias_grad(dev, s, g, gout, gb));
    if (!gx && !gw) return TS_OK;
    if (conv_trivial(g)) {
        if (gx) TS_TRY(zero_fill(dev, s, gx, numel4(g->N, g->C, g->H, g->W)));
        if (gw) TS_TRY(zero_fill(dev, s, gw, numel4(g->K, g->C / g->groups, g->kh, g->kw)));
        return TS_OK;
    }
    const int64_t nb = conv_chunk(g), xi = g->C * g->H * g->W, yi = g->K * g->OH * g->OW;
    const int64_t wn = numel4(g->K, g->C / g->groups, g->kh, g->kw);
    if (nb == 0) return conv_too_large(dev, g);
    const bool act16 = x->dtype == TS_BF16;
    const size_t es = ts_dtype_size(x->dtype); /* the activations' element size */
    const int hf = conv_half(act16); /* 16-bit passes: TS_CU_BF16 / TS_CU_F16; 0: float32 */
    const bool bf = hf != TS_CU_F32;
    /* bfloat16: w's copy (for gx); a chunk's weight gradient; with several chunks, its float32 copy */
    ts_tensor *wb = NULL, *dwb = NULL, *dwf = NULL;
    ts_status st = TS_OK;
    if (bf && gx) st = half_copy(dev, s, hf, ts__f32(w), wn, &wb);
    if (st == TS_OK && bf && gw) st = ts__scratch_bytes(dev, 2 * (size_t)wn, &dwb);
    if (st == TS_OK && bf && gw && nb < g->N) st = ts__scratch_bytes(dev, sizeof(float) * (size_t)wn, &dwf);
    cudnnHandle_t h;
    conv_cache *cc;
    if (st == TS_OK) st = cudnn_lock(dev, s, &h, &cc);
    if (st != TS_OK) {
        ts_tensor_release(wb);
        ts_tensor_release(dwb);
        ts_tensor_release(dwf);
        return st;
    }
    for (int64_t n0 = 0; n0 < g->N; n0 += nb) {
        ts_conv2d_geom cg = *g;
        cg.N = TS_MIN(nb, g->N - n0);
        const void *pg = (const char *)ts__ptr(gout) + (size_t)(n0 * yi) * es;
        const void *px = (const char *)ts__ptr(x) + (size_t)(n0 * xi) * es;
        ts_tensor *gob = NULL, *xb = NULL, *dxb = NULL; /* bfloat16: the chunk's gout, x (for gw), gx */
        const void *pgb = pg, *pxb = px; /* the chunk's gout and x as cuDNN reads them */
        conv_plan *p;
        if (bf && !act16) {
            st = half_copy(dev, s, hf, pg, cg.N * yi, &gob);
            if (st == TS_OK && gw) st = half_copy(dev, s, hf, px, cg.N * xi, &xb);
            pgb = gob ? ts__ptr(gob) : NULL;
            pxb = xb ? ts__ptr(xb) : NULL;
        }
        if (st == TS_OK && gx) {
            void *pgx = (char *)ts__ptr(gx) + (size_t)(n0 * xi) * es;
            conv_io io = {ts__f32(w), pg, pgx};
            if (act16) {
                io = (conv_io){ts__ptr(wb), pg, pgx};
            } else if (bf) {
                st = ts__scratch_bytes(dev, 2 * (size_t)(cg.N * xi), &dxb);
                if (st == TS_OK) io = (conv_io){ts__ptr(wb), pgb, ts__ptr(dxb)};
            }
            if (st == TS_OK) st = plan_get(dev, h, cc, &cg, PASS_BWD_DATA, hf, &io, &p);
            if (st == TS_OK) st = plan_run(dev, h, p, &io, 0.0f);
            if (st == TS_OK && bf && !act16) st = from_half(dev, s, hf, pgx, ts__ptr(dxb), cg.N * xi);
        }
        if (st == TS_OK && gw) {
            /* float32: chunks after the first accumulate into gw (beta 1), so a measurement must not write
             * it (y NULL: a scratch). bfloat16: each chunk's gradient into dwb, then converted into gw (the
             * first chunk) or into dwf and added to gw. */
            conv_io io = {px, pg, ts__f32(gw)};
            if (bf) io = (conv_io){pxb, pgb, ts__ptr(dwb)};
            conv_io pio = io;
            if (!bf && n0 > 0) pio.y = NULL;
            st = plan_get(dev, h, cc, &cg, PASS_BWD_FILTER, hf, &pio, &p);
            if (st == TS_OK) st = plan_run(dev, h, p, &io, !bf && n0 > 0 ? 1.0f : 0.0f);
            if (st == TS_OK && bf) {
                if (n0 == 0) {
                    st = from_half(dev, s, hf, ts__f32(gw), ts__ptr(dwb), wn);
                } else {
                    st = from_half(dev, s, hf, ts__f32(dwf), ts__ptr(dwb), wn);
                    if (st == TS_OK)
                        st = ts__cuda_status(dev, ts_cu_axpy(ts__f32(gw), 1.0f, ts__f32(dwf), wn, s),
                                             "spatial.conv2d_backward");
                }
            }
        }
        ts_tensor_release(gob);
        ts_tensor_release(xb);
        ts_tensor_release(dxb);
        if (st != TS_OK) break;
    }
    cudnn_unlock(dev);
    ts_tensor_release(wb);
    ts_tensor_release(dwb);
    ts_tensor_release(dwf);
    return st;
}

/* ================================ pooling ================================ */


static ts_cu_pool_geom pool_geom(const ts_pool2d_geom *g) {
    return (ts_cu_pool_geom){.N = g->N, .C = g->C, .H = g->H, .W = g->W, .OH = g->OH, .OW = g->OW, .kh = g->kh,
                             .kw = g->kw, .sh = g->sh, .sw = g->sw, .ph = g->ph, .pw = g->pw, .dh = g->dh,
                             .dw = g->dw, .exclude_pad = g->exclude_pad};
}

// out, idx: (N, C, OH, OW) <- max over each window of x: (N, C, H, W)
static ts_status cuda_maxpool2d(const ts_pool2d_geom *g, ts_tensor *out, ts_tensor *idx, const ts_tensor *x) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    const ts_cu_pool_geom cg = pool_geom(g);
    TS_CU_LAUNCH(dev, "spatial.maxpool2d", ts_cu_maxpool2d(act_type(x), &cg, ts__ptr(out), (int32_t *)ts__ptr(idx),
                                                           ts__ptr(x), s));
    return TS_OK;
}

// gx: (N, C, H, W) = scatter-add of gout at idx (run as a gather)
static ts_status cuda_maxpool2d_backward(const ts_pool2d_geom *g, ts_tensor *gx, const ts_tensor *gout,
                                         const ts_tensor *idx) {
    ts_device *dev = ts__dev(gx);
    TS_CU_BEGIN(dev, s);
    const ts_cu_pool_geom cg = pool_geom(g);
    TS_CU_LAUNCH(dev, "spatial.maxpool2d_backward",
                 ts_cu_maxpool2d_backward(act_type(gx), &cg, ts__ptr(gx), ts__ptr(gout), (const int32_t *)ts__ptr(idx),
                                          s));
    return TS_OK;
}

// out: (N, C, OH, OW) = window means of x: (N, C, H, W)
static ts_status cuda_avgpool2d(const ts_pool2d_geom *g, ts_tensor *out, const ts_tensor *x) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    const ts_cu_pool_geom cg = pool_geom(g);
    TS_CU_LAUNCH(dev, "spatial.avgpool2d", ts_cu_avgpool2d(&cg, ts__f32(out), ts__f32(x), s));
    return TS_OK;
}

// gx: (N, C, H, W) = each gout spread evenly over its window (run as a gather)
static ts_status cuda_avgpool2d_backward(const ts_pool2d_geom *g, ts_tensor *gx, const ts_tensor *gout) {
    ts_device *dev = ts__dev(gx);
    TS_CU_BEGIN(dev, s);
    const ts_cu_pool_geom cg = pool_geom(g);
    TS_CU_LAUNCH(dev, "spatial.avgpool2d_backward", ts_cu_avgpool2d_backward(&cg, ts__f32(gx), ts__f32(gout), s));
    return TS_OK;
}

// out: (P, OH, OW) = adaptive window means of x: (P, H, W)
static ts_status cuda_adaptive_avgpool2d(ts_tensor *out, const ts_tensor *x, int64_t P, int64_t H, int64_t W,
                                         int64_t OH, int64_t OW) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "spatial.adaptive_avgpool2d",
                 ts_cu_adaptive_avgpool2d(ts__f32(out), ts__f32(x), P, H, W, OH, OW, s));
    return TS_OK;
}

// gx: (P, H, W) = each gout: (P, OH, OW) spread evenly over its window (run as a gather)
static ts_status cuda_adaptive_avgpool2d_backward(ts_tensor *gx, const ts_tensor *gout, int64_t P, int64_t H,
                                                  int64_t W, int64_t OH, int64_t OW) {
    ts_device *dev = ts__dev(gx);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "spatial.adaptive_avgpool2d_backward",
                 ts_cu_adaptive_avgpool2d_backward(ts__f32(gx), ts__f32(gout), P, H, W, OH, OW, s));
    return TS_OK;
}

/* =============================== batchnorm2d =============================== */

// mean, mres (or NULL), invstd: (C) <- x: (N, C, H, W) in double (a sum pass, then squares about the float
// mean); running_mean, running_var: (C) updated in place when given
static ts_status cuda_batchnorm2d_stats(const ts_tensor *x, float eps, float momentum, ts_tensor *mean,
                                        ts_tensor *mres, ts_tensor *invstd, ts_tensor *running_mean,
                                        ts_tensor *running_var) {
    ts_device *dev = ts__dev(x);
    TS_CU_BEGIN(dev, s);
    const int64_t N = x->shape[0], C = x->shape[1], HW = x->shape[2] * x->shape[3], M = N * HW;
    if (C == 0) return TS_OK;
    const int S = ts_cu_chan_splits(N, C, HW);
    ts_tensor *pt = NULL;
    /* part: (C, S, 2) doubles, then mu: (C) doubles */
    TS_TRY(ts__scratch_bytes(dev, sizeof(double) * (size_t)(C * (2 * S + 1)), &pt));
    double *part = (double *)ts__ptr(pt), *mu = part + C * 2 * S;
    const void *px = ts__ptr(x);
    const int dt = act_type(x);
    float *pm = ts__f32(mean);
    ts_status st = ts__cuda_status(dev, ts_cu_chan_partials(TS_CU_CHAN_SUM, dt, px, NULL, NULL, N, C, HW, S, part, s),
                                   "spatial.batchnorm2d_stats");
    if (st == TS_OK)
        st = ts__cuda_status(dev, ts_cu_bn_stats_mean(part, C, S, M, mu, pm, mres ? ts__f32(mres) : NULL, s),
                             "spatial.batchnorm2d_stats");
    if (st == TS_OK)
        st = ts__cuda_status(dev, ts_cu_chan_partials(TS_CU_CHAN_SQDEV, dt, px, NULL, pm, N, C, HW, S, part, s),
                             "spatial.batchnorm2d_stats");
    if (st == TS_OK)
        st = ts__cuda_status(dev,
                             ts_cu_bn_stats_var(part, C, S, M, mu, pm, eps, momentum, ts__f32(invstd),
                                                running_mean ? ts__f32(running_mean) : NULL,
                                                running_var ? ts__f32(running_var) : NULL, s),
                             "spatial.batchnorm2d_stats");
    ts_tensor_release(pt);
    return st;
}

// invstd: (C) = 1 / sqrt(var + eps)
static ts_status cuda_batchnorm2d_invstd(const ts_tensor *var, float eps, ts_tensor *invstd) {
    ts_device *dev = ts__dev(var);
    TS_CU_BEGIN(dev, s);
    TS_CU_LAUNCH(dev, "spatial.batchnorm2d_invstd",
                 ts_cu_bn_invstd(ts__f32(var), eps, ts__f32(invstd), var->shape[0], s));
    return TS_OK;
}

// out: (N, C, H, W) = (x - mean[c] - mres[c]) * invstd[c] * weight[c] + bias[c]
static ts_status cuda_batchnorm2d_apply(ts_tensor *out, const ts_tensor *x, const ts_tensor *mean,
                                        const ts_tensor *mres, const ts_tensor *invstd, const ts_tensor *weight,
                                        const ts_tensor *bias) {
    ts_device *dev = ts__dev(out);
    TS_CU_BEGIN(dev, s);
    const int64_t N = x->shape[0], C = x->shape[1], HW = x->shape[2] * x->shape[3];
    TS_CU_LAUNCH(dev, "spatial.batchnorm2d_apply",
                 ts_cu_bn_apply(act_type(x), ts__ptr(out), ts__ptr(x), ts__f32(mean), mres ? ts__f32(mres) : NULL,
                                ts__f32(invstd), weight ? ts__f32(weight) : NULL, bias ? ts__f32(bias) : NULL, N, C,
                                HW, s));
    return TS_OK;
}

// gx: (N, C, H, W), gw, gb: (C) from gout, x: (N, C, H, W); per-channel sums in double (deterministic)
static ts_status cuda_batchnorm2d_backward(const ts_tensor *gout, const ts_tensor *x, const ts_tensor *mean,
                                           const ts_tensor *mres, const ts_tensor *invstd, const ts_tensor *weight,
                                           bool training, ts_tensor *gx, ts_tensor *gw, ts_tensor *gb) {
    ts_device *dev = ts__dev(x);
    TS_CU_BEGIN(dev, s);
    const int64_t N = x->shape[0], C = x->shape[1], HW = x->shape[2] * x->shape[3], M = N * HW;
    if (C == 0 || (!gx && !gw && !gb)) return TS_OK;
    const bool sums = gw || gb || (gx && training);
    const int S = sums ? ts_cu_chan_splits(N, C, HW) : 1;
    ts_tensor *pt = NULL;
    /* part: (C, S, 2) doubles when sums, then coef: (C, 3) floats */
    const size_t part_bytes = sums ? sizeof(double) * 2 * (size_t)(C * S) : 0;
    TS_TRY(ts__scratch_bytes(dev, part_bytes + sizeof(float) * 3 * (size_t)C, &pt));
    double *part = sums ? (double *)ts__ptr(pt) : NULL;
    float *coef = (float *)((char *)ts__ptr(pt) + part_bytes);
    const void *px = ts__ptr(x), *pg = ts__ptr(gout);
    const float *pm = ts__f32(mean);
    const int dt = act_type(x);
    ts_status st = TS_OK;
    if (sums)
        st = ts__cuda_status(dev, ts_cu_chan_partials(TS_CU_CHAN_DOTDEV, dt, px, pg, pm, N, C, HW, S, part, s),
                             "spatial.batchnorm2d_backward");
    const float *pw = weight ? ts__f32(weight) : NULL;
    float *pgw = gw ? ts__f32(gw) : NULL, *pgb = gb ? ts__f32(gb) : NULL;
    if (st == TS_OK)
        st = ts__cuda_status(dev,
                             ts_cu_bn_backward_coef(part, C, S, M, mres ? ts__f32(mres) : NULL, ts__f32(invstd), pw,
                                                    training, pgw, pgb, coef, s),
                             "spatial.batchnorm2d_backward");
    if (st == TS_OK && gx)
        st = ts__cuda_status(dev, ts_cu_bn_axpbyc(dt, ts__ptr(gx), pg, px, pm, coef, N, C, HW, s),
                             "spatial.batchnorm2d_backward");
    ts_tensor_release(pt);
    return st;
}

const struct ts_kernels_spatial ts_cuda_kernels_spatial = {
    .conv2d = cuda_conv2d,
    .conv2d_backward = cuda_conv2d_backward,
    .maxpool2d = cuda_maxpool2d,
    .maxpool2d_backward = cuda_maxpool2d_backward,
    .avgpool2d = cuda_avgpool2d,
    .avgpool2d_backward = cuda_avgpool2d_backward,
    .batchnorm2d_stats = cuda_batchnorm2d_stats,
    .batchnorm2d_invstd = cuda_batchnorm2d_invstd,
    .batchnorm2d_apply = cuda_batchnorm2d_apply,
    .batchnorm2d_backward = cuda_batchnorm2d_backward,
    .adaptive_avgpool2d = cuda_adaptive_avgpool2d,
    .adaptive_avgpool2d_backward = cuda_adaptive_avgpool2d_backward,
    .bf16 = true,
};
