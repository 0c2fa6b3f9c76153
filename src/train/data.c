/*
 * train/data.c — ts_data_open: the training and evaluation sources behind
 * `tessera train --data PATH` (MNIST-style IDX files, an image folder / file
 * list read by the DALI-style pipeline as the reference models' 1x28x28 input,
 * or a folder of llm.c token shards read as (B, T) windows).
 *
 * Both sets are checked before training: an empty training or test set is an
 * error naming it (not "0 steps" and "0.00%"), a test label that is no class of
 * the training set (IDX: at least its largest label + 1; image folders: test/'s
 * class folders must be train/'s, in the same order, since a label is a
 * folder's position) is an error naming the sample.
 */
#include "core/internal.h"
#include "train/source.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

bool ts_data_is_images(const char *path) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0) return false;
    if (S_ISREG(sb.st_mode)) return true;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/train-images-idx3-ubyte.gz", path);
    if (stat(buf, &sb) == 0) return false;
    snprintf(buf, sizeof buf, "%s/train-images-idx3-ubyte", path);
    if (stat(buf, &sb) == 0) return false;
    /* images need class sub-folders: a folder without any is taken for IDX (its error names the files) */
    DIR *d = opendir(path);
    bool sub = false;
    for (struct dirent *e; d && !sub && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(buf, sizeof buf, "%s/%s", path, e->d_name);
        sub = stat(buf, &sb) == 0 && S_ISDIR(sb.st_mode);
    }
    if (d) closedir(d);
    return sub;
}

bool ts_data_reader_opts(const char *path, const char *split, ts_reader_opts *o, char *buf, size_t n) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        o->file_list = path;
        return true;
    }
    snprintf(buf, n, "%s/%s", path, split);
    bool has = stat(buf, &sb) == 0 && S_ISDIR(sb.st_mode);
    o->file_root = has ? buf : path;
    return has;
}

/* The evaluation source over an in-memory dataset it owns: everything, in order. */
static ts_status eval_source(ts_dataset *ds, const ts_data_opts *o, ts_batch_source **out) {
    ts_dataset_source_opts so = TS_DATASET_SOURCE_OPTS_INIT;
    so.batch_size = o->eval_batch_size;
    so.shuffle = false;
    return ts__batch_source_dataset(ds, true, &so, out);
}

/* Every label of the evaluation set ds is below `classes`, the training set's class count. */
static ts_status check_eval_labels(ts_dataset *ds, int64_t classes, const char *what, const char *train_what) {
    ts_tensor *y = NULL;
    if (ts_dataset_tensors(ds, NULL, &y) != TS_OK || !y) return TS_OK;
    const int64_t *lab = ts_tensor_data(y);
    for (int64_t i = 0; i < ts_tensor_numel(y); i++)
        if (lab[i] < 0 || lab[i] >= classes)
            return ts_error(TS_ERR_FORMAT, "%s: sample %lld has label %lld, but %s has %lld classes (labels 0..%lld)",
                            what, (long long)i, (long long)lab[i], train_what, (long long)classes,
                            (long long)classes - 1);
    return TS_OK;
}

static ts_status open_idx(const ts_data_opts *o, ts_batch_source **train, ts_batch_source **eval) {
    ts_dataset *ds = NULL;
    char what[4200];
    TS_TRY(ts_dataset_load_mnist(o->path, "train", &ds));
    int64_t classes = ts_dataset_num_classes(ds);
    if (ts_dataset_size(ds) == 0) {
        ts_dataset_free(ds);
        return ts_error(TS_ERR_FORMAT, "%s: the training set (train-images-idx3-ubyte) is empty: 0 samples", o->path);
    }
    ts_dataset_source_opts so = TS_DATASET_SOURCE_OPTS_INIT;
    so.batch_size = o->batch_size;
    so.seed = o->seed;
    so.rank = o->rank;
    so.world_size = o->world_size;
    TS_TRY(ts__batch_source_dataset(ds, true, &so, train));
    if (!eval) return TS_OK;
    ts_status st = ts_dataset_load_mnist(o->path, o->eval_on_train ? "train" : "test", &ds);
    snprintf(what, sizeof what, "%s/%s-labels-idx1-ubyte", o->path, o->eval_on_train ? "train" : "t10k");
    if (st == TS_OK && ts_dataset_size(ds) == 0)
        st = ts_error(TS_ERR_FORMAT, "%s: the test set (t10k-images-idx3-ubyte) is empty: 0 samples", o->path);
    if (st == TS_OK) st = check_eval_labels(ds, classes, what, "the training set");
    if (st == TS_OK) {
        st = eval_source(ds, o, eval); /* owns ds from here on, also on failure */
        ds = NULL;
    }
    if (st != TS_OK) {
        ts_dataset_free(ds);
        ts_batch_source_free(*train);
        *train = NULL;
    }
    return st;
}

/* A test folder's classes are the training folder's: label k is folder k of each, so a test folder
 * with other class folders (or the same ones missing one in the middle) would mislabel its samples. */
static ts_status check_eval_classes(const ts_reader *tr, const ts_reader_opts *eval_opts, const char *test_dir,
                                    const char *train_dir) {
    ts_reader *er = NULL;
    ts_reader_opts ro = *eval_opts;
    ro.random_shuffle = ro.shuffle_after_epoch = ro.pad_last_batch = false;
    TS_TRY(ts_reader_new(&ro, &er));
    ts_status st = TS_OK;
    int64_t ne = ts_reader_num_classes(er), nt = ts_reader_num_classes(tr);
    for (int64_t k = 0; k < ne && st == TS_OK; k++) {
        const char *a = ts_reader_class_name(er, k), *b = k < nt ? ts_reader_class_name(tr, k) : NULL;
        if (a && b && strcmp(a, b) == 0) continue;
        char ea[256], eb[256];
        st = ts_error(TS_ERR_FORMAT, "%s: class folder %lld is '%s', but %s's is %s%s%s (%lld classes): the test "
                                     "folder's classes must be the training folder's, in the same order",
                      test_dir, (long long)k, ts__printable(a ? a : "?", ea, sizeof ea), train_dir, b ? "'" : "",
                      b ? ts__printable(b, eb, sizeof eb) : "missing", b ? "'" : "", (long long)nt);
    }
    ts_reader_free(er);
    return st;
}

/* ImageNet's per-channel mean and std (torchvision's references), in [0, 1] units. */
static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f}, imagenet_std[3] = {0.229f, 0.224f, 0.225f};

ts_status ts_data_preprocess(const ts_image *im, int image_size, float *out) {
    TS_ARG(im && out && im->data, "ts_data_preprocess: NULL argument");
    TS_ARG(image_size >= 0 && image_size <= 4096, "ts_data_preprocess: image_size %d", image_size);
    TS_ARG(im->channels == (image_size > 0 ? 3 : 1), "ts_data_preprocess: a %d-channel image for image_size %d "
           "(want %s)", im->channels, image_size, image_size > 0 ? "RGB" : "gray");
    float mean[3], std[3];
    if (image_size == 0) {
        mean[0] = TS_FASHION_MNIST_MEAN * 255.0f;
        std[0] = TS_FASHION_MNIST_STD * 255.0f;
        ts_roi all = {0, 0, im->width, im->height};
        return ts_image_crop_resize_normalize(im, &all, 28, 28, false, mean, std, out);
    }
    for (int c = 0; c < 3; c++) {
        mean[c] = imagenet_mean[c] * 255.0f;
        std[c] = imagenet_std[c] * 255.0f;
    }
    /* torchvision's Resize(int(S / 0.875)) + CenterCrop(S), as the evaluation pipeline (center_crop) */
    const int resize = (int)((double)image_size / (double)TS_EVAL_CENTER_CROP);
    return ts_image_resize_center_crop_normalize(im, resize, image_size, image_size, mean, std, out);
}

/* The evaluation folder of an image folder with a train/ sub-folder: val/ (ImageNet's and torchvision's
 * name), else test/ (what `tessera data export` writes); false when there is neither. */
static bool eval_folder(const char *path, char *buf, size_t n) {
    static const char *const names[] = {"val", "test"};
    for (int i = 0; i < 2; i++) {
        struct stat sb;
        snprintf(buf, n, "%s/%s", path, names[i]);
        if (stat(buf, &sb) == 0 && S_ISDIR(sb.st_mode)) return true;
    }
    return false;
}

/* Images: the training pipeline reads shard `rank` of `world_size` (pad_last_batch
 * when distributed, so every rank runs the same number of steps). The reference
 * input (image_size 0): gray 28x28 normalised as Fashion-MNIST, the evaluation set
 * decoded into memory once. RGB (image_size > 0): random resized crop + flip for
 * training, the central 0.875 window for evaluation, ImageNet's normalisation, and
 * the evaluation set streamed by its own pipeline (ImageNet's is 50,000 photos). */
static ts_status open_images(const ts_data_opts *o, ts_batch_source **train, ts_batch_source **eval) {
    char trainbuf[4096], testbuf[4096];
    ts_pipeline_opts po = TS_PIPELINE_OPTS_INIT;
    bool idx = !ts_data_is_images(o->path), split = false; /* IDX files as RGB images (image_size > 0) */
    if (idx) {
        po.reader.idx_dir = o->path;
        po.reader.idx_split = "train";
    } else {
        split = ts_data_reader_opts(o->path, "train", &po.reader, trainbuf, sizeof trainbuf);
    }
    po.reader.random_shuffle = true;
    po.reader.seed = (int64_t)o->seed;
    po.reader.shard_id = o->rank;
    po.reader.num_shards = o->world_size;
    po.reader.pad_last_batch = o->world_size > 1;
    po.batch_size = o->batch_size;
    po.num_threads = o->threads;
    po.skip_corrupt = o->skip_corrupt;
    if (o->image_size > 0) {
        po.color = TS_COLOR_RGB;
        po.out_width = po.out_height = o->image_size;
        po.random_resized_crop = true;
        po.flip_prob = 0.5f;
        for (int c = 0; c < 3; c++) {
            po.mean[c] = imagenet_mean[c] * 255.0f;
            po.std[c] = imagenet_std[c] * 255.0f;
        }
    } else {
        po.color = TS_COLOR_GRAY;
        po.out_width = po.out_height = 28;
        po.mean[0] = TS_FASHION_MNIST_MEAN * 255.0f;
        po.std[0] = TS_FASHION_MNIST_STD * 255.0f;
    }
    ts_pipeline_opts eo = po; /* evaluation: decoded on the workers, batches on the host (scored there) */
    if (o->mixed_decode) {
        po.decode = TS_DECODE_MIXED;
        po.device = o->mixed_decode;
    }
    ts_pipeline *p = NULL;
    TS_TRY(ts_pipeline_new(&po, &p));
    TS_TRY(ts_batch_source_pipeline(p, train));
    if (!eval) return TS_OK;
    eo.reader.shard_id = 0;
    eo.reader.num_shards = 1;
    eo.reader.pad_last_batch = false;
    eo.reader.random_shuffle = false;
    eo.random_resized_crop = false;
    eo.flip_prob = 0;
    if (idx && !o->eval_on_train) eo.reader.idx_split = "test";
    if (o->image_size > 0) {
        eo.center_crop = TS_EVAL_CENTER_CROP;
        eo.batch_size = o->eval_batch_size;
    }
    if (split && !o->eval_on_train && eval_folder(o->path, testbuf, sizeof testbuf)) eo.reader.file_root = testbuf;
    ts_dataset *ds = NULL;
    ts_pipeline *ep = NULL;
    ts_status st = TS_OK;
    if (eo.reader.file_root == testbuf)
        st = check_eval_classes(ts_pipeline_reader(p), &eo.reader, testbuf, trainbuf);
    if (o->image_size > 0) {
        if (st == TS_OK) st = ts_pipeline_new(&eo, &ep);
        if (st == TS_OK && ts_reader_num_classes(ts_pipeline_reader(ep)) > ts_reader_num_classes(ts_pipeline_reader(p)))
            st = ts_error(TS_ERR_FORMAT, "%s: %lld classes, but the training set has %lld",
                          idx ? o->path : eo.reader.file_list ? eo.reader.file_list : eo.reader.file_root,
                          (long long)ts_reader_num_classes(ts_pipeline_reader(ep)),
                          (long long)ts_reader_num_classes(ts_pipeline_reader(p)));
        if (st == TS_OK) {
            st = ts_batch_source_pipeline(ep, eval); /* owns ep from here on, also on failure */
            ep = NULL;
        }
        ts_pipeline_free(ep);
    } else {
        if (st == TS_OK) st = ts_dataset_load_images(&eo, &ds);
        if (st == TS_OK)
            st = check_eval_labels(ds, ts_reader_num_classes(ts_pipeline_reader(p)),
                                   eo.reader.file_list ? eo.reader.file_list : eo.reader.file_root, "the training set");
        if (st == TS_OK) {
            st = eval_source(ds, o, eval);
            ds = NULL;
        }
    }
    if (st != TS_OK) {
        ts_dataset_free(ds);
        ts_batch_source_free(*train);
        *train = NULL;
    }
    return st;
}

/* ---- token shards ------------------------------------------------------------------------------------ */
static bool has_match(const char *pattern) {
    glob_t g;
    memset(&g, 0, sizeof g);
    bool any = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0;
    globfree(&g);
    return any;
}

bool ts_data_is_tokens(const char *path) {
    char pat[4096];
    struct stat sb;
    if (!path || stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return false;
    snprintf(pat, sizeof pat, "%s/*_train_*.bin", path);
    return has_match(pat);
}

/* The largest token id + 1 over the shards matching pattern. */
static ts_status token_vocab(const char *pattern, int64_t *vocab) {
    glob_t g;
    memset(&g, 0, sizeof g);
    ts_status st = TS_OK;
    if (glob(pattern, 0, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc && st == TS_OK; i++) {
            ts_token_shard *sh = NULL;
            if ((st = ts_token_shard_open(g.gl_pathv[i], 0, &sh)) != TS_OK) break;
            *vocab = TS_MAX(*vocab, ts_token_shard_max_id(sh) + 1);
            ts_token_shard_free(sh);
        }
    globfree(&g);
    return st;
}

/* A source that ends an epoch after `max` batches of another (owned). */
typedef struct limit_src {
    ts_batch_source *in;
    int64_t max, done;
} limit_src;
static int64_t lim_nb(void *impl, int64_t e) {
    limit_src *l = impl;
    return TS_MIN(ts_batch_source_num_batches(l->in, e), l->max);
}
static int64_t lim_ns(void *impl) {
    limit_src *l = impl;
    return ts_batch_source_num_samples(l->in);
}
static ts_status lim_seek(void *impl, int64_t e, int64_t b) {
    limit_src *l = impl;
    l->done = b;
    return ts_batch_source_seek(l->in, e, b);
}
static ts_status lim_next(void *impl, ts_batch *out) {
    limit_src *l = impl;
    if (l->done >= l->max) return TS_OK; /* out->x stays NULL: the epoch is over */
    l->done++;
    return ts_batch_source_next(l->in, out);
}
static int lim_shape(void *impl, int64_t *shape) { return ts_batch_source_sample_shape(((limit_src *)impl)->in, shape); }
static void lim_free(void *impl) {
    ts_batch_source_free(((limit_src *)impl)->in);
    free(impl);
}
static int64_t lim_classes(void *impl) { return ts_batch_source_num_classes(((limit_src *)impl)->in); }
static const ts_batch_source_ops limit_ops = {lim_nb, lim_ns, lim_seek, lim_next, lim_shape, lim_free, lim_classes, NULL};

static ts_status open_tokens(const ts_data_opts *o, ts_batch_source **train, ts_batch_source **eval) {
    char tr[4096], va[4096];
    snprintf(tr, sizeof tr, "%s/*_train_*.bin", o->path);
    snprintf(va, sizeof va, "%s/*_val_*.bin", o->path);
    bool has_val = has_match(va);
    int64_t vocab = 0;
    TS_TRY(token_vocab(tr, &vocab));
    if (has_val) TS_TRY(token_vocab(va, &vocab));
    ts_token_source_opts t = TS_TOKEN_SOURCE_OPTS_INIT;
    t.pattern = tr;
    t.batch_size = o->batch_size;
    t.seq_len = o->seq_len;
    t.rank = o->rank;
    t.world_size = o->world_size;
    t.shuffle = true;
    t.seed = o->seed;
    t.vocab_size = vocab;
    TS_TRY(ts_batch_source_tokens(&t, train));
    if (!eval) return TS_OK;
    t.pattern = has_val ? va : tr;
    t.rank = 0;
    t.world_size = 1;
    t.shuffle = false;
    ts_batch_source *ev = NULL;
    ts_status st = ts_batch_source_tokens(&t, &ev);
    limit_src *l = NULL;
    if (st == TS_OK && o->eval_max_batches > 0 && !(l = ts__calloc(1, sizeof *l))) st = TS_ERR_NOMEM;
    if (l) {
        *l = (limit_src){ev, o->eval_max_batches, 0};
        st = ts_batch_source_new(&limit_ops, l, eval);
    } else if (st == TS_OK) {
        *eval = ev;
    }
    if (st != TS_OK) {
        if (!l) ts_batch_source_free(ev);
        ts_batch_source_free(*train);
        *train = NULL;
    }
    return st;
}

ts_status ts_data_open(const ts_data_opts *o, ts_batch_source **train, ts_batch_source **eval) {
    TS_ARG(o && o->path && train, "ts_data_open: NULL argument");
    *train = NULL;
    if (eval) *eval = NULL;
    TS_ARG(o->batch_size >= 1 && o->eval_batch_size >= 1, "ts_data_open: batch sizes %lld and %lld must be >= 1",
           (long long)o->batch_size, (long long)o->eval_batch_size);
    TS_ARG(o->world_size >= 1 && o->rank >= 0 && o->rank < o->world_size, "ts_data_open: rank %d of %d",
           o->rank, o->world_size);
    struct stat sb;
    if (stat(o->path, &sb) != 0)
        return ts_error(TS_ERR_IO, "%s: %s", o->path, strerror(errno));
    if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode))
        return ts_error(TS_ERR_IO, "%s: not a directory or a file list", o->path);
    TS_ARG(o->image_size >= 0 && o->image_size <= 4096, "ts_data_open: image_size %d is not in [0, 4096]",
           o->image_size);
    if (ts_data_is_tokens(o->path)) {
        TS_ARG(o->seq_len >= 1, "ts_data_open: seq_len %lld must be >= 1 for token data", (long long)o->seq_len);
        return open_tokens(o, train, eval);
    }
    return ts_data_is_images(o->path) || o->image_size > 0 ? open_images(o, train, eval) : open_idx(o, train, eval);
}
