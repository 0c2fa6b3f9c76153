/*
 * tessera/safetensors.h — reading and writing the safetensors format (Hugging
 * Face's; what safetensors.torch.save_file writes and load_file reads).
 *
 * File format (all integers little-endian):
 *   u64 N                the header's length in bytes (at most TS_SAFETENSORS_MAX_HEADER)
 *   N bytes              a UTF-8 JSON object:
 *                          "__metadata__": {"key": "value", ...}      (optional; string values only)
 *                          "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...
 *                        padded with spaces so that 8 + N is a multiple of 8
 *   the data             each tensor's elements in C order, at [begin, end) counted from the first
 *                        byte after the header; the tensors cover the data exactly, without gaps
 *                        or overlaps, and end - begin = numel x the dtype's size.
 *
 * Writing matches the Python library byte for byte: tensors (and their header
 * entries) are ordered by dtype (largest first, the library's order: U64, I64,
 * F64, F32, U32, I32, BF16, F16, U16, I16, F8*, I8, U8, BOOL), then by name
 * (bytewise); "__metadata__" comes first when given; the header is padded with
 * spaces. Every Tessera dtype is written as itself (F32, F16, BF16, I64, I32,
 * U8).
 *
 * Reading converts what Tessera has no dtype for (ts_dtype):
 *   F32, F16, BF16, I64, I32, U8    as is (F16 and BF16 to F32 with TS_SAFETENSORS_F32)
 *   F64                             to F32 (rounded; an INFO log line says how many tensors)
 *   BOOL                            to U8 (0 or 1)
 *   I8, I16, U16                    to I32;  U32, U64 to I64 (a U64 value above INT64_MAX is an error)
 *   F8_*, F4, F6_*, C64, ...        TS_ERR_UNSUPPORTED naming the tensor and the dtype
 */
#ifndef TESSERA_SAFETENSORS_H
#define TESSERA_SAFETENSORS_H

#include "ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest header a reader accepts (the Python library's limit, 100 MB). */
#define TS_SAFETENSORS_MAX_HEADER 100000000

/* The "__metadata__" map: string keys and values, in insertion (or file) order. */
typedef struct ts_safetensors_meta {
    int n, cap;
    char **keys, **values; /* owned copies */
} ts_safetensors_meta;

#define TS_SAFETENSORS_META_INIT ((ts_safetensors_meta){0, 0, NULL, NULL})
/* Sets key to value (both copied; an existing key's value is replaced). */
ts_status ts_safetensors_meta_set(ts_safetensors_meta *m, const char *key, const char *value);
/* The value of key, or NULL. Borrowed (valid until the map changes). */
const char *ts_safetensors_meta_get(const ts_safetensors_meta *m, const char *key);
/* Frees every entry; leaves an empty map. */
void ts_safetensors_meta_clear(ts_safetensors_meta *m);

/* Writes the tensors of l (borrowed; any device, any strides: written in C
 * order) and meta (may be NULL: no "__metadata__") to path atomically, as
 * ts_ckpt_save does: "<path>.tmp.<pid>", fsync, rename, fsync of the directory;
 * only a regular file is ever replaced. Names must be non-empty, unique, valid
 * UTF-8 and not "__metadata__"; meta's keys and values valid UTF-8
 * (TS_ERR_INVALID_ARG naming the entry). TS_ERR_IO names the path. */
ts_status ts_safetensors_save(const char *path, const ts_tensor_list *l, const ts_safetensors_meta *meta);

enum {
    TS_SAFETENSORS_F32 = 1, /* ts_safetensors_load: F16 and BF16 tensors become F32 (exactly) */
};

/* Reads path and appends its tensors (contiguous CPU tensors, converted as the
 * table at the top says) to *out in the order of their data in the file, and
 * (meta may be NULL) the "__metadata__" entries to *meta. On error nothing is
 * appended to either. The file is checked as the Python library checks it, and
 * more strictly: the header length (at most TS_SAFETENSORS_MAX_HEADER and
 * within the file), UTF-8, JSON syntax (exactly one object; strings with their
 * escapes; no NUL in names), every tensor's dtype, shape (non-negative
 * integers, at most TS_MAX_DIMS dimensions) and data_offsets (two integers),
 * no duplicate names, numel x dtype size == end - begin, and the tensors
 * covering the data exactly (no gap, overlap or trailing byte) — all before
 * any tensor is allocated. Fields other than those three in a tensor's entry
 * are ignored (as by the Python library). Errors name the path and the tensor
 * (printed with \xNN escapes): TS_ERR_IO (cannot open or read; only regular
 * files are read), TS_ERR_FORMAT (malformed), TS_ERR_UNSUPPORTED (a dtype
 * Tessera cannot hold, more than TS_MAX_DIMS dimensions). */
ts_status ts_safetensors_load(const char *path, unsigned flags, ts_tensor_list *out, ts_safetensors_meta *meta);

/* Writes the model state dict of the Tessera checkpoint at ckpt_path (its
 * "model.*" tensors, the prefix stripped: PyTorch's state-dict names, e.g.
 * "0.weight", "1.num_batches_tracked" as I64) to the safetensors file
 * out_path, with "__metadata__" {"format": "pt", "producer": "tessera"} plus
 * "model", "epoch" and "step" when the checkpoint records them (train.*).
 * *ntensors (may be NULL) gets the number written. A checkpoint without
 * model.* tensors is TS_ERR_INVALID_ARG naming it. (Defined in src/train, with the checkpoint layout.) */
ts_status ts_safetensors_export_ckpt(const char *ckpt_path, const char *out_path, int *ntensors);

/* Whether path starts like a safetensors file: a header length of 2 to
 * TS_SAFETENSORS_MAX_HEADER bytes followed by '{' (the file may still be
 * truncated or malformed: ts_safetensors_load says). Reads 9 bytes; only
 * regular files. False for unreadable files. */
bool ts_safetensors_probe(const char *path);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_SAFETENSORS_H */
