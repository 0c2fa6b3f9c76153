/*
 * tools/cmd_ckpt.c — `tessera ckpt show FILE`, `tessera ckpt diff A B [--tol X]`,
 * `tessera ckpt export CKPT --out FILE.safetensors` and `tessera ckpt import
 * FILE --model NAME --out CKPT`.
 *
 * show: the file's metadata (int64, float64, byte blobs) and one aligned row per
 * tensor: name, dtype, shape, L2 norm. diff: per tensor the largest absolute
 * difference, tensors present in one file only or with different shapes/dtypes,
 * and a final line with the overall maximum. show and diff read safetensors files
 * too (told by their first bytes): their tensors as they are read (tessera/
 * safetensors.h's dtype table), their "__metadata__" as byte blobs. export: the
 * checkpoint's model state dict as safetensors (ts_safetensors_export_ckpt).
 * import: builds the model, loads a safetensors file or checkpoint into it
 * strictly (ts_weights_load) and saves it as a checkpoint (ts_checkpoint_model_save)
 * that --init-from, eval, predict, export, show and diff read. Exit status: 0 ok / no
 * difference over the tolerance, 1 differences, 2 usage error, unreadable file
 * or weights that do not fit the model.
 *
 * Names come from the file and may hold any byte but NUL: every name is printed
 * through esc(), which turns bytes outside printable ASCII (and '\') into \xNN,
 * so a checkpoint cannot send escape sequences to the terminal.
 */
#include "cmd_ckpt.h"

#include "cli.h"

#include "tessera.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK_MAX(a, b) ((a) > (b) ? (a) : (b))

#define CKPT_USAGE                                                                              \
    "usage: tessera ckpt show FILE\n"                                                           \
    "       tessera ckpt diff A B [--tol X]\n"                                                  \
    "       tessera ckpt export CKPT [--format safetensors] --out FILE\n"                       \
    "       tessera ckpt import FILE --model NAME [--num-classes N] --out CKPT\n"                                 \
    "\n"                                                                                        \
    "  show    list a checkpoint's metadata and tensors (name, dtype, shape, L2 norm)\n"        \
    "  diff    compare the tensors of two checkpoints; exit 1 if any differs by more than\n"    \
    "          the tolerance or the tensor sets differ, 0 otherwise\n"                          \
    "  export  write a checkpoint's model state dict as a safetensors file (PyTorch names)\n"   \
    "  import  load a safetensors file into a model and save it as a checkpoint\n"              \
    "show and diff also read safetensors files.\n"                                              \
    "\n"                                                                                        \
    "Run 'tessera ckpt SUBCOMMAND --help' for details.\n"

#define SHOW_USAGE                                                                              \
    "usage: tessera ckpt show FILE\n"                                                           \
    "\n"                                                                                        \
    "Prints the format version and size of FILE, its int64, float64 and byte-blob metadata,\n"  \
    "and a table of its tensors: name, dtype, shape and L2 norm.\n"                             \
    "Exit status: 0 ok, 2 bad usage or unreadable/corrupt file.\n"

#define DIFF_USAGE                                                                              \
    "usage: tessera ckpt diff A B [--tol X]\n"                                                  \
    "\n"                                                                                        \
    "For each tensor prints the largest absolute elementwise difference between A and B,\n"     \
    "names tensors found in only one file or with different shapes or dtypes, reports\n"        \
    "differing int64/float64 metadata (informational), and ends with the overall maximum.\n"    \
    "  --tol X   allowed absolute difference (default 0)\n"                                     \
    "A safetensors file is compared with a checkpoint's model state dict under the names\n"   \
    "`tessera ckpt export` writes. Exit status: 0 no tensor differs by more than X and both\n"  \
    "files hold the same tensors, 1 otherwise (also when they share no tensor name),\n"        \
    "2 bad usage or unreadable/corrupt file.\n"

/* name with bytes outside printable ASCII (and '\') as \xNN / \\, cut with "..." to fit buf. */
#define ESC_MAX 1024
static const char *esc(const char *name, char *buf) { return cli_printable(name, buf, ESC_MAX); }

static bool is_help(const char *a) { return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0; }

/* Element i of a host buffer of dtype dt, as double. */
static double elem(const void *p, ts_dtype dt, int64_t i) {
    switch (dt) {
    case TS_F32: return ((const float *)p)[i];
    case TS_I64: return (double)((const int64_t *)p)[i];
    case TS_I32: return ((const int32_t *)p)[i];
    case TS_U8: return ((const uint8_t *)p)[i];
    case TS_BF16: {
        uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    case TS_F16: {
        uint16_t h = ((const uint16_t *)p)[i];
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
        return (h & 0x8000) ? -v : v;
    }
    default: return NAN;
    }
}

static double l2_norm(ts_tensor *t) {
    const void *p = ts_tensor_data(t); /* loaded checkpoints hold contiguous CPU tensors */
    double s = 0;
    for (int64_t i = 0; i < ts_tensor_numel(t); i++) {
        double v = elem(p, ts_tensor_dtype(t), i);
        s += v * v;
    }
    return sqrt(s);
}

/* A safetensors file as a checkpoint: its tensors, and its metadata as byte blobs. */
static ts_status load_safetensors(const char *path, ts_ckpt **out) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
    ts_ckpt *ck = ts_ckpt_new();
    ts_status st = ck ? ts_safetensors_load(path, 0, &l, &m) : TS_ERR_NOMEM;
    if (st == TS_OK) st = ts_ckpt_add_tensors(ck, NULL, &l);
    for (int i = 0; i < m.n && st == TS_OK; i++) st = ts_ckpt_set_bytes(ck, m.keys[i], m.values[i], strlen(m.values[i]));
    ts_tensor_list_clear(&l);
    ts_safetensors_meta_clear(&m);
    if (st != TS_OK) {
        ts_ckpt_free(ck);
        return st;
    }
    *out = ck;
    return TS_OK;
}

/* A file's model state dict under the names `ckpt export` writes (a checkpoint's model tensors with their
 * prefix stripped), as a ts_ckpt of tensors: what a safetensors file is compared with. */
static ts_status load_state_dict(const char *path, ts_ckpt **out) {
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_ckpt *ck = ts_ckpt_new();
    ts_status st = ck ? ts_weights_read(path, &l, NULL) : TS_ERR_NOMEM;
    if (st == TS_OK) st = ts_ckpt_add_tensors(ck, NULL, &l);
    ts_tensor_list_clear(&l);
    if (st != TS_OK) {
        ts_ckpt_free(ck);
        return st;
    }
    *out = ck;
    return TS_OK;
}

/* state_dict: only the model's state dict, named as `ckpt export` writes it (load_state_dict). */
static ts_ckpt *load_as(const char *path, bool state_dict) {
    ts_ckpt *ck = NULL;
    ts_status st = state_dict               ? load_state_dict(path, &ck)
                   : ts_safetensors_probe(path) ? load_safetensors(path, &ck)
                                                : ts_ckpt_load(path, &ck);
    if (st != TS_OK) {
        const char *msg = ts_last_error();
        char e[ESC_MAX];
        esc(path, e); /* library messages already start with the path, escaped */
        if (strncmp(msg, e, strlen(e)) == 0)
            fprintf(stderr, "tessera ckpt: %s\n", msg);
        else
            fprintf(stderr, "tessera ckpt: %s: %s\n", e, msg);
        return NULL;
    }
    return ck;
}

static ts_ckpt *load_or_complain(const char *path) { return load_as(path, false); }

static int width_of(const ts_ckpt *ck, ts_ckpt_kind k, int minw) {
    int w = minw;
    char e[ESC_MAX];
    for (int i = 0; i < ts_ckpt_count(ck, k); i++) {
        int n = (int)strlen(esc(ts_ckpt_name(ck, k, i), e));
        if (n > w) w = n;
    }
    return w;
}

/* A printable preview of a blob: its text when it is short printable ASCII. */
static void blob_preview(const unsigned char *p, size_t n, char *out, size_t cap) {
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e) return;
    size_t k = n < cap - 4 ? n : cap - 4;
    memcpy(out, p, k);
    strcpy(out + k, k < n ? "..." : "");
}

static int cmd_show(int argc, char **argv) {
    if (argc == 2 && is_help(argv[1])) {
        fputs(SHOW_USAGE, stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        fputs(SHOW_USAGE, stderr);
        return 2;
    }
    const char *path = argv[1];
    ts_ckpt *ck = load_or_complain(path);
    if (!ck) return 2;
    FILE *f = fopen(path, "rb");
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (f) fclose(f);
    if (ts_safetensors_probe(path))
        printf("%s: safetensors file, %ld bytes\n", path, size);
    else
        printf("%s: Tessera checkpoint, format version %u, %ld bytes\n", path, ts_ckpt_version(ck), size);

    int w = width_of(ck, TS_CKPT_I64, 4);
    w = CK_MAX(w, width_of(ck, TS_CKPT_F64, 4));
    w = CK_MAX(w, width_of(ck, TS_CKPT_BYTES, 4));
    int nmeta = ts_ckpt_count(ck, TS_CKPT_I64) + ts_ckpt_count(ck, TS_CKPT_F64) + ts_ckpt_count(ck, TS_CKPT_BYTES);
    printf("\nmetadata (%d):\n", nmeta);
    char e[ESC_MAX];
    for (int i = 0; i < ts_ckpt_count(ck, TS_CKPT_I64); i++) {
        const char *name = ts_ckpt_name(ck, TS_CKPT_I64, i);
        int64_t v = 0;
        ts_ckpt_get_i64(ck, name, &v);
        printf("  %-*s  int64    %lld\n", w, esc(name, e), (long long)v);
    }
    for (int i = 0; i < ts_ckpt_count(ck, TS_CKPT_F64); i++) {
        const char *name = ts_ckpt_name(ck, TS_CKPT_F64, i);
        double v = 0;
        ts_ckpt_get_f64(ck, name, &v);
        printf("  %-*s  float64  %.17g\n", w, esc(name, e), v);
    }
    for (int i = 0; i < ts_ckpt_count(ck, TS_CKPT_BYTES); i++) {
        const char *name = ts_ckpt_name(ck, TS_CKPT_BYTES, i);
        const void *p = NULL;
        size_t n = 0;
        ts_ckpt_get_bytes(ck, name, &p, &n);
        char prev[64];
        blob_preview(p, n, prev, sizeof prev);
        printf("  %-*s  bytes    %zu bytes%s%s\n", w, esc(name, e), n, prev[0] ? ": " : "", prev);
    }

    int nt = ts_ckpt_count(ck, TS_CKPT_TENSOR);
    int wn = width_of(ck, TS_CKPT_TENSOR, 4), ws = 5;
    int64_t elems = 0;
    size_t bytes = 0;
    char shape[128];
    for (int i = 0; i < nt; i++) {
        ts_tensor *t = ts_ckpt_find_tensor(ck, ts_ckpt_name(ck, TS_CKPT_TENSOR, i));
        int n = (int)strlen(ts_shape_str(ts_tensor_ndim(t), ts_tensor_shape(t), shape, sizeof shape));
        ws = CK_MAX(ws, n);
        elems += ts_tensor_numel(t);
        bytes += ts_tensor_nbytes(t);
    }
    printf("\ntensors (%d, %lld elements, %zu bytes):\n", nt, (long long)elems, bytes);
    if (nt) printf("  %-*s  %-8s  %-*s  %s\n", wn, "name", "dtype", ws, "shape", "L2 norm");
    for (int i = 0; i < nt; i++) {
        const char *name = ts_ckpt_name(ck, TS_CKPT_TENSOR, i);
        ts_tensor *t = ts_ckpt_find_tensor(ck, name);
        printf("  %-*s  %-8s  %-*s  %.6g\n", wn, esc(name, e), ts_dtype_name(ts_tensor_dtype(t)), ws,
               ts_shape_str(ts_tensor_ndim(t), ts_tensor_shape(t), shape, sizeof shape), l2_norm(t));
    }
    ts_ckpt_free(ck);
    return 0;
}

static bool same_shape(ts_tensor *a, ts_tensor *b) {
    if (ts_tensor_ndim(a) != ts_tensor_ndim(b)) return false;
    for (int i = 0; i < ts_tensor_ndim(a); i++)
        if (ts_tensor_dim(a, i) != ts_tensor_dim(b, i)) return false;
    return true;
}

/* Largest |a - b|; NaN against a number counts as infinite, NaN against NaN as equal. */
static double max_abs_diff(ts_tensor *a, ts_tensor *b) {
    const void *pa = ts_tensor_data(a), *pb = ts_tensor_data(b);
    ts_dtype dt = ts_tensor_dtype(a);
    double m = 0;
    for (int64_t i = 0; i < ts_tensor_numel(a); i++) {
        double x = elem(pa, dt, i), y = elem(pb, dt, i), d;
        if (isnan(x) || isnan(y))
            d = (isnan(x) && isnan(y)) ? 0 : INFINITY;
        else if (x == y)
            d = 0; /* also inf == inf */
        else
            d = fabs(x - y);
        if (d > m) m = d;
    }
    return m;
}

static void diff_metadata(const ts_ckpt *a, const ts_ckpt *b) {
    char e[ESC_MAX];
    for (int i = 0; i < ts_ckpt_count(a, TS_CKPT_I64); i++) {
        const char *name = ts_ckpt_name(a, TS_CKPT_I64, i);
        int64_t x = 0, y = 0;
        ts_ckpt_get_i64(a, name, &x);
        if (ts_ckpt_has(b, TS_CKPT_I64, name) && ts_ckpt_get_i64(b, name, &y) == TS_OK && x != y)
            printf("  metadata %s: %lld vs %lld\n", esc(name, e), (long long)x, (long long)y);
    }
    for (int i = 0; i < ts_ckpt_count(a, TS_CKPT_F64); i++) {
        const char *name = ts_ckpt_name(a, TS_CKPT_F64, i);
        double x = 0, y = 0;
        ts_ckpt_get_f64(a, name, &x);
        if (ts_ckpt_has(b, TS_CKPT_F64, name) && ts_ckpt_get_f64(b, name, &y) == TS_OK && memcmp(&x, &y, 8) != 0)
            printf("  metadata %s: %.17g vs %.17g\n", esc(name, e), x, y);
    }
}

static int cmd_diff(int argc, char **argv) {
    const char *files[2] = {NULL, NULL};
    int nf = 0;
    double tol = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (is_help(a)) {
            fputs(DIFF_USAGE, stdout);
            return 0;
        }
        if (strcmp(a, "--tol") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tessera ckpt diff: --tol needs a value\n");
                return 2;
            }
            val = argv[++i];
        } else if (strncmp(a, "--tol=", 6) == 0) {
            val = a + 6;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tessera ckpt diff: unknown option '%s'\n%s", a, DIFF_USAGE);
            return 2;
        } else if (nf < 2) {
            files[nf++] = a;
            continue;
        } else {
            fprintf(stderr, "tessera ckpt diff: too many arguments ('%s')\n%s", a, DIFF_USAGE);
            return 2;
        }
        char *end = NULL;
        errno = 0;
        tol = strtod(val, &end);
        if (!val[0] || *end || errno || !(tol >= 0)) {
            fprintf(stderr, "tessera ckpt diff: --tol '%s' is not a non-negative number\n", val);
            return 2;
        }
    }
    if (nf != 2) {
        fprintf(stderr, "tessera ckpt diff: expected two checkpoint files\n%s", DIFF_USAGE);
        return 2;
    }
    /* a safetensors file against a checkpoint: the checkpoint's state dict, as `ckpt export` names it */
    bool mixed = ts_safetensors_probe(files[0]) != ts_safetensors_probe(files[1]);
    ts_ckpt *a = load_as(files[0], mixed);
    if (!a) return 2;
    ts_ckpt *b = load_as(files[1], mixed);
    if (!b) {
        ts_ckpt_free(a);
        return 2;
    }
    int wn = CK_MAX(width_of(a, TS_CKPT_TENSOR, 4), width_of(b, TS_CKPT_TENSOR, 4));
    char ea[ESC_MAX], eb[ESC_MAX];
    printf("comparing %s (A) with %s (B), tolerance %g%s\n", esc(files[0], ea), esc(files[1], eb), tol,
           mixed ? "; the checkpoint's model state dict, named as ckpt export writes it" : "");
    printf("  %-*s  %s\n", wn, "name", "max abs diff");
    double overall = 0;
    int compared = 0, over = 0, mismatched = 0, shape_mismatched = 0;
    char e[ESC_MAX];
    char sa[128], sb[128];
    for (int i = 0; i < ts_ckpt_count(a, TS_CKPT_TENSOR); i++) {
        const char *name = ts_ckpt_name(a, TS_CKPT_TENSOR, i);
        ts_tensor *ta = ts_ckpt_find_tensor(a, name), *tb = ts_ckpt_find_tensor(b, name);
        if (!tb) {
            printf("  %-*s  only in A\n", wn, esc(name, e));
            mismatched++;
        } else if (!same_shape(ta, tb) || ts_tensor_dtype(ta) != ts_tensor_dtype(tb)) {
            shape_mismatched++;
            printf("  %-*s  differs: %s %s in A, %s %s in B\n", wn, esc(name, e), ts_dtype_name(ts_tensor_dtype(ta)),
                   ts_shape_str(ts_tensor_ndim(ta), ts_tensor_shape(ta), sa, sizeof sa),
                   ts_dtype_name(ts_tensor_dtype(tb)),
                   ts_shape_str(ts_tensor_ndim(tb), ts_tensor_shape(tb), sb, sizeof sb));
            mismatched++;
        } else {
            double d = max_abs_diff(ta, tb);
            compared++;
            if (d > overall) overall = d;
            if (d > tol) over++;
            printf("  %-*s  %.6g%s\n", wn, esc(name, e), d, d > tol ? "  (over tolerance)" : "");
        }
    }
    for (int i = 0; i < ts_ckpt_count(b, TS_CKPT_TENSOR); i++) {
        const char *name = ts_ckpt_name(b, TS_CKPT_TENSOR, i);
        if (!ts_ckpt_find_tensor(a, name)) {
            printf("  %-*s  only in B\n", wn, esc(name, e));
            mismatched++;
        }
    }
    diff_metadata(a, b);
    printf("max abs difference: %.6g over %d tensors; %d over tolerance %g; %d only in one file or mismatched\n",
           overall, compared, over, tol, mismatched);
    int na = ts_ckpt_count(a, TS_CKPT_TENSOR), nb = ts_ckpt_count(b, TS_CKPT_TENSOR);
    bool disjoint = (na || nb) && compared + shape_mismatched == 0; /* nothing was compared: not a success */
    if (disjoint)
        fprintf(stderr, "tessera ckpt diff: %s and %s share no tensor names (%d and %d tensors): nothing was compared\n",
                esc(files[0], ea), esc(files[1], eb), na, nb);
    ts_ckpt_free(a);
    ts_ckpt_free(b);
    return (over || mismatched || disjoint) ? 1 : 0;
}

/* Prints a library error; messages that start with the path already name the file. */
static int complain(const char *cmd, const char *path) {
    const char *msg = ts_last_error();
    char e[ESC_MAX];
    if (path) esc(path, e);
    if (path && strncmp(msg, e, strlen(e)) == 0)
        fprintf(stderr, "tessera ckpt %s: %s\n", cmd, msg);
    else
        fprintf(stderr, "tessera ckpt %s: %s%s%s\n", cmd, path ? e : "", path ? ": " : "", msg);
    return CLI_EXIT_USAGE;
}

static int cmd_export(int argc, char **argv) {
    const char *format = "safetensors", *out = NULL, *pos[2];
    int npos = 0;
    const cli_flag flags[] = {
        {"format", CLI_STRING, &format, "output format: safetensors", 1, 0},
        {"out", CLI_STRING, &out, "the file to write (replaced atomically)", 1, 0},
    };
    const cli_command cmd = {
        "ckpt export", "tessera ckpt export CKPT [--format safetensors] --out FILE",
        "Writes the model state dict of a Tessera checkpoint (its model.* tensors, the prefix stripped:\n"
        "PyTorch's state-dict names) as a safetensors file, with metadata format=pt, producer=tessera and\n"
        "the checkpoint's model, epoch and step. In Python:\n"
        "  model.load_state_dict(safetensors.torch.load_file(FILE))\n"
        "Exit status: 0 written, 2 bad usage or an unreadable checkpoint.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, pos, 2, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos != 1) return cli_usage_error(&cmd, "expected one checkpoint file, got %d", npos);
    if (strcmp(format, "safetensors") != 0) return cli_usage_error(&cmd, "unknown --format '%s' (expected safetensors)", format);
    if (!out) return cli_usage_error(&cmd, "--out FILE is required");
    int n = 0;
    if (ts_safetensors_export_ckpt(pos[0], out, &n) != TS_OK) return complain("export", pos[0]);
    char e1[ESC_MAX], e2[ESC_MAX];
    printf("wrote %d tensors of %s to %s\n", n, esc(pos[0], e1), esc(out, e2));
    return 0;
}

static int cmd_import(int argc, char **argv) {
    const char *model_name = NULL, *out = NULL, *pos[2];
    int64_t classes = 0, image_size = 0;
    int npos = 0;
    const cli_flag flags[] = {
        {"model", CLI_STRING, &model_name, "the model the weights are for (as tessera train --model)", 1, 0},
        {"out", CLI_STRING, &out, "the checkpoint to write (replaced atomically)", 1, 0},
        {"num-classes", CLI_INT, &classes, "the model's classes (0: the rows of the file's output layer, fc.weight for ResNets, the last Linear's for cnn and mlp)", 0, 1 << 20},
        {"image-size", CLI_INT, &image_size, "the input side recorded for tessera eval/predict (0: the model's default)", 0, 4096},
    };
    const cli_command cmd = {
        "ckpt import", "tessera ckpt import FILE --model NAME [--num-classes N] [--image-size S] --out CKPT",
        "Builds the model NAME, loads FILE into it (a safetensors file, e.g. from\n"
        "safetensors.torch.save_file(model.state_dict(), FILE), or a checkpoint) and writes its state dict\n"
        "as a Tessera checkpoint for tessera train --init-from, eval, predict, export, ckpt show and diff.\n"
        "Loading is strict: every missing, unexpected or wrongly shaped tensor is named, and nothing is\n"
        "written unless all fit. F16, BF16 and F64 tensors are read as float32. The class count is the\n"
        "file's: the rows of its output layer (fc.weight for ResNets), unless --num-classes says otherwise.\n"
        "Exit status: 0 written, 2 bad usage, an unreadable file or weights that do not fit the model.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, pos, 2, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos != 1) return cli_usage_error(&cmd, "expected one weights file, got %d", npos);
    if (!model_name || !out) return cli_usage_error(&cmd, "--model NAME and --out CKPT are required");
    ts_checkpoint_model_info info;
    int n = 0;
    if (ts_checkpoint_import(pos[0], model_name, classes, (int)image_size, out, &info, &n) != TS_OK)
        return ts_model_info(model_name, NULL) ? complain("import", pos[0])
                                               : cli_usage_error(&cmd, "--model: %s", ts_last_error());
    char e1[ESC_MAX], e2[ESC_MAX];
    printf("imported %d tensors of %s into %s (%s, %lld classes%s)\n", n, esc(pos[0], e1), esc(out, e2),
           model_name, (long long)info.num_classes, classes ? "" : ", from the file's output layer");
    return 0;
}

int ts_cmd_ckpt(int argc, char **argv) {
    if (argc < 2) {
        fputs(CKPT_USAGE, stderr);
        return 2;
    }
    if (is_help(argv[1])) {
        fputs(CKPT_USAGE, stdout);
        return 0;
    }
    if (strcmp(argv[1], "show") == 0) return cmd_show(argc - 1, argv + 1);
    if (strcmp(argv[1], "diff") == 0) return cmd_diff(argc - 1, argv + 1);
    if (strcmp(argv[1], "export") == 0) return cmd_export(argc - 1, argv + 1);
    if (strcmp(argv[1], "import") == 0) return cmd_import(argc - 1, argv + 1);
    fprintf(stderr, "tessera ckpt: unknown subcommand '%s'\n%s", argv[1], CKPT_USAGE);
    return 2;
}
