/*
 * tessera/ckpt.h — checkpoints: named tensors plus metadata in one file.
 *
 * A ts_ckpt is an in-memory collection of named entries of four kinds: tensors,
 * int64 values, doubles and byte blobs (RNG state, config JSON, ...). Names are
 * unique per kind. ts_ckpt_save writes it atomically (temporary file, fsync,
 * rename); ts_ckpt_load reads one back, checking magic, version, sizes and a
 * CRC32 of the whole file.
 *
 * File format (version 1, all integers little-endian):
 *   header, 32 bytes:
 *     u8  magic[8] = "TSCKPT\0\1"
 *     u32 version  (TS_CKPT_VERSION)
 *     u32 flags    (0; readers refuse a file with bits they do not know: TS_CKPT_KNOWN_FLAGS)
 *     u64 file_size (bytes, including header and trailer)
 *     u32 nsections
 *     u32 header_crc (zlib crc32 of the 28 bytes before it)
 *   nsections sections, each:
 *     u32 tag ("I64 ", "F64 ", "BLOB", "TENS" as 4 ASCII bytes), u32 count,
 *     u64 payload_bytes, then count records:
 *       every record: u32 name_len, name bytes (no NUL)
 *       I64: i64 value;  F64: f64 value (IEEE bits);  BLOB: u64 len, bytes
 *       TENS: u32 dtype (0 f32, 1 f16, 2 bf16, 3 i64, 4 i32, 5 u8), u32 ndim,
 *             i64 shape[ndim], u64 nbytes, raw little-endian data (C order)
 *     Readers skip sections with unknown tags.
 *   trailer: u32 crc32 of every byte before it.
 */
#ifndef TESSERA_CKPT_H
#define TESSERA_CKPT_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_CKPT_VERSION 1
#define TS_CKPT_KNOWN_FLAGS 0u /* header flag bits this build reads (none is defined yet) */

typedef struct ts_ckpt ts_ckpt;

typedef enum ts_ckpt_kind { TS_CKPT_TENSOR = 0, TS_CKPT_I64, TS_CKPT_F64, TS_CKPT_BYTES } ts_ckpt_kind;

/* A new, empty checkpoint (NULL when out of memory). Free with ts_ckpt_free. */
ts_ckpt *ts_ckpt_new(void);
/* Releases the checkpoint, its copies of names and blobs, and its tensor references. NULL is fine. */
void ts_ckpt_free(ts_ckpt *ck);

/* Adds every tensor of l under the name prefix + l->names[i] (prefix may be NULL
 * or "", e.g. "model." / "optim."). The checkpoint retains the tensors (no copy):
 * their values at ts_ckpt_save time are what is written, so don't modify them in
 * between. Any device; non-CPU tensors are copied to the host when saving. A name
 * that is already present is TS_ERR_INVALID_ARG (nothing is added then). */
ts_status ts_ckpt_add_tensors(ts_ckpt *ck, const char *prefix, const ts_tensor_list *l);

/* Appends (name with prefix stripped, tensor) to *out for every tensor whose name
 * starts with prefix (NULL or "": all), in file order. out gets its own
 * references; after ts_ckpt_load these are contiguous CPU tensors shared with
 * ck (copy them into your parameters with ts_tensor_copy_). */
ts_status ts_ckpt_get_tensors(const ts_ckpt *ck, const char *prefix, ts_tensor_list *out);
/* The tensor named name, or NULL. Borrowed (valid while ck lives). */
ts_tensor *ts_ckpt_find_tensor(const ts_ckpt *ck, const char *name);

/* Metadata. set_* copy name (and data) and replace an existing entry of the same
 * kind and name. get_* return TS_ERR_INVALID_ARG naming the key when it is
 * missing. get_bytes hands out a borrowed pointer valid while ck lives and until
 * the entry is replaced. */
ts_status ts_ckpt_set_i64(ts_ckpt *ck, const char *name, int64_t v);
ts_status ts_ckpt_get_i64(const ts_ckpt *ck, const char *name, int64_t *v);
ts_status ts_ckpt_set_f64(ts_ckpt *ck, const char *name, double v);
ts_status ts_ckpt_get_f64(const ts_ckpt *ck, const char *name, double *v);
ts_status ts_ckpt_set_bytes(ts_ckpt *ck, const char *name, const void *data, size_t len);
ts_status ts_ckpt_get_bytes(const ts_ckpt *ck, const char *name, const void **data, size_t *len);
/* Whether an entry of that kind and name exists. */
bool ts_ckpt_has(const ts_ckpt *ck, ts_ckpt_kind kind, const char *name);

/* Enumeration: number of entries of a kind, and the name of entry i (borrowed;
 * NULL when out of range). Entries keep insertion (or file) order. */
int ts_ckpt_count(const ts_ckpt *ck, ts_ckpt_kind kind);
const char *ts_ckpt_name(const ts_ckpt *ck, ts_ckpt_kind kind, int i);

/* Writes ck to path atomically: the bytes go to "<path>.tmp.<pid>" in the same
 * directory (created exclusively, never through a symbolic link), which is
 * flushed, fsync'ed and renamed over path (then the directory is fsync'ed). On
 * any failure the temporary file is removed, an existing file at path is left
 * untouched, and TS_ERR_IO names the path and the errno text. Only a regular
 * file is ever replaced: a directory, device (/dev/full), FIFO or socket at path
 * is TS_ERR_IO naming its type. Before writing, "<path>.tmp.<pid>" files of
 * writers that died mid-save (no process <pid> exists) are removed. ck is borrowed. */
ts_status ts_ckpt_save(const ts_ckpt *ck, const char *path);

/* Whether ts_ckpt_save(path) can work now, checked without writing a
 * checkpoint: path is a regular file or does not exist (not a device, FIFO,
 * socket or directory), its directory exists, and a file can be created there
 * (the temporary "<path>.tmp.<pid>" is created and removed). TS_ERR_IO naming
 * the path and the reason otherwise. The trainer calls it when it is given a
 * checkpoint path, so a bad path fails at the start, not at the first save. */
ts_status ts_ckpt_check_writable(const char *path);

/* Reads a checkpoint file; *out is new (free with ts_ckpt_free). Errors name the
 * path: TS_ERR_IO (cannot open/read; not a regular file: FIFOs and devices are
 * refused without waiting on them), TS_ERR_FORMAT ("truncated", "bad magic",
 * "checksum mismatch", "trailing data", malformed records naming the offset and
 * the sizes, duplicate names), TS_ERR_UNSUPPORTED (a format version newer than
 * TS_CKPT_VERSION; the message names both; header flag bits outside
 * TS_CKPT_KNOWN_FLAGS, named in hex). Every size in the file is checked
 * against the bytes left before anything is allocated. Names are any bytes but
 * NUL: print them escaped. The file format version read is available from
 * ts_ckpt_version. */
ts_status ts_ckpt_load(const char *path, ts_ckpt **out);
/* ts_ckpt_load without the tensors' data, for looking at many files quickly (a checkpoint folder):
 * the header (its CRC, version, flags and length) and every int64, double and blob entry are read and
 * checked as ts_ckpt_load does; tensor sections are skipped by their length, so the result holds no
 * tensors, and the whole-file CRC is not compared (a damaged file can read here and fail ts_ckpt_load). */
ts_status ts_ckpt_load_meta(const char *path, ts_ckpt **out);
/* Format version of a loaded checkpoint (TS_CKPT_VERSION for new ones). */
uint32_t ts_ckpt_version(const ts_ckpt *ck);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_CKPT_H */
