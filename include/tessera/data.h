/*
 * tessera/data.h — datasets and the batch loader.
 *
 * A dataset is a table of functions (size, get one sample, optionally get a
 * batch) behind an opaque ts_dataset handle, so in-memory tensors, IDX files
 * (MNIST, Fashion-MNIST) and, later, image folders all feed the same loader.
 * A sample is a float32 array of a fixed shape (e.g. 1x28x28) plus an int64
 * class label.
 *
 * The loader draws batches in a permutation that depends only on (seed,
 * epoch), so a run can be resumed at any batch of any epoch and see exactly
 * the batches it would have seen. It gathers samples into one preallocated
 * batch buffer per loader; the tensors it hands out are borrowed and are
 * overwritten by the next call.
 */
#ifndef TESSERA_DATA_H
#define TESSERA_DATA_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX files ---------------------------------------------------------------------------- */
/* Reads an IDX file of unsigned bytes (magic 0x00000800 | ndim; dtype byte 0x08),
 * gzip-compressed or plain (detected from the content, not the name). expect_ndim
 * > 0 requires that many dimensions (3: images 0x00000803, 1: labels 0x00000801);
 * 0 accepts 1..4. The file must hold exactly the bytes its header promises.
 * On success *out is a new TS_U8 CPU tensor with the file's dimensions (caller
 * releases). Sizes are checked before anything is allocated: a plain file must
 * hold exactly what its header promises, a gzip file at most 1032 times its
 * size (deflate's limit), and no file more than TS_IDX_MAX_BYTES (environment;
 * bytes with an optional k/m/g suffix; default 16 GiB). Errors: TS_ERR_IO
 * (missing, unreadable, not a regular file: FIFOs and devices are refused
 * without blocking), TS_ERR_FORMAT (empty, truncated, bad magic, wrong dtype,
 * trailing data, corrupt gzip, sizes over those limits), each naming path and
 * the sizes. */
ts_status ts_idx_read(const char *path, int expect_ndim, ts_tensor **out);

/* ---- datasets ----------------------------------------------------------------------------- */
typedef struct ts_dataset ts_dataset;

/* Implementation table. impl is the implementation's private state. */
typedef struct ts_dataset_ops {
    /* Number of samples. Required. */
    int64_t (*size)(void *impl);
    /* Writes sample i (0 <= i < size): sample_numel float32 values into x and the
     * label into *y. Required. Must be safe to call from several threads at once. */
    ts_status (*get)(void *impl, int64_t i, float *x, int64_t *y);
    /* Optional: samples idx[0..n) into x (n * sample_numel floats) and y (n labels).
     * NULL: the loader calls get() per sample. */
    ts_status (*get_batch)(void *impl, const int64_t *idx, int64_t n, float *x, int64_t *y);
    /* Optional: change the (x - mean) / std normalisation of the stored samples. */
    ts_status (*set_normalize)(void *impl, float mean, float std);
    /* Optional: releases impl when the dataset is freed. */
    void (*destroy)(void *impl);
} ts_dataset_ops;

/* Wraps an implementation. ops is borrowed (must outlive the dataset, usually a
 * static table); impl is owned by the dataset from now on (ops->destroy(impl)
 * runs in ts_dataset_free, also when this call fails). sample_shape (sample_ndim
 * <= TS_MAX_DIMS - 1 entries) is copied. num_classes may be 0 when unknown. */
ts_status ts_dataset_new(const ts_dataset_ops *ops, void *impl, int sample_ndim, const int64_t *sample_shape,
                         int64_t num_classes, ts_dataset **out);

/* An in-memory dataset over x (N, ...) float32 and y (N) int64 CPU tensors. Both
 * are retained (not copied); don't modify them while the dataset lives. */
ts_status ts_dataset_from_tensors(ts_tensor *x, ts_tensor *y, ts_dataset **out);

/* Default normalisation constants. */
#define TS_FASHION_MNIST_MEAN 0.2860f
#define TS_FASHION_MNIST_STD 0.3530f
#define TS_MNIST_MEAN 0.1307f
#define TS_MNIST_STD 0.3081f

/* Loads MNIST-format IDX files from dir: split "train" reads
 * train-images-idx3-ubyte(.gz) and train-labels-idx1-ubyte(.gz), "test" reads
 * t10k-*; the .gz name is tried first, then the plain name. Pixels become
 * float32 x = (p / 255 - mean) / std with the Fashion-MNIST defaults (change
 * with ts_dataset_set_normalize), stored once as (N, 1, H, W); labels int64.
 * Image/label count mismatches and labels of 255 or more are TS_ERR_FORMAT. The classes are named
 * when DIR/classes.txt names them or the data set is Fashion-MNIST (ts_dataset_class_name); a
 * malformed classes.txt, or one naming fewer classes than the labels use, is TS_ERR_FORMAT.
 * *out is new; free with ts_dataset_free. */
ts_status ts_dataset_load_mnist(const char *dir, const char *split, ts_dataset **out);

/* Releases the dataset (NULL is fine). Loaders using it must be freed first. */
void ts_dataset_free(ts_dataset *ds);

int64_t ts_dataset_size(const ts_dataset *ds);
/* Writes the sample shape (up to TS_MAX_DIMS - 1 entries) and returns its ndim. */
int ts_dataset_sample_shape(const ts_dataset *ds, int64_t *shape);
int64_t ts_dataset_sample_numel(const ts_dataset *ds);
/* Number of classes (max label + 1 for MNIST, or the names' count when it names them; 0 if unknown). */
int64_t ts_dataset_num_classes(const ts_dataset *ds);
/* The name of class `label` (borrowed, valid while ds lives), NULL when the classes are unnamed.
 * ts_dataset_load_mnist names them from DIR/classes.txt (one name per line, label k on line k + 1),
 * else for a data set it recognises by its content (Fashion-MNIST: torchvision's FashionMNIST.classes,
 * "T-shirt/top" ... "Ankle boot"), else leaves them unnamed. */
const char *ts_dataset_class_name(const ts_dataset *ds, int64_t label);
/* Names the classes: n names (copied; each non-empty, without '\n'), n at least the dataset's class count,
 * which becomes n. NULL names and n 0 remove them. */
ts_status ts_dataset_set_class_names(ts_dataset *ds, const char *const *names, int64_t n);
/* Whether class name a (e.g. a checkpoint's) and b (e.g. a data set's) name the same class `label`:
 * equal, or equal in their letters and digits ignoring case and a leading "<label>_" (so the folder
 * "7_sneaker" that `tessera data export` writes for label 7 is Fashion-MNIST's "Sneaker"). */
bool ts_class_names_match(const char *a, const char *b, int64_t label);
/* Copies sample i into x (sample_numel floats) and *y. */
ts_status ts_dataset_get(const ts_dataset *ds, int64_t i, float *x, int64_t *y);
/* Re-normalises the stored samples to (v - mean) / std, where v is the raw value
 * in [0, 1] (exact for datasets made from 8-bit pixels). TS_ERR_UNSUPPORTED for
 * datasets without set_normalize; std must be > 0. */
ts_status ts_dataset_set_normalize(ts_dataset *ds, float mean, float std);
/* The current normalisation (0 and 1 for datasets without one). */
void ts_dataset_get_normalize(const ts_dataset *ds, float *mean, float *std);
/* For in-memory datasets: the whole data as borrowed tensors x (N, ...) float32
 * and y (N) int64; TS_ERR_UNSUPPORTED otherwise. Either out pointer may be NULL. */
ts_status ts_dataset_tensors(const ts_dataset *ds, ts_tensor **x, ts_tensor **y);

/* ---- loader ----------------------------------------------------------------------------------- */
typedef struct ts_loader ts_loader;

typedef struct ts_loader_opts {
    int64_t batch_size; /* >= 1 */
    bool shuffle;       /* false: samples in order 0..N-1 */
    uint64_t seed;      /* the epoch's order is a function of (seed, epoch) only */
    bool drop_last;     /* skip the final batch when it is smaller than batch_size */
    ts_device *device;  /* where the batch tensors live (NULL: CPU) */
} ts_loader_opts;

#define TS_LOADER_OPTS_INIT ((ts_loader_opts){64, true, 0, false, NULL})

/* A loader over ds (borrowed: ds must outlive the loader). opts is copied.
 * Allocates the batch tensors once. Starts at epoch 0, batch 0. */
ts_status ts_loader_new(ts_dataset *ds, const ts_loader_opts *opts, ts_loader **out);
void ts_loader_free(ts_loader *ld); /* NULL is fine */

/* Batches per epoch: ceil(N / B), or floor(N / B) with drop_last (N: the
 * length of the current order, see ts_loader_set_indices). */
int64_t ts_loader_num_batches(const ts_loader *ld);

/* Positions the loader at batch `start_batch` (0 <= start_batch <= num_batches)
 * of `epoch` and computes that epoch's order: the identity without shuffle,
 * else a Fisher-Yates permutation from a generator seeded with
 * seed ^ (epoch * 0x9E3779B97F4A7C15), so the same (seed, epoch) always gives
 * the same order. Use start_batch > 0 to resume mid-epoch. */
ts_status ts_loader_set_epoch(ts_loader *ld, int64_t epoch, int64_t start_batch);
int64_t ts_loader_epoch(const ts_loader *ld);
/* Index of the batch the next ts_loader_next call returns. */
int64_t ts_loader_batch_index(const ts_loader *ld);

/* Makes the current epoch iterate the caller's index list instead of the
 * loader's own order (e.g. this rank's share from ts_dist_sampler_indices in
 * tessera/dist.h): the samples idx[0], idx[1], ... in batches of batch_size,
 * ceil(n / B) batches or floor(n / B) with drop_last, starting at batch
 * `start_batch` (0 <= start_batch <= that count; > 0 resumes mid-epoch).
 * idx (n >= 0 entries, repeats allowed) is copied. Every index must be in
 * [0, dataset size); TS_ERR_INVALID_ARG names the first one that is not, and
 * leaves the loader as it was. The epoch number (ts_loader_epoch) is unchanged;
 * the next ts_loader_set_epoch goes back to the loader's own order. */
ts_status ts_loader_set_indices(ts_loader *ld, const int64_t *idx, int64_t n, int64_t start_batch);

/* Fills the next batch of the current epoch: *x (B, sample shape...) float32 and
 * *y (B) int64, B = batch_size except for a smaller last batch (unless
 * drop_last). Both are borrowed: they stay owned by the loader and are
 * overwritten by the next call (retain or clone to keep them). At the end of the
 * epoch sets *x = *y = NULL and returns TS_OK; call ts_loader_set_epoch to go on. */
ts_status ts_loader_next(ts_loader *ld, ts_tensor **x, ts_tensor **y);

/* The current epoch's sample order (N entries; borrowed, valid until the next
 * ts_loader_set_epoch or ts_loader_set_indices). *n receives N when n is not
 * NULL (after ts_loader_set_indices, N is its n). */
const int64_t *ts_loader_order(const ts_loader *ld, int64_t *n);


/* ---- token shards (llm.c's format) ------------------------------------------------------------------ */
/* A token shard as llm.c's dev/data/data_common.py writes it (write_datafile, "gpt-2" layout) and its
 * llmc/dataloader.h reads it: a header of 256 little-endian int32 -- [0] the magic 20240520, [1] the
 * version 1 (uint16 tokens), [2] the number of tokens n, the rest 0 -- then n uint16 tokens, little-endian.
 * The file is exactly 1024 + 2 n bytes. */
#define TS_TOKENS_MAGIC 20240520
#define TS_TOKENS_VERSION 1
#define TS_TOKENS_HEADER_BYTES 1024
#define TS_TOKENS_MAX ((int64_t)INT32_MAX) /* tokens one shard may hold (the header's int32) */

/* Writes tokens[0..n) as a shard at path, atomically (a temporary file renamed into place: a crash leaves
 * the old file or the new one). Every id must be below 65536 and n at most TS_TOKENS_MAX: otherwise
 * TS_ERR_INVALID_ARG naming the id and its position, and nothing is written. TS_ERR_IO names the path. */
ts_status ts_tokens_write(const char *path, const uint32_t *tokens, int64_t n);

typedef struct ts_token_shard ts_token_shard;
/* Opens a shard (mapped read-only, not copied). vocab_size > 0 also checks every token is below it.
 * Errors name the path: TS_ERR_IO (missing, unreadable, not a regular file), TS_ERR_FORMAT (shorter than
 * the header, bad magic, bad version, a negative count, a size other than 1024 + 2 n bytes with both
 * sizes, a token >= vocab_size with its value and position). *out: free with ts_token_shard_free. */
ts_status ts_token_shard_open(const char *path, int64_t vocab_size, ts_token_shard **out);
void ts_token_shard_free(ts_token_shard *s); /* NULL is fine */
/* The shard's tokens (borrowed: valid while s lives) and their count. */
const uint16_t *ts_token_shard_tokens(const ts_token_shard *s, int64_t *n);
/* The path it was opened from (borrowed). */
const char *ts_token_shard_path(const ts_token_shard *s);
/* The largest token id in the shard (-1 when it holds none): a scan of its tokens. */
int64_t ts_token_shard_max_id(const ts_token_shard *s);

/* ---- tokenizers --------------------------------------------------------------------------------------- */
/* Text to token ids and back. Two kinds:
 *   bytes: id = the byte (0..255), and <|endoftext|> = 256: vocabulary 257, no files.
 *   gpt2:  GPT-2's byte-level BPE from its vocab.json and merges.txt (any vocabulary in that format):
 *          the text is cut into pre-tokens by GPT-2's pattern
 *              's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *          (Unicode letters, numbers and White_Space from the table in src/data/unicode_table.h), each
 *          pre-token's bytes are mapped through bytes_to_unicode and merged pair by pair in merges.txt's
 *          order, exactly as GPT-2's encoder.py. The ids equal tiktoken's and transformers.GPT2Tokenizer's.
 * Special token: <|endoftext|> (when the vocabulary has it). With special = true its text in the input
 * becomes its id, as tiktoken's encode(allowed_special="all") and transformers do, and the text between
 * is encoded on its own; with false it is ordinary text, as tiktoken's encode_ordinary (llm.c's scripts).
 * Invalid UTF-8: each byte of an ill-formed sequence counts as one character that is neither letter,
 * number nor space (it joins a run of punctuation); its byte is encoded as is, so decode(encode(x)) == x
 * for any bytes. A tokenizer caches the ids of words it has seen: use one from one thread at a time. */
typedef struct ts_tokenizer ts_tokenizer;

typedef enum ts_tokenizer_kind { TS_TOKENIZER_BYTES = 0, TS_TOKENIZER_GPT2, TS_TOKENIZER_COUNT } ts_tokenizer_kind;
/* "bytes", "gpt2" (static); NULL for an unknown kind. */
const char *ts_tokenizer_kind_name(ts_tokenizer_kind k);
/* The kind called name; an unknown name is TS_ERR_INVALID_ARG listing the known ones. */
ts_status ts_tokenizer_kind_parse(const char *name, ts_tokenizer_kind *out);

/* The byte tokenizer. */
ts_status ts_tokenizer_bytes(ts_tokenizer **out);
/* GPT-2's BPE from vocab.json (an object token -> id; ids distinct, 0 .. n-1 with no gaps, each of the 256
 * byte characters present) and merges.txt (an optional "#version" line, then "a b" per line; both parts and
 * their join in the vocabulary). Errors are TS_ERR_FORMAT naming the file and the line or byte. */
ts_status ts_tokenizer_gpt2(const char *vocab_json, const char *merges_txt, ts_tokenizer **out);
/* Either kind: bytes, or gpt2 with its two files (the others ignore them). */
ts_status ts_tokenizer_new(ts_tokenizer_kind kind, const char *vocab_json, const char *merges_txt,
                           ts_tokenizer **out);
void ts_tokenizer_free(ts_tokenizer *t); /* NULL is fine */
int64_t ts_tokenizer_vocab_size(const ts_tokenizer *t);
/* The id of <|endoftext|>, -1 when the vocabulary has none. */
int64_t ts_tokenizer_eot(const ts_tokenizer *t);

/* A growing list of ids: start from {0} (NULL, 0, 0); free(ids) when done. */
typedef struct ts_token_list {
    uint32_t *ids;
    int64_t n, cap;
} ts_token_list;

/* Appends the ids of text[0..n) to *out (see above for special). */
ts_status ts_tokenizer_encode(ts_tokenizer *t, const char *text, size_t n, bool special, ts_token_list *out);
/* The bytes of ids[0..n) into *text (malloc'd, NUL-terminated; *len its length without the NUL). An id
 * outside the vocabulary is TS_ERR_INVALID_ARG naming it and its position. */
ts_status ts_tokenizer_decode(const ts_tokenizer *t, const uint32_t *ids, int64_t n, char **text, size_t *len);

/* ---- text files to token shards (`tessera data tokenize`) -------------------------------------------- */
/* Each input file is one document. As llm.c's data scripts, every document is preceded by <|endoftext|>
 * (the tokenizer's EOT) and the documents are concatenated in the order given; the first val_tokens tokens
 * of that stream are the validation split, the rest the training split (a document may straddle them).
 * Each split is cut into shards of at most shard_tokens, written as DIR/<name>_val_000000.bin, ... then
 * DIR/<name>_train_<k>.bin with k going on from the last validation shard (the numbering of llm.c's
 * fineweb.py: one index over both splits). */
typedef struct ts_tokenize_opts {
    const char *const *inputs; /* the text files (borrowed) */
    int num_inputs;
    const char *out_dir;       /* created when missing */
    const char *name;          /* the shards' prefix ("tokens") */
    ts_tokenizer *tok;         /* borrowed */
    double val_fraction;       /* the validation split's share of the tokens, rounded down (0.1) */
    int64_t val_tokens;        /* > 0: exactly this many instead (fewer when there are not as many) */
    int64_t shard_tokens;      /* tokens per shard at most (100000000, fineweb.py's; at most TS_TOKENS_MAX) */
    bool special;              /* <|endoftext|> in the text is the EOT token (false: ordinary text, as llm.c) */
} ts_tokenize_opts;

#define TS_TOKENIZE_OPTS_INIT ((ts_tokenize_opts){NULL, 0, NULL, "tokens", NULL, 0.1, 0, 100000000, false})

typedef struct ts_tokenize_result {
    int64_t bytes;                    /* text read */
    int64_t tokens, val_tokens, train_tokens;
    int val_shards, train_shards;
    int64_t vocab_size;
    double entropy_bits, entropy_nats; /* the unigram entropy of the training tokens, per token */
    double seconds;                   /* time spent encoding */
} ts_tokenize_result;

ts_status ts_tokenize_files(const ts_tokenize_opts *o, ts_tokenize_result *r);
/* The unigram entropy in bits per token of ids[0..n) (the counts' -sum p log2 p; 0 for n == 0). */
double ts_tokens_entropy_bits(const uint16_t *ids, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_DATA_H */
