/*
 * core/internal.h — helpers shared by all of the library's source files.
 * Not installed; not part of the public API.
 */
#ifndef TS_CORE_INTERNAL_H
#define TS_CORE_INTERNAL_H

#include "tessera/core.h"
#include "tessera/tensor.h"

#include <stdlib.h>
#include <string.h>

#define TS_UNUSED(x) ((void)(x))
/* Hot loops compiled for x86-64-v4 (AVX-512), AVX2 and baseline x86-64, the copy for this CPU chosen
 * when the library loads (GCC's target_clones, an ifunc): a library built without -march=native
 * (TS_NATIVE=OFF, the default) still runs them at the CPU's width. Elsewhere: one plain copy. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define TS_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define TS_CLONES
#endif

/* Whether this CPU has AVX-512 F, BW and VL (cpuid, asked once per file), for the kernels compiled with
 * __attribute__((target("avx512f,avx512bw,avx512vl"))) beside a portable loop. */
static inline bool ts__cpu_avx512bw(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    static _Atomic int have = -1;
    if (have < 0)
        have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    return have > 0;
#else
    return false;
#endif
}

#define TS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TS_ERRMSG_MAX 1024 /* bytes of a thread's last error message */

/* Propagate a failing status: TS_TRY(ts_foo(...)); */
#define TS_TRY(expr)                        \
    do {                                    \
        ts_status ts__s = (expr);           \
        if (ts__s != TS_OK) return ts__s;   \
    } while (0)

/* In functions with a single `fail:` label and a `ts_status st` variable. */
#define TS_CHECK_GOTO(expr)                 \
    do {                                    \
        st = (expr);                        \
        if (st != TS_OK) goto fail;         \
    } while (0)

/* Argument check that sets an error naming the function. */
#define TS_ARG(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) return ts_error(TS_ERR_INVALID_ARG, __VA_ARGS__);      \
    } while (0)

/* Invariants of the library's own code (the backward engine's counts, a node's
 * slots), checked in debug builds (NDEBUG not defined: Debug and sanitizer
 * builds): a failure prints file:line, the condition and the message to stderr
 * and abort()s. For bugs only; anything a caller can cause gets a ts_status.
 * Release builds (-DNDEBUG) evaluate nothing. Usage: TS_ASSERT(n >= 0, "node %s", name); */
#ifndef NDEBUG
#define TS_ASSERT(cond, ...) ((cond) ? (void)0 : ts__assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__))
#else
#define TS_ASSERT(cond, ...) ((void)sizeof((cond) ? 1 : 0))
#endif
/* Dropout's keep mask into m (n bytes, 1 = keep with probability 1 - p), the draw every backend uses
 * (core/rng.c) so a seed drops the same units on the CPU and on a GPU. */
void ts__rng_keep_mask(ts_rng *r, uint8_t *m, int64_t n, float p);
_Noreturn void ts__assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Allocation that reports failure through the error message (TS_ERR_NOMEM
 * naming the size). Every library allocation on a training step's path goes
 * through these or ts__device_alloc, so failure injection reaches it. */
void *ts__malloc(size_t n);
void *ts__calloc(size_t n, size_t size);
void *ts__realloc(void *p, size_t n); /* on failure p is left allocated */
char *ts__strdup(const char *s);

/* ---- allocation failure injection (tests) ----------------------------------------------
 * Process-wide, all threads. While armed, every call of ts__malloc, ts__calloc,
 * ts__realloc, ts__strdup and ts__device_alloc (device/device.c, above the CPU
 * allocator's cache) is counted; once n of them have succeeded, the next ones
 * fail as a real out-of-memory would (NULL and a TS_ERR_NOMEM message).
 *   ts__alloc_fail_after(n):      every allocation after the first n fails
 *                                 (until re-armed or disarmed); n = -1 disarms.
 *   ts__alloc_fail_once_after(n): only the (n+1)-th fails, later ones succeed.
 *   ts__alloc_failures():         failures injected since the last arming.
 *   ts__alloc_count():            allocations seen since the last arming (arm
 *                                 with LONG_MAX to count a step's allocations).
 * Allocations inside OpenMP and OpenBLAS, and plain malloc calls, are not seen.
 * ts__alloc_injected_failure() is the allocators' check: true when this
 * allocation must fail. */
void ts__alloc_fail_after(long n);
void ts__alloc_fail_once_after(long n);
long ts__alloc_failures(void);
long ts__alloc_count(void);
bool ts__alloc_injected_failure(void);

/* Appends context to the current thread's error message: "ctx: <previous>". */
/* The CPUs this process may run on (its affinity mask; at least 1). */
int ts__cpu_count(void);
/* A launched rank's thread count (core/threads.c): CPUs / local_ranks for the calling thread, unless
 * ts_set_num_threads was called or OMP_NUM_THREADS is set. Returns the count in effect. */
int ts__threads_share(int local_ranks);
/* ts_threads_env_defaults' variables as "NAME=value" strings, NULL-terminated (static). */
const char *const *ts__threads_env_default_list(void);

ts_status ts__error_prefix(ts_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- files (core/file.c) ------------------------------------------------------------------------
 * ts__open_regular: opens path read-only when it is a regular file; a device, FIFO, socket or
 * directory is TS_ERR_IO naming its type and `what` ("a checkpoint file"), without blocking (stat
 * first, then O_NONBLOCK + fstat). *fd is the caller's to close; *size (may be NULL) gets the size.
 * ts__open_listed_regular: the same for a path a directory listing has just reported as a regular
 * file (readdir's d_type DT_REG), in two system calls instead of five: open with O_NOFOLLOW |
 * O_NONBLOCK, then fstat; no stat first. What could have replaced the file since the listing without
 * root's rights is a symbolic link (refused by O_NOFOLLOW), a FIFO (O_NONBLOCK: open does not wait)
 * or another regular file; a link or anything that is not a regular file falls back to
 * ts__open_regular, so the errors are the same. O_NONBLOCK stays set (no effect on regular files).
 * ts__check_write_target: TS_OK when path does not exist or is a regular file, else TS_ERR_IO
 * (writers replace only regular files: never a device node such as /dev/full, a FIFO or a socket).
 * ts__printable: s with bytes outside printable ASCII (and '\') as \xNN escapes, cut with "..." to
 * fit cap; returns buf. For names read from files before they reach a message or a terminal. */
ts_status ts__open_regular(const char *path, const char *what, int *fd, uint64_t *size);
ts_status ts__open_listed_regular(const char *path, const char *what, int *fd, uint64_t *size);
ts_status ts__check_write_target(const char *path, const char *what);
const char *ts__file_type_name(unsigned mode);
const char *ts__printable(const char *s, char *buf, size_t cap);
/* "a, b or c": names[0..n) joined for a message listing the choices (NULL entries skipped), cut to cap;
 * returns buf. */
const char *ts__name_list(const char *const *names, int n, char *buf, size_t cap);
/* Every error message (ts_error, ts__error_prefix) and log line (ts_log) passes through this: control
 * characters (ESC, CR, tabs, DEL; line breaks unless keep_lines) become \xNN in place, cut to cap, so no
 * file name or peer's text can move a terminal's cursor, and no error message spans lines. keep_lines (log
 * messages): line breaks stay, for the library's multi-line reports (the flight recorder's). */
void ts__escape_controls(char *msg, size_t cap, bool keep_lines);
/* A user-given path for a message: ts__printable into buf (TS__PATH_ESC bytes), so a name holding terminal
 * escapes (ESC [ 2 J) or line breaks reaches logs and terminals as \x1b[2J. The library's file-open, read and
 * write errors (core/file.c, checkpoints, IDX files) and the command's "saved"/"wrote" lines use it. */
#define TS__PATH_ESC 1024
static inline const char *ts__path(const char *path, char buf[TS__PATH_ESC]) {
    return ts__printable(path, buf, TS__PATH_ESC);
}
/* ts__write_file_atomic: writes n bytes of data to "<path>.tmp.<pid>" (created exclusively, never
 * through a symbolic link), fsyncs it, renames it over path and fsyncs the directory, so a crash
 * leaves the old file or the new one. Only a regular file (or nothing) at path is replaced. On
 * failure the temporary file is removed and TS_ERR_IO names path, `what` ("an ONNX model") and the
 * errno text. */
ts_status ts__write_file_atomic(const char *path, const char *what, const void *data, size_t n);
/* Atomic replacement of path, the one writer of every output file (checkpoints, safetensors, ONNX,
 * traces, the public ts_outfile_*). ts__atomic_open: path must be a regular file or absent
 * (ts__check_write_target; `what` names the kind of file in messages), "<path>.tmp.<pid>" files of dead
 * writers are removed, and tmp (cap bytes) gets "<path>.tmp.<pid>", created exclusively (never through a
 * symbolic link) and opened as *f. ts__atomic_close: when st is TS_OK and werr (the errno of a failed
 * write, or 0) is 0, flushes, fsyncs and closes f, renames tmp over path and fsyncs the directory;
 * otherwise (or when any of that fails) closes f and removes tmp. Returns st, or TS_ERR_IO naming path
 * and the errno text. */
ts_status ts__atomic_open(const char *path, const char *what, char *tmp, size_t cap, FILE **f);
ts_status ts__atomic_close(const char *path, const char *tmp, FILE *f, ts_status st, int werr);
/* A file written as a run goes (appended rows, a rank's log): path must be a regular file or absent; it is
 * opened with O_NONBLOCK and checked with fstat, so a FIFO or a device put there is refused without
 * blocking or writing into it; append false truncates it. *out: a stdio stream (fclose it), or a
 * descriptor (close it). */
ts_status ts__open_output_stream(const char *path, const char *what, bool append, FILE **out);
ts_status ts__open_output_fd(const char *path, const char *what, bool append, int *out);

#endif /* TS_CORE_INTERNAL_H */
