/*
 * pipeline/reader.c — the sharded sample reader: DALI's readers.file order,
 * sharding, padding and shuffling over a file folder, a file list or IDX files.
 *
 * Everything that decides which sample comes next is a port of NVIDIA DALI's
 * dali/operators/reader/loader/loader.h (Loader::ReadOne, IncreaseReadSample-
 * Counter, IsNextShardRelative, ShouldPadBatch), loader.cc (start_index,
 * num_samples) and file_label_loader.h (PrepareMetadataImpl, ReadSample via
 * MoveToNextShard, Reset) as DALI 2.4 has them; the listing follows
 * filesystem.cc's traverse_directories. tests/test_pipeline.c checks the order
 * against streams DALI's own fn.readers.file produced. The state below keeps
 * DALI's names so the two can be read side by side:
 *
 *   list[]           image_label_pairs_ (listing indices, in their current order)
 *   current_index    FileLabelLoader::current_index_: next list position read
 *   buf[]            sample_buffer_: a ring of initial_fill read-ahead samples
 *   shards[]         shards_: [start, end) ranges of buffer positions, one per epoch
 *                    being read; random picks come only from the front one, so
 *                    epochs never mix
 *   virtual_shard_id the shard the file reader is in (shard_id + epoch without
 *                    stick_to_shard)
 *
 * The sample is identified by its listing index; the pipeline reads and
 * decodes it later, on a worker thread.
 */
#include "pipeline/pipeline_internal.h"
#include "data/idx_internal.h"
#include "tensor/tensor.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#define DALI_DATALOADER_SEED 524287 /* kDaliDataloaderSeed, dali/core/common.h */

typedef struct buf_entry {
    int64_t counter; /* total_read_sample_counter_ when read */
    int64_t sample;  /* listing index */
} buf_entry;

typedef struct shard_range {
    int64_t start, end;
} shard_range;

struct ts_reader {
    ts_reader_opts o; /* strings point at the owned copies below */
    char *s_root, *s_list, *s_idx, *s_split;
    ts__src_kind kind;
    int64_t n;
    char **paths;     /* n full paths (files) */
    int64_t *labels;  /* n labels */
    bool *listed_reg; /* n: the listing saw a regular file (d_type DT_REG), not a link or an unknown type */
    char **classes;   /* nclasses names: folders (file_root), the IDX set's (ts__idx_class_names), or NULL */
    int64_t nclasses;
    ts_tensor *idx_images; /* (n, h, w) u8 (IDX) */
    int idx_w, idx_h;

    /* DALI state */
    bool shuffle;        /* random_shuffle */
    bool stick;          /* stick_to_shard_ (forced by shuffle_after_epoch) */
    int64_t fill;        /* initial_buffer_fill_ */
    int64_t *base;       /* list after PrepareMetadataImpl's pre-shuffle (for reset) */
    int64_t *list;
    int64_t current_index;
    int64_t current_epoch; /* FileLabelLoader::current_epoch_ (counts Reset calls) */
    ts__minstd e;
    int64_t virtual_shard_id;
    buf_entry *buf;
    int64_t nbuf;
    shard_range *shards; /* deque: shards[head .. head + nshards) */
    int64_t head, nshards, shards_cap;
    bool filled;
    int64_t returned, read_counter, total_read;
    int64_t last_sample;
    int64_t epoch; /* epoch of the samples ReadOne returns now (pops of shards_) */
};

/* ---- shard arithmetic (loader.cc) ------------------------------------------------------------ */
int64_t ts_shard_start(int64_t shard_id, int64_t num_shards, int64_t n) {
    return (int64_t)((uint64_t)n * (uint64_t)shard_id / (uint64_t)num_shards); /* start_index */
}

static int64_t num_samples(int64_t num_shards, int64_t n) { return (n + num_shards - 1) / num_shards; }

/* ---- listing ------------------------------------------------------------------------------------ */
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

typedef struct strvec {
    char **v;
    int64_t n, cap;
} strvec;

/* Appends str (owned; NULL is out of memory). */
static ts_status strvec_push(strvec *s, char *str) {
    if (!str) return TS_ERR_NOMEM;
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        char **v = realloc(s->v, sizeof *v * (size_t)cap);
        if (!v) {
            free(str);
            return ts_error(TS_ERR_NOMEM, "out of memory listing files");
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = str;
    return TS_OK;
}

/* "<t>name": the name after a byte telling whether readdir said DT_REG ('r') or not ('?'), so that
 * sorting by the name sorts by strcmp of what follows. */
static char *typed_name(const char *name, bool reg) {
    size_t n = strlen(name);
    char *p = ts__malloc(n + 2);
    if (!p) return NULL;
    p[0] = reg ? 'r' : '?';
    memcpy(p + 1, name, n + 1);
    return p;
}

static int cmp_typed(const void *a, const void *b) { return strcmp(*(char *const *)a + 1, *(char *const *)b + 1); }

static void strvec_free(strvec *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    *s = (strvec){0};
}

static char *join_path(const char *dir, const char *name) {
    if (!dir || !*dir || name[0] == '/') return ts__strdup(name);
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* The file filters we can decode; DALI's default (kKnownExtensionsGlob) also lists formats Tessera
 * has no decoder for. Matched case-insensitively, as DALI's default case_sensitive_filter=False. */
static const char *const file_filters[] = {"*.jpg", "*.jpeg", "*.png"};

static bool wanted_file(const char *name) {
    for (size_t i = 0; i < TS_ARRAY_LEN(file_filters); i++)
        if (fnmatch(file_filters[i], name, FNM_CASEFOLD) == 0) return true;
    return false;
}

/* filesystem.cc list_subdirectories: every entry but . and .. that stats as a directory, sorted. */
static ts_status list_subdirs(const char *root, strvec *out) {
    DIR *d = opendir(root);
    if (!d) return ts_error(TS_ERR_IO, "%s: cannot open folder: %s", root, strerror(errno));
    ts_status st = TS_OK;
    struct dirent *e;
    while (st == TS_OK && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *full = join_path(root, e->d_name);
        struct stat sb;
        if (!full) {
            st = TS_ERR_NOMEM;
        } else if (stat(full, &sb) != 0) {
            st = ts_error(TS_ERR_IO, "%s: cannot stat during directory traversal: %s", full, strerror(errno));
        } else if (S_ISDIR(sb.st_mode)) {
            st = strvec_push(out, ts__strdup(e->d_name));
        }
        free(full);
    }
    closedir(d);
    if (st == TS_OK && out->n > 1) qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_str);
    return st;
}

/* filesystem.cc list_files: regular files and links (or unknown types) matching a filter, sorted.
 * The names come typed (typed_name): whether each was a regular file when listed. */
static ts_status list_files(const char *dir, strvec *out) {
    DIR *d = opendir(dir);
    if (!d) return ts_error(TS_ERR_IO, "%s: cannot open folder: %s", dir, strerror(errno));
    ts_status st = TS_OK;
    struct dirent *e;
    while (st == TS_OK && (e = readdir(d))) {
        if (e->d_type != DT_REG && e->d_type != DT_LNK && e->d_type != DT_UNKNOWN) continue;
        if (wanted_file(e->d_name)) st = strvec_push(out, typed_name(e->d_name, e->d_type == DT_REG));
    }
    closedir(d);
    if (st == TS_OK && out->n > 1) qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_typed);
    return st;
}

static ts_status grow_samples(ts_reader *r, int64_t *cap) {
    int64_t c = *cap ? 2 * *cap : 1024;
    char **p = realloc(r->paths, sizeof *p * (size_t)c);
    if (p) r->paths = p;
    int64_t *l = realloc(r->labels, sizeof *l * (size_t)c);
    if (l) r->labels = l;
    bool *g = realloc(r->listed_reg, sizeof *g * (size_t)c);
    if (g) r->listed_reg = g;
    if (!p || !l || !g) return ts_error(TS_ERR_NOMEM, "out of memory listing samples");
    *cap = c;
    return TS_OK;
}

static ts_status add_sample(ts_reader *r, int64_t *cap, char *path, int64_t label, bool listed_reg) {
    if (!path) return ts_error(TS_ERR_NOMEM, "out of memory listing samples");
    if (r->n == *cap) {
        ts_status st = grow_samples(r, cap);
        if (st != TS_OK) {
            free(path);
            return st;
        }
    }
    r->paths[r->n] = path;
    r->labels[r->n] = label;
    r->listed_reg[r->n] = listed_reg;
    r->n++;
    return TS_OK;
}

/* traverse_directories: classes are the sorted sub-folders, label = position. */
static ts_status list_root(ts_reader *r) {
    strvec dirs = {0};
    ts_status st = list_subdirs(r->o.file_root, &dirs);
    int64_t cap = 0;
    for (int64_t k = 0; st == TS_OK && k < dirs.n; k++) {
        char *sub = join_path(r->o.file_root, dirs.v[k]);
        strvec files = {0};
        st = sub ? list_files(sub, &files) : TS_ERR_NOMEM;
        for (int64_t f = 0; st == TS_OK && f < files.n; f++)
            st = add_sample(r, &cap, join_path(sub, files.v[f] + 1), k, files.v[f][0] == 'r');
        strvec_free(&files);
        free(sub);
    }
    if (st == TS_OK) {
        r->classes = dirs.v;
        r->nclasses = dirs.n;
        dirs = (strvec){0};
    }
    strvec_free(&dirs);
    return st;
}

/* PrepareMetadataImpl's file_list parser: the label is the trailing integer, the name what precedes
 * it less the whitespace in between; blank lines are skipped. */
static ts_status list_file_list(ts_reader *r) {
    const char *path = r->o.file_list;
    int fd = -1;
    TS_TRY(ts__open_regular(path, "a file list", &fd, NULL)); /* a FIFO is refused, not waited on */
    FILE *f = fdopen(fd, "r");
    if (!f) {
        int e = errno;
        close(fd);
        return ts_error(TS_ERR_IO, "%s: cannot open file list: %s", path, strerror(e));
    }
    char *root = NULL;
    if (r->o.file_root) {
        root = ts__strdup(r->o.file_root);
    } else {
        const char *slash = strrchr(path, '/');
        root = slash ? strndup(path, (size_t)(slash - path)) : ts__strdup("");
    }
    ts_status st = root ? TS_OK : TS_ERR_NOMEM;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int64_t cap = 0, maxl = -1;
    for (long lineno = 1; st == TS_OK && (len = getline(&line, &lcap, f)) >= 0; lineno++) {
        int64_t i = (int64_t)strlen(line) - 1;
        while (i >= 0 && isspace((unsigned char)line[i])) i--;
        int64_t label_end = i + 1;
        if (i < 0) continue;
        while (i >= 0 && isdigit((unsigned char)line[i])) i--;
        int64_t label_start = i + 1;
        while (i >= 0 && isspace((unsigned char)line[i])) i--;
        int64_t name_end = i + 1;
        if (!(name_end > 0 && name_end < label_start && label_start >= 2 && label_end > label_start)) {
            line[label_end] = '\0';
            st = ts_error(TS_ERR_FORMAT, "%s:%ld: expected a file name followed by a label, got '%s'", path, lineno,
                          line);
            break;
        }
        line[label_end] = '\0';
        line[name_end] = '\0';
        errno = 0;
        long long lab = strtoll(line + label_start, NULL, 10);
        if (errno || lab >= TS_MAX_CLASSES) { /* the model gets label + 1 outputs: 2^31 would be 2 TiB */
            st = ts_error(TS_ERR_FORMAT, "%s:%ld: label %s is too large: labels are below %d (at most %d classes)",
                          path, lineno, line + label_start, TS_MAX_CLASSES, TS_MAX_CLASSES);
            break;
        }
        st = add_sample(r, &cap, join_path(root, line), lab, false); /* never listed: stat before opening */
        if (lab > maxl) maxl = lab;
    }
    if (st == TS_OK && ferror(f)) st = ts_error(TS_ERR_IO, "%s: read error: %s", path, strerror(errno));
    free(line);
    free(root);
    fclose(f);
    r->nclasses = maxl + 1;
    return st;
}

static void idx_name(const char *dir, const char *stem, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s.gz", dir, stem);
    if (access(buf, F_OK) == 0) return;
    snprintf(buf, n, "%s/%s", dir, stem);
    if (access(buf, F_OK) == 0) return;
    snprintf(buf, n, "%s/%s.gz", dir, stem); /* the canonical name in the error */
}

static ts_status list_idx(ts_reader *r) {
    const char *split = r->o.idx_split ? r->o.idx_split : "train";
    const char *pre = strcmp(split, "train") == 0 ? "train" : strcmp(split, "test") == 0 ? "t10k" : NULL;
    TS_ARG(pre, "ts_reader_new: idx_split '%s' is not \"train\" or \"test\"", split);
    char ipath[4096], lpath[4096], stem[64];
    snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", pre);
    idx_name(r->o.idx_dir, stem, ipath, sizeof ipath);
    snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", pre);
    idx_name(r->o.idx_dir, stem, lpath, sizeof lpath);
    ts_tensor *lab = NULL;
    TS_TRY(ts_idx_read(ipath, 3, &r->idx_images));
    TS_TRY(ts_idx_read(lpath, 1, &lab));
    int64_t n = r->idx_images->shape[0];
    ts_status st = TS_OK;
    if (lab->shape[0] != n) {
        st = ts_error(TS_ERR_FORMAT, "count mismatch: %s has %lld images but %s has %lld labels", ipath,
                      (long long)n, lpath, (long long)lab->shape[0]);
    } else if (!(r->labels = ts__malloc(sizeof *r->labels * (size_t)(n ? n : 1)))) {
        st = TS_ERR_NOMEM;
    } else {
        const uint8_t *l = ts__ptr(lab);
        int64_t maxl = -1;
        for (int64_t i = 0; i < n; i++) {
            r->labels[i] = l[i];
            if (l[i] > maxl) maxl = l[i];
        }
        r->n = n;
        r->nclasses = maxl + 1;
        r->idx_h = (int)r->idx_images->shape[1];
        r->idx_w = (int)r->idx_images->shape[2];
        char **names = NULL;
        int64_t nn = 0;
        st = ts__idx_class_names(r->o.idx_dir, r->idx_images, lab, maxl, &names, &nn);
        if (st == TS_OK && names) { /* classes.txt may name more classes than the labels use */
            r->classes = names;
            r->nclasses = nn;
        }
    }
    ts_tensor_release(lab);
    return st;
}

/* ---- DALI's Loader ------------------------------------------------------------------------------- */
/* FileLabelLoader::Reset */
static void file_reset(ts_reader *r, bool wrap_to_shard) {
    r->current_index = wrap_to_shard ? ts_shard_start(r->virtual_shard_id, r->o.num_shards, r->n) : 0;
    r->current_epoch++;
    if (r->o.shuffle_after_epoch) { /* std::mt19937_64 g((epoch << 32) + shuffle_after_epoch_seed), DALI 2.4 */
        ts__mt19937_64 g;
        ts__mt19937_64_seed(&g, ((uint64_t)r->current_epoch << 32) + (uint64_t)r->o.shuffle_after_epoch_seed);
        ts__std_shuffle64_i64(r->list, r->n, &g);
    }
}

/* Loader::IsNextShard */
static bool is_next_shard(const ts_reader *r, int64_t current_index) {
    return current_index >= r->n ||
           (r->stick && r->o.shard_id + 1 < r->o.num_shards &&
            current_index >= ts_shard_start(r->o.shard_id + 1, r->o.num_shards, r->n));
}

/* FileLabelLoader::ReadSample: the entry at current_index, then MoveToNextShard. */
static int64_t read_sample(ts_reader *r) {
    int64_t s = r->list[r->current_index++];
    if (is_next_shard(r, r->current_index)) file_reset(r, r->stick);
    return s;
}

/* Loader::IsNextShardRelative */
static bool is_next_shard_relative(const ts_reader *r, int64_t already_read, int64_t vsid) {
    int64_t ci = already_read + ts_shard_start(vsid, r->o.num_shards, r->n);
    return ci >= r->n || (vsid + 1 < r->o.num_shards && ci >= ts_shard_start(vsid + 1, r->o.num_shards, r->n));
}

static shard_range *front(ts_reader *r) { return &r->shards[r->head]; }
static shard_range *back(ts_reader *r) { return &r->shards[r->head + r->nshards - 1]; }

static void push_shard(ts_reader *r, int64_t start) {
    if (r->head + r->nshards == r->shards_cap) { /* slide down; there are at most fill + 2 live ranges */
        memmove(r->shards, r->shards + r->head, sizeof *r->shards * (size_t)r->nshards);
        r->head = 0;
    }
    r->shards[r->head + r->nshards++] = (shard_range){start, start};
}

/* Loader::IncreaseReadSampleCounter */
static void increase_read_counter(ts_reader *r) {
    ++r->read_counter;
    ++r->total_read;
    if (is_next_shard_relative(r, r->read_counter - 1, r->virtual_shard_id)) {
        if (!r->stick) ++r->virtual_shard_id;
        r->read_counter = 1;
        if (r->virtual_shard_id == r->o.num_shards) r->virtual_shard_id = 0;
        push_shard(r, back(r)->end);
    }
}

/* Loader::ShouldPadBatch */
static bool should_pad_batch(const ts_reader *r, bool is_new_batch) {
    return (r->returned < num_samples(r->o.num_shards, r->n) || !is_new_batch) && r->o.pad_last_batch;
}

void ts_reader_next(ts_reader *r, bool is_new_batch, bool is_end_of_batch, ts_reader_sample *s) {
    if (!r->filled) { /* the initial buffer fill */
        push_shard(r, 0);
        for (int64_t i = 0; i < r->fill; i++) {
            r->buf[i] = (buf_entry){r->total_read, read_sample(r)};
            increase_read_counter(r);
            ++back(r)->end;
        }
        r->filled = true;
    }
    s->epoch = r->epoch;
    s->pad = false;
    if (front(r)->start == front(r)->end) {
        if (should_pad_batch(r, is_new_batch)) {
            ++r->returned;
            s->pad = true;
            s->index = r->last_sample;
            goto out;
        }
        r->head++; /* shards_.pop_front(): the epoch is over */
        r->nshards--;
        r->returned = 0;
        s->epoch = ++r->epoch;
    }
    {
        shard_range *fr = front(r);
        int64_t offset = r->shuffle ? ts__minstd_uniform_int(&r->e, 0, (int)(fr->end - fr->start - 1)) : 0;
        int64_t idx = (fr->start + offset) % r->nbuf, at = fr->start % r->nbuf;
        buf_entry tmp = r->buf[idx];
        r->buf[idx] = r->buf[at];
        r->buf[at] = tmp;
        buf_entry sample = {r->total_read, read_sample(r)};
        increase_read_counter(r);
        int64_t bpos = back(r)->end % r->nbuf;
        tmp = r->buf[bpos];
        r->buf[bpos] = sample;
        sample = tmp;
        ++back(r)->end;
        r->last_sample = sample.sample;
        front(r)->start++; /* front(), not fr: push_shard may have moved the deque */
        r->returned++;
        s->index = sample.sample;
    }
out:
    s->label = r->labels[s->index];
    /* the checkpointing branch of ReadOne: IsEpochDepleted() && !ShouldPadBatch(is_end_of_batch) */
    s->epoch_end = front(r)->start == front(r)->end && !should_pad_batch(r, is_end_of_batch);
}

void ts_reader_reset(ts_reader *r) {
    memcpy(r->list, r->base, sizeof *r->list * (size_t)r->n);
    r->current_epoch = 0;
    r->virtual_shard_id = r->o.shard_id;
    ts__minstd_seed_seq(&r->e, r->o.seed); /* std::seed_seq seq({seed_}); e_ = default_random_engine(seq) */
    r->head = r->nshards = 0;
    r->filled = false;
    r->returned = r->read_counter = r->total_read = 0;
    r->last_sample = 0;
    r->epoch = 0;
    file_reset(r, true); /* the Reset(true) that ends PrepareMetadataImpl */
}

/* ---- construction ------------------------------------------------------------------------------- */
void ts_reader_free(ts_reader *r) {
    if (!r) return;
    for (int64_t i = 0; r->paths && i < r->n; i++) free(r->paths[i]);
    free(r->paths);
    free(r->labels);
    free(r->listed_reg);
    for (int64_t i = 0; r->classes && i < r->nclasses; i++) free(r->classes[i]);
    free(r->classes);
    ts_tensor_release(r->idx_images);
    free(r->base);
    free(r->list);
    free(r->buf);
    free(r->shards);
    free(r->s_root);
    free(r->s_list);
    free(r->s_idx);
    free(r->s_split);
    free(r);
}

static ts_status dup_opt(const char *s, char **dst) {
    *dst = NULL;
    if (s && !(*dst = ts__strdup(s))) return TS_ERR_NOMEM;
    return TS_OK;
}

ts_status ts_reader_new(const ts_reader_opts *o, ts_reader **out) {
    TS_ARG(o && out, "ts_reader_new: NULL argument");
    *out = NULL;
    int nsrc = (o->file_root && !o->file_list) + !!o->file_list + !!o->idx_dir;
    TS_ARG(nsrc == 1 && !(o->idx_dir && o->file_root),
           "ts_reader_new: give exactly one of file_root, file_list (optionally with file_root) and idx_dir");
    TS_ARG(o->num_shards >= 1 && o->shard_id >= 0 && o->shard_id < o->num_shards,
           "ts_reader_new: shard_id %d must be in [0, num_shards = %d)", o->shard_id, o->num_shards);
    TS_ARG(o->batch_size >= 1, "ts_reader_new: batch_size %lld must be >= 1", (long long)o->batch_size);
    TS_ARG(!o->random_shuffle || o->initial_fill >= 1, "ts_reader_new: initial_fill %d must be >= 1",
           o->initial_fill);
    TS_ARG(!(o->shuffle_after_epoch && o->stick_to_shard),
           "ts_reader_new: shuffle_after_epoch and stick_to_shard cannot be both true");
    TS_ARG(!(o->shuffle_after_epoch && o->random_shuffle),
           "ts_reader_new: shuffle_after_epoch and random_shuffle cannot be both true");
    ts_reader *r = ts__calloc(1, sizeof *r);
    if (!r) return TS_ERR_NOMEM;
    r->o = *o;
    ts_status st = TS_OK;
    TS_CHECK_GOTO(dup_opt(o->file_root, &r->s_root));
    TS_CHECK_GOTO(dup_opt(o->file_list, &r->s_list));
    TS_CHECK_GOTO(dup_opt(o->idx_dir, &r->s_idx));
    TS_CHECK_GOTO(dup_opt(o->idx_split, &r->s_split));
    r->o.file_root = r->s_root;
    r->o.file_list = r->s_list;
    r->o.idx_dir = r->s_idx;
    r->o.idx_split = r->s_split;
    if (o->idx_dir) {
        r->kind = TS__SRC_IDX;
        TS_CHECK_GOTO(list_idx(r));
    } else {
        r->kind = TS__SRC_FILES;
        TS_CHECK_GOTO(o->file_list ? list_file_list(r) : list_root(r));
    }
    if (r->n == 0) {
        st = ts_error(TS_ERR_FORMAT, "%s: no samples found (files ending .jpg, .jpeg or .png in class sub-folders)",
                      o->file_list ? o->file_list : o->file_root ? o->file_root : o->idx_dir);
        goto fail;
    }
    if (o->num_shards > r->n) { /* PrepareMetadata's DALI_ENFORCE(num_shards_ <= Size()) */
        st = ts_error(TS_ERR_INVALID_ARG, "%s: %lld samples cannot make %d shards (num_shards must be <= the number of samples)",
                      o->file_list ? o->file_list : o->file_root ? o->file_root : o->idx_dir, (long long)r->n,
                      o->num_shards);
        goto fail;
    }
    r->shuffle = o->random_shuffle;
    r->stick = o->stick_to_shard || o->shuffle_after_epoch;
    r->fill = r->shuffle ? o->initial_fill : 1;
    r->nbuf = r->fill;
    r->shards_cap = 2 * (r->fill + 4);
    r->base = ts__malloc(sizeof *r->base * (size_t)r->n);
    r->list = ts__malloc(sizeof *r->list * (size_t)r->n);
    r->buf = ts__malloc(sizeof *r->buf * (size_t)r->nbuf);
    r->shards = ts__malloc(sizeof *r->shards * (size_t)r->shards_cap);
    if (!r->base || !r->list || !r->buf || !r->shards) {
        st = TS_ERR_NOMEM;
        goto fail;
    }
    for (int64_t i = 0; i < r->n; i++) r->base[i] = i;
    if (r->shuffle) { /* the same permutation on every shard: std::mt19937 g(kDaliDataloaderSeed) */
        ts__mt19937 g;
        ts__mt19937_seed(&g, DALI_DATALOADER_SEED);
        ts__std_shuffle_i64(r->base, r->n, &g);
    }
    ts_reader_reset(r);
    *out = r;
    return TS_OK;
fail:
    ts_reader_free(r);
    return st;
}

/* ---- queries ------------------------------------------------------------------------------------ */
int64_t ts_reader_size(const ts_reader *r) { return r->n; }
int64_t ts_reader_num_classes(const ts_reader *r) { return r->nclasses; }
const char *ts_reader_class_name(const ts_reader *r, int64_t label) {
    return r->classes && label >= 0 && label < r->nclasses ? r->classes[label] : NULL;
}
const char *ts_reader_path(const ts_reader *r, int64_t i) {
    return r->paths && i >= 0 && i < r->n ? r->paths[i] : NULL;
}
int64_t ts_reader_label(const ts_reader *r, int64_t i) { return i >= 0 && i < r->n ? r->labels[i] : -1; }
bool ts__reader_listed_regular(const ts_reader *r, int64_t i) {
    return r->listed_reg && i >= 0 && i < r->n && r->listed_reg[i];
}

int64_t ts_reader_shard_size(const ts_reader *r, int64_t epoch) {
    int64_t S = r->o.num_shards, v = r->stick ? r->o.shard_id : (r->o.shard_id + epoch) % S;
    return ts_shard_start(v + 1, S, r->n) - ts_shard_start(v, S, r->n);
}

int64_t ts_reader_epoch_length(const ts_reader *r, int64_t epoch) {
    if (!r->o.pad_last_batch) return ts_reader_shard_size(r, epoch);
    int64_t ns = num_samples(r->o.num_shards, r->n), B = r->o.batch_size;
    return (ns + B - 1) / B * B;
}

ts__src_kind ts__reader_kind(const ts_reader *r) { return r->kind; }
const ts_reader_opts *ts__reader_opts(const ts_reader *r) { return &r->o; }

const uint8_t *ts__reader_idx_pixels(const ts_reader *r, int64_t i, int *w, int *h) {
    *w = r->idx_w;
    *h = r->idx_h;
    return (const uint8_t *)ts__ptr(r->idx_images) + (size_t)i * (size_t)r->idx_w * (size_t)r->idx_h;
}
