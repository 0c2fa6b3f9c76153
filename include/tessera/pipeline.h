/*
 * tessera/pipeline.h — DALI-style input pipelines: a sharded reader, JPEG/PNG
 * decoders, augmentation ops and a prefetching executor that hands out ready
 * NCHW float batches (docs/pipeline.md has the whole picture).
 *
 *   reader (one per shard / rank)  ->  worker threads: read file, decode,
 *   random resized crop / resize, flip, crop-mirror-normalize  ->  batch slots
 *   (prefetch_queue_depth ready ahead)  ->  ts_pipeline_next: (B,C,H,W) f32 +
 *   (B) int64 on the pipeline's device.
 *
 * The reader reproduces the semantics of NVIDIA DALI's readers.file
 * (dali/operators/reader/loader/loader.h, file_label_loader.h): file_root /
 * file_list listing order, shard boundaries floor(N*i/S), shard rotation per
 * epoch unless stick_to_shard, pad_last_batch, the random_shuffle buffer of
 * initial_fill samples, shuffle_after_epoch, and DALI's random streams
 * (std::minstd_rand0 seeded through std::seed_seq, std::mt19937 /
 * std::mt19937_64 + std::shuffle as GCC 12's libstdc++ computes them), as
 * DALI 2.4's own fn.readers.file produces them (tests/golden/dali_reader.txt).
 *
 * Threads: a pipeline's calls are made from one thread at a time; its workers
 * are its own. Image and op functions are reentrant.
 */
#ifndef TESSERA_PIPELINE_H
#define TESSERA_PIPELINE_H

#include "data.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- images: 8-bit, interleaved (HWC), rows packed ------------------------------------------- */
typedef struct ts_image {
    uint8_t *data; /* height * width * channels bytes; owned, freed by ts_image_free */
    int width, height, channels; /* channels: 1 (gray) or 3 (RGB) */
    size_t cap;    /* bytes allocated at data (decoders reuse the buffer when it is large enough) */
} ts_image;

#define TS_IMAGE_INIT ((ts_image){NULL, 0, 0, 0, 0})

typedef enum ts_color { TS_COLOR_GRAY = 1, TS_COLOR_RGB = 3 } ts_color;

/* Makes *im a width x height x channels image (contents undefined), reusing its
 * buffer when large enough. */
ts_status ts_image_alloc(ts_image *im, int width, int height, int channels);
/* Frees the pixels and resets *im to TS_IMAGE_INIT (NULL is fine). */
void ts_image_free(ts_image *im);

/* Decodes a JPEG (libjpeg-turbo, TurboJPEG API) or PNG (libspng) held in
 * buf[0..n), recognised by its content, into *out with `color`'s channels
 * (gray from RGB: JPEG's own luma for JPEG, BT.601 weights for PNG; alpha is
 * dropped). out is (re)allocated as by ts_image_alloc. `name` (a path) is put
 * in error messages. TS_ERR_FORMAT names it for an empty buffer, an unknown
 * format, and corrupt or truncated data (libjpeg warnings such as "Premature
 * end of JPEG file" count as errors: the pixels would be made up), and for a
 * header promising more pixels than TS_MAX_IMAGE_PIXELS (default 64 Mpixel)
 * or a progressive JPEG of more than 500 scans. */
ts_status ts_image_decode(const void *buf, size_t n, ts_color color, const char *name, ts_image *out);
/* Reads and decodes a file; TS_ERR_IO when it cannot be read or is not a regular
 * file (a FIFO or device is refused without blocking). */
ts_status ts_image_read(const char *path, ts_color color, ts_image *out);
/* Writes a PNG (libspng; 8-bit gray or RGB). */
ts_status ts_image_write_png(const ts_image *im, const char *path);
/* Writes a baseline JPEG (TurboJPEG; RGB as 4:2:0, gray as one plane); quality 1..100. */
ts_status ts_image_write_jpeg(const ts_image *im, const char *path, int quality);

/* ---- operations ------------------------------------------------------------------------------- */
/* A window of a source image in pixels. */
typedef struct ts_roi {
    int x, y, w, h;
} ts_roi;

/* torchvision's RandomResizedCrop.get_params (and DALI's random_resized_crop):
 * up to 10 tries of an area fraction uniform in [scale[0], scale[1]] and an
 * aspect ratio log-uniform in [ratio[0], ratio[1]]; the first window that fits
 * is placed uniformly; after 10 misses, the central window of the clamped ratio. */
ts_roi ts_random_resized_crop_roi(ts_rng *r, int width, int height, const float scale[2], const float ratio[2]);

/* The central window torchvision's Resize(min(out_w, out_h) / fraction) + CenterCrop((out_h, out_w))
 * keeps of a width x height image (fraction 0.875: ImageNet's evaluation crop), in source pixels. */
ts_roi ts_center_crop_roi(int width, int height, int out_w, int out_h, float fraction); /* (resampled once:
   close to, not equal to, torchvision's two steps; the pipeline's center_crop uses
   ts_image_resize_center_crop_normalize) */

/* torchvision's Resize(size) output for a width x height image: the shorter side `size`, the longer
 * int(size * longer / shorter) (the width is the shorter side when they are equal). */
void ts_resize_shorter_side(int width, int height, int size, int *out_w, int *out_h);

/* torchvision's evaluation transform of a PIL image, exactly: Resize(resize) (ts_resize_shorter_side;
 * Pillow's bilinear resize as Image.resize does it: its antialiasing triangle filter, 22-bit fixed-point
 * weights, the horizontal pass first, both passes rounded to 8 bits), CenterCrop((crop_h, crop_w))
 * (offsets round((size - crop) / 2) with ties to even; zero padding when the crop is larger), ToTensor
 * and Normalize: out[c][y][x] = (v - mean[c]) / std[c], mean and std in pixel units (0..255), as float32
 * CHW planes (channels * crop_h * crop_w floats). ImageNet's evaluation: resize 256, crop 224. The
 * pixels equal torchvision's (tests/test_eval_transform.c compares them on 20 images); the floats
 * differ by float32 rounding. */
ts_status ts_image_resize_center_crop_normalize(const ts_image *src, int resize, int crop_w, int crop_h,
                                                const float *mean, const float *std, float *out);

/* Bilinear resize to out_w x out_h: half-pixel centres (OpenCV's INTER_LINEAR,
 * PyTorch's align_corners=False) when enlarging; when shrinking, the triangle
 * filter widened by the scale (antialiasing, like PIL's BILINEAR and DALI's
 * resize with antialias). dst is (re)allocated; it must not be src. */
ts_status ts_image_resize(const ts_image *src, int out_w, int out_h, ts_image *dst);
/* Mirrors an image in place: horizontally (left-right) and/or vertically. */
void ts_image_flip(ts_image *im, bool horizontal, bool vertical);

/* The fused crop -> resize -> mirror -> normalise step that ends a pipeline:
 * the window roi of src (inside the image) is resized as by ts_image_resize to
 * out_w x out_h, mirrored left-right when `mirror`, and written as float32 CHW
 * planes out[c][y][x] = (v - mean[c]) / std[c] with mean and std in pixel units
 * (0..255, DALI's convention; one value per source channel). out holds
 * channels * out_h * out_w floats. With roi size == output size this is exactly
 * DALI's crop_mirror_normalize (no resampling: every weight is 1). */
ts_status ts_image_crop_resize_normalize(const ts_image *src, const ts_roi *roi, int out_w, int out_h, bool mirror,
                                         const float *mean, const float *std, float *out);
/* DALI's crop_mirror_normalize: the crop_w x crop_h window at (x, y), mirrored,
 * normalised, written as CHW float32. */
ts_status ts_image_crop_mirror_normalize(const ts_image *src, int x, int y, int crop_w, int crop_h, bool mirror,
                                         const float *mean, const float *std, float *out);

/* ---- reader ----------------------------------------------------------------------------------- */
#define TS_MAX_CLASSES (1 << 20) /* the most classes a data set may have (labels 0 .. 2^20 - 1), as --num-classes */

/* The sample source and its order. Exactly one of file_root (alone), file_list
 * (with or without file_root) and idx_dir. */
typedef struct ts_reader_opts {
    const char *file_root; /* one sub-folder per class: classes are the folders in byte order (label =
                              position), files in each are those ending .jpg .jpeg .png (any case), in
                              byte order (DALI's traverse_directories) */
    const char *file_list; /* text file, one "path label" per line (the label is the trailing integer below
                              TS_MAX_CLASSES, the path may hold spaces; blank lines skipped); paths relative
                              to file_root when given, else to the list's folder */
    const char *idx_dir;   /* MNIST-style IDX files (ts_dataset_load_mnist's names) behind the same reader */
    const char *idx_split; /* "train" or "test" (NULL: "train") */
    int shard_id, num_shards;   /* this reader's shard of num_shards (0, 1) */
    bool stick_to_shard;        /* every epoch reads the same shard (default: shard_id + epoch) */
    bool pad_last_batch;        /* repeat the last sample up to ceil(N / num_shards), then to a whole batch */
    bool random_shuffle;        /* DALI's shuffling buffer of initial_fill samples (and a global pre-shuffle) */
    int initial_fill;           /* shuffling buffer size (1024) */
    bool shuffle_after_epoch;   /* reshuffle the whole list every epoch (implies stick_to_shard; excludes
                                   random_shuffle and stick_to_shard, as in DALI) */
    int64_t seed;               /* the shuffling buffer's seed (DALI's reader `seed`) */
    int64_t batch_size;         /* for pad_last_batch: epochs end on a whole batch (1) */
    int64_t shuffle_after_epoch_seed; /* DALI's shuffle_after_epoch_seed: epoch k's order is std::shuffle with
                                         std::mt19937_64((k << 32) + seed); the same on every shard (524287,
                                         DALI's default; 0 is a seed like any other, so start from the INIT) */
} ts_reader_opts;

#define TS_READER_OPTS_INIT \
    ((ts_reader_opts){NULL, NULL, NULL, NULL, 0, 1, false, false, false, 1024, false, 0, 1, 524287})

typedef struct ts_reader ts_reader;

/* Lists the samples (reads IDX files into memory). Errors name the path:
 * TS_ERR_IO for a missing folder or list, TS_ERR_FORMAT for a malformed list
 * line (with its number), no samples, or more shards than samples
 * ("N samples cannot make S shards"); TS_ERR_INVALID_ARG for bad options. */
ts_status ts_reader_new(const ts_reader_opts *o, ts_reader **out);
void ts_reader_free(ts_reader *r); /* NULL is fine */

int64_t ts_reader_size(const ts_reader *r);        /* N: samples in the whole data set */
/* folders (file_root), IDX: the names' count when named (else max label + 1), else max label + 1 */
int64_t ts_reader_num_classes(const ts_reader *r);
/* Name of class `label`: its folder (file_root), the IDX data set's name (DIR/classes.txt or a
 * recognised set's, as ts_dataset_class_name), else NULL. Borrowed. */
const char *ts_reader_class_name(const ts_reader *r, int64_t label);
/* Path of sample i in listing order (NULL for IDX). Borrowed. */
const char *ts_reader_path(const ts_reader *r, int64_t i);
int64_t ts_reader_label(const ts_reader *r, int64_t i);
/* Real samples this shard returns in `epoch`: the shard it reads that epoch,
 * start(v + 1) - start(v) with v = shard_id (stick_to_shard) or
 * (shard_id + epoch) % num_shards. */
int64_t ts_reader_shard_size(const ts_reader *r, int64_t epoch);
/* Samples returned per epoch including padding: with pad_last_batch
 * ceil(ceil(N / S) / batch) * batch, else ts_reader_shard_size. */
int64_t ts_reader_epoch_length(const ts_reader *r, int64_t epoch);

/* DALI's start_index: shard i of s over n samples starts at floor(n * i / s). */
int64_t ts_shard_start(int64_t shard_id, int64_t num_shards, int64_t n);

typedef struct ts_reader_sample {
    int64_t index; /* position in listing order (0..N-1) */
    int64_t label;
    int64_t epoch; /* the epoch the sample belongs to */
    bool pad;      /* a repeat of the epoch's last sample (pad_last_batch) */
    bool epoch_end; /* the last sample (real or pad) of its epoch */
} ts_reader_sample;

/* The next sample of this shard's stream: what DALI's Loader::ReadOne(
 * is_new_batch, is_end_of_batch) returns (the flags only matter with
 * pad_last_batch). The stream never ends. */
void ts_reader_next(ts_reader *r, bool is_new_batch, bool is_end_of_batch, ts_reader_sample *s);
/* Back to the state right after ts_reader_new. */
void ts_reader_reset(ts_reader *r);

/* The reader's shuffling as one choice (what the Python package's `shuffle=` names):
 * TS_SHUFFLE_NONE   listing order (random_shuffle and shuffle_after_epoch off);
 * TS_SHUFFLE_BUFFER DALI's random_shuffle: the initial_fill buffer, seeded by `seed`;
 * TS_SHUFFLE_EPOCH  DALI's shuffle_after_epoch: a new permutation of the whole list every epoch, the same on
 *                   every shard (a partition of it per epoch, as PyTorch's DistributedSampler), seeded by
 *                   shuffle_after_epoch_seed. */
typedef enum ts_shuffle { TS_SHUFFLE_NONE = 0, TS_SHUFFLE_BUFFER = 1, TS_SHUFFLE_EPOCH = 2 } ts_shuffle;
/* "none" | "buffer" | "epoch" -> *out; TS_ERR_INVALID_ARG naming s otherwise. */
ts_status ts_shuffle_parse(const char *s, ts_shuffle *out);
const char *ts_shuffle_name(ts_shuffle s); /* static; NULL for another value */
/* Sets o's random_shuffle and shuffle_after_epoch for s. */
void ts_reader_opts_set_shuffle(ts_reader_opts *o, ts_shuffle s);

/* ---- pipeline (executor) ------------------------------------------------------------------------ */
/* Where JPEG files are decoded (DALI's decoder device): TS_DECODE_CPU on the worker threads;
 * TS_DECODE_MIXED read and their window drawn on the workers, decoded and resampled on the pipeline's
 * device (a CUDA device: nvJPEG; DALI's "mixed") straight into the batch. PNG files and IDX samples
 * are decoded on the workers either way. */
typedef enum ts_decode_device { TS_DECODE_CPU = 0, TS_DECODE_MIXED = 1 } ts_decode_device;
/* "cpu" | "mixed" -> *out; TS_ERR_INVALID_ARG naming s otherwise. */
ts_status ts_decode_device_parse(const char *s, ts_decode_device *out);
/* "cpu", "mixed" (static), NULL for another value. */
const char *ts_decode_device_name(ts_decode_device d);
/* An epoch's last batch when the shard's samples do not fill it (DALI's iterators' LastBatchPolicy):
 * TS_LAST_BATCH_PARTIAL returned smaller; TS_LAST_BATCH_DROP left out (its samples are read, never decoded:
 * PyTorch's drop_last); TS_LAST_BATCH_FILL filled by repeating the last sample (DALI's pad_last_batch:
 * ts_pipeline_new sets reader.pad_last_batch, which also evens the shards out to ceil(N / num_shards)). */
typedef enum ts_last_batch { TS_LAST_BATCH_PARTIAL = 0, TS_LAST_BATCH_DROP = 1, TS_LAST_BATCH_FILL = 2 } ts_last_batch;
/* "partial" | "drop" | "fill" -> *out; TS_ERR_INVALID_ARG naming s otherwise. */
ts_status ts_last_batch_parse(const char *s, ts_last_batch *out);
const char *ts_last_batch_name(ts_last_batch b); /* static; NULL for another value */
/* "rgb" | "gray" -> *out; TS_ERR_INVALID_ARG naming s otherwise. */
ts_status ts_color_parse(const char *s, ts_color *out);
const char *ts_color_name(ts_color c); /* static; NULL for another value */

/* Whether TS_DECODE_MIXED decodes on device d (it has an image decoder and one can be made there: a CUDA
 * device with nvJPEG loaded); false with the reason in why (why_len bytes, may be NULL) otherwise. */
bool ts_mixed_decode_available(ts_device *d, char *why, size_t why_len);

typedef struct ts_pipeline_opts {
    ts_reader_opts reader;    /* its batch_size is replaced by batch_size below */
    int64_t batch_size;       /* samples per batch (64) */
    int num_threads;          /* worker threads reading, decoding and augmenting (2) */
    int prefetch_queue_depth; /* batches prepared ahead of the one the caller holds (2) */
    ts_device *device;        /* where batches land (NULL: the CPU); any registered device */
    ts_color color;           /* output channels: RGB (3) or gray (1) */
    bool skip_corrupt;        /* count and leave out undecodable images instead of failing */
    int out_width, out_height; /* output image size (required) */
    bool random_resized_crop; /* window from ts_random_resized_crop_roi, else the whole image */
    float rrc_scale[2], rrc_ratio[2]; /* (0.08, 1) and (3/4, 4/3) */
    float flip_prob;          /* probability of mirroring a sample left-right (0) */
    float mean[3], std[3];    /* normalisation in pixel units (0 and 255: values in [0, 1]) */
    bool jpeg_scaled_decode;  /* let libjpeg-turbo decode at 1/2, 1/4 or 1/8 size when the window would still
                                 be at least the output size (true; faster for large photographs) */
    int64_t max_pixels;       /* images whose header promises more pixels are corrupt (TS_ERR_FORMAT, or
                                 skipped with skip_corrupt) before any allocation; 0: TS_MAX_IMAGE_PIXELS from
                                 the environment (pixels, or Mpixels with an M suffix), else 64 Mpixel */
    float center_crop;        /* without random_resized_crop: > 0 is torchvision's evaluation transform,
                                 Resize(int(min(out) / center_crop)) + CenterCrop(out), exactly as on a PIL
                                 image (ts_image_resize_center_crop_normalize; 0.875: 256 -> 224, ImageNet's);
                                 images are decoded whole on the host (also under TS_DECODE_MIXED);
                                 0: the whole image resized to the output */
    ts_decode_device decode;  /* TS_DECODE_MIXED: JPEGs decoded on `device` (it must have a device decoder,
                                 else TS_ERR_INVALID_ARG; without nvJPEG there, a warning and the workers
                                 decode); the whole image is decoded (no scaled decode), then resampled as on
                                 the host (TS_DECODE_CPU) */
    ts_last_batch last_batch; /* an epoch's last batch when short of batch_size (TS_LAST_BATCH_PARTIAL) */
} ts_pipeline_opts;

#define TS_PIPELINE_OPTS_INIT                                                                                  \
    ((ts_pipeline_opts){TS_READER_OPTS_INIT, 64, 2, 2, NULL, TS_COLOR_RGB, false, 0, 0, false, {0.08f, 1.0f},  \
                        {0.75f, 1.3333334f}, 0.0f, {0, 0, 0}, {255, 255, 255}, true, 0, 0.0f, TS_DECODE_CPU,     \
                        TS_LAST_BATCH_PARTIAL})

typedef struct ts_pipeline ts_pipeline;

/* Builds the reader (errors as ts_reader_new) and starts num_threads workers,
 * which begin filling prefetch_queue_depth batches right away. opts is copied
 * (its strings too). */
ts_status ts_pipeline_new(const ts_pipeline_opts *opts, ts_pipeline **out);
/* Stops the workers (at any point: a sample being decoded is finished and
 * dropped) and frees everything. NULL is fine. */
void ts_pipeline_free(ts_pipeline *p);

typedef struct ts_batch_info {
    int64_t epoch, batch; /* the batch's epoch and its index in that epoch */
    int64_t size;         /* rows in x and y */
    int64_t real;         /* rows that are not pad_last_batch repeats (the first `real` rows) */
    int64_t skipped;      /* samples of this batch left out as corrupt (skip_corrupt) */
    bool last;            /* the last batch of its epoch */
    bool epoch_end;       /* this call returned no batch: the epoch is over */
} ts_batch_info;

/* The next ready batch: *x (size, C, H, W) float32 and *y (size) int64 on the
 * pipeline's device, borrowed until the next call (or seek/free); a caller
 * that keeps a reference (ts_tensor_retain, a view, a DLPack export) keeps the
 * batch as it is: its memory is never written again while referenced (the
 * pipeline gives that slot new tensors, from the device's caching allocator). Batches of an
 * epoch never mix with the next epoch's samples; the last one may be smaller
 * (unless pad_last_batch). After an epoch's last batch one call returns
 * *x = *y = NULL with info->epoch_end set; the call after that starts the next
 * epoch. info may be NULL. A decoding error (without skip_corrupt) is returned
 * when its batch is reached, naming the file; it is sticky. */
ts_status ts_pipeline_next(ts_pipeline *p, ts_tensor **x, ts_tensor **y, ts_batch_info *info);
/* Waits at most timeout_s seconds (0: does not wait) until ts_pipeline_next can return without waiting
 * for the workers (its batch is ready, an epoch end or an error is due); *ready says whether it can. For
 * callers that must stay responsive during a long decode (Python checks for Ctrl-C between waits).
 * (A batch whose samples were all skipped as corrupt makes ts_pipeline_next wait for the one after.) */
ts_status ts_pipeline_wait(ts_pipeline *p, double timeout_s, bool *ready);
/* Repositions at batch `batch` of `epoch` (resume): rewinds the reader and runs
 * its order forward without decoding. Batches after a seek are the ones an
 * uninterrupted run produces there (augmentation draws depend only on the seed,
 * the epoch and the position in it). */
ts_status ts_pipeline_seek(ts_pipeline *p, int64_t epoch, int64_t batch);
/* Batches `epoch` has (an upper bound with skip_corrupt; whole batches only with TS_LAST_BATCH_DROP). */
int64_t ts_pipeline_num_batches(const ts_pipeline *p, int64_t epoch);
int64_t ts_pipeline_epoch(const ts_pipeline *p);       /* epoch of the next batch */
int64_t ts_pipeline_batch_index(const ts_pipeline *p); /* its index in that epoch */
const ts_reader *ts_pipeline_reader(const ts_pipeline *p); /* borrowed */
/* The listing-order index (ts_reader_path / ts_reader_label's i) of each row of
 * the batch the last ts_pipeline_next returned, in row order; *n (may be NULL)
 * gets the row count. Borrowed like the batch; NULL when no batch is held. */
const int64_t *ts_pipeline_batch_samples(const ts_pipeline *p, int64_t *n);
/* One output sample's shape (C, H, W) into shape; returns 3. */
int ts_pipeline_sample_shape(const ts_pipeline *p, int64_t *shape);
/* Samples decoded and samples skipped as corrupt so far by the workers,
 * counting batches prefetched but not yet returned (and those a seek drops);
 * ts_batch_info.skipped counts a returned batch's. */
void ts_pipeline_counts(const ts_pipeline *p, int64_t *decoded, int64_t *skipped);

/* An in-memory ts_dataset (tessera/data.h) of every sample of opts' shard for
 * epoch 0, decoded and resized (no random crop, no flip, no shuffle) by a
 * pipeline built from opts: evaluation sets in the same folder layout. */
ts_status ts_dataset_load_images(const ts_pipeline_opts *opts, ts_dataset **out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_PIPELINE_H */
