/*
 * tools/cmd_data.c — `tessera data`: export an IDX data set (Fashion-MNIST,
 * MNIST) as a folder of JPEG/PNG images, one sub-folder per class, and show
 * one decoded, augmented pipeline batch as a labelled grid (seed 000's
 * show_images); encode text into llm.c token shards (tokenize) and check them (info).
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Class folders sort in label order (DALI labels folders by sorted position). */
static const char *const fmnist_classes[10] = {"0_tshirt_top", "1_trouser", "2_pullover", "3_dress", "4_coat",
                                               "5_sandal",     "6_shirt",   "7_sneaker",  "8_bag",   "9_ankle_boot"};
static const char *const mnist_classes[10] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};

static int mkdir_p(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static ts_status read_idx_pair(const char *dir, const char *pre, ts_tensor **img, ts_tensor **lab) {
    char path[4096];
    const char *kinds[2] = {"images-idx3", "labels-idx1"};
    ts_tensor **outs[2] = {img, lab};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s-%s-ubyte.gz", dir, pre, kinds[k]);
        struct stat sb;
        if (stat(path, &sb) != 0) snprintf(path, sizeof path, "%s/%s-%s-ubyte", dir, pre, kinds[k]);
        ts_status st = ts_idx_read(path, k == 0 ? 3 : 1, outs[k]);
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

static int data_export(int argc, char **argv) {
    const char *format = "png", *out = NULL, *src = NULL, *split = "both";
    int64_t limit = 0, quality = 95;
    const cli_flag flags[] = {
        {"format", CLI_STRING, &format, "png or jpeg", 1, 0},
        {"out", CLI_STRING, &out, "output folder (made if missing): OUT/{train,test}/<class>/<index>.<ext>", 1, 0},
        {"data", CLI_STRING, &src, "folder with the IDX files (default: Debian's dataset-fashion-mnist)", 1, 0},
        {"split", CLI_STRING, &split, "train, test or both", 1, 0},
        {"limit", CLI_INT, &limit, "export only the first N images of each split (0: all)", 0, 1e9},
        {"quality", CLI_INT, &quality, "JPEG quality", 1, 100},
    };
    const cli_command cmd = {"data export", "tessera data export fashion-mnist|mnist --out DIR [flags]",
                             "Writes an IDX data set as image files, one sub-folder per class; the folders sort in\n"
                             "label order, so `tessera train --data DIR` sees the same labels.",
                             flags, (int)(sizeof flags / sizeof flags[0])};
    const char *pos[2];
    int npos = 0;
    int rc = cli_parse(&cmd, argc, argv, pos, 2, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos != 1) return cli_usage_error(&cmd, "expected one data set name (fashion-mnist or mnist)");
    bool fm = strcmp(pos[0], "fashion-mnist") == 0;
    if (!fm && strcmp(pos[0], "mnist") != 0)
        return cli_usage_error(&cmd, "unknown data set '%s' (expected fashion-mnist or mnist)", pos[0]);
    if (!src) {
        if (!fm) return cli_usage_error(&cmd, "mnist needs --data DIR (the folder with its IDX files)");
        src = FMNIST_DIR;
    }
    bool jpeg = strcmp(format, "jpeg") == 0 || strcmp(format, "jpg") == 0;
    if (!jpeg && strcmp(format, "png") != 0) return cli_usage_error(&cmd, "unknown --format '%s' (png or jpeg)", format);
    if (!out) return cli_usage_error(&cmd, "--out DIR is required");
    bool do_train = strcmp(split, "train") == 0 || strcmp(split, "both") == 0;
    bool do_test = strcmp(split, "test") == 0 || strcmp(split, "both") == 0;
    if (!do_train && !do_test) return cli_usage_error(&cmd, "unknown --split '%s' (train, test or both)", split);
    const char *const *names = fm ? fmnist_classes : mnist_classes;

    double t0 = ts_time_now();
    int64_t written = 0;
    for (int s = 0; s < 2; s++) {
        if ((s == 0 && !do_train) || (s == 1 && !do_test)) continue;
        const char *sname = s == 0 ? "train" : "test";
        ts_tensor *img = NULL, *lab = NULL;
        if (read_idx_pair(src, s == 0 ? "train" : "t10k", &img, &lab) != TS_OK) {
            fprintf(stderr, "tessera data export: --data %s: %s\n", src, ts_last_error());
            ts_tensor_release(img);
            return CLI_EXIT_USAGE;
        }
        int64_t n = ts_tensor_dim(img, 0), h = ts_tensor_dim(img, 1), w = ts_tensor_dim(img, 2);
        if (limit > 0 && limit < n) n = limit;
        const uint8_t *px = ts_tensor_data(img), *lb = ts_tensor_data(lab);
        for (int c = 0; c < 10; c++) {
            char dir[4096];
            snprintf(dir, sizeof dir, "%s/%s/%s", out, sname, names[c]);
            if (mkdir_p(dir) != 0) {
                fprintf(stderr, "tessera data export: cannot create %s: %s\n", dir, strerror(errno));
                ts_tensor_release(img);
                ts_tensor_release(lab);
                return 1;
            }
        }
        int failed = 0;
        char errmsg[1024] = "";
#pragma omp parallel for schedule(dynamic, 256) reduction(+ : failed)
        for (int64_t i = 0; i < n; i++) {
            if (lb[i] > 9) {
                failed++;
                continue;
            }
            ts_image im = {(uint8_t *)px + i * h * w, (int)w, (int)h, 1, 0};
            char path[4096];
            snprintf(path, sizeof path, "%s/%s/%s/%05lld.%s", out, sname, names[lb[i]], (long long)i, jpeg ? "jpg" : "png");
            ts_status st = jpeg ? ts_image_write_jpeg(&im, path, (int)quality) : ts_image_write_png(&im, path);
            if (st != TS_OK) {
                failed++;
#pragma omp critical
                snprintf(errmsg, sizeof errmsg, "%s", ts_last_error());
            }
        }
        ts_tensor_release(img);
        ts_tensor_release(lab);
        if (failed) {
            fprintf(stderr, "tessera data export: %d images not written: %s\n", failed,
                    errmsg[0] ? errmsg : "labels above 9");
            return 1;
        }
        written += n;
        printf("%s: %lld images in %s/%s\n", sname, (long long)n, out, sname);
    }
    printf("exported %lld %s images from %s in %.1f s\n", (long long)written, jpeg ? "JPEG" : "PNG", src,
           ts_time_now() - t0);
    return 0;
}

/* ---- the grid --------------------------------------------------------------------------------------- */
/* A 5x7 bitmap font (rows top to bottom, bit 4 = leftmost column) for the label text; lowercase
 * letters are drawn as capitals, unknown characters as '?'. */
static const struct {
    char c;
    uint8_t rows[7];
} font5x7[] = {
    {'0', {0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e}}, {'1', {0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e}},
    {'2', {0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f}}, {'3', {0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e}},
    {'4', {0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02}}, {'5', {0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e}},
    {'6', {0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e}}, {'7', {0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e}}, {'9', {0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c}},
    {'A', {0x0e, 0x11, 0x11, 0x11, 0x1f, 0x11, 0x11}}, {'B', {0x1e, 0x11, 0x11, 0x1e, 0x11, 0x11, 0x1e}},
    {'C', {0x0e, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0e}}, {'D', {0x1c, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1c}},
    {'E', {0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x1f}}, {'F', {0x1f, 0x10, 0x10, 0x1e, 0x10, 0x10, 0x10}},
    {'G', {0x0e, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0f}}, {'H', {0x11, 0x11, 0x11, 0x1f, 0x11, 0x11, 0x11}},
    {'I', {0x0e, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0c}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1f}},
    {'M', {0x11, 0x1b, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0e, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e}}, {'P', {0x1e, 0x11, 0x11, 0x1e, 0x10, 0x10, 0x10}},
    {'Q', {0x0e, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0d}}, {'R', {0x1e, 0x11, 0x11, 0x1e, 0x14, 0x12, 0x11}},
    {'S', {0x0f, 0x10, 0x10, 0x0e, 0x01, 0x01, 0x1e}}, {'T', {0x1f, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0a, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0a}}, {'X', {0x11, 0x11, 0x0a, 0x04, 0x0a, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0a, 0x04, 0x04, 0x04}}, {'Z', {0x1f, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1f}},
    {' ', {0, 0, 0, 0, 0, 0, 0}},                      {'_', {0, 0, 0, 0, 0, 0, 0x1f}},
    {'-', {0, 0, 0, 0x1f, 0, 0, 0}},                   {'.', {0, 0, 0, 0, 0, 0x0c, 0x0c}},
    {'/', {0, 0x01, 0x02, 0x04, 0x08, 0x10, 0}},       {':', {0, 0x0c, 0x0c, 0, 0x0c, 0x0c, 0}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'#', {0x0a, 0x0a, 0x1f, 0x0a, 0x1f, 0x0a, 0x0a}}, {'+', {0, 0x04, 0x04, 0x1f, 0x04, 0x04, 0}},
    {'?', {0x0e, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04}},
};

static const uint8_t *glyph(char c) {
    if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
    for (size_t i = 0; i < sizeof font5x7 / sizeof font5x7[0]; i++)
        if (font5x7[i].c == c) return font5x7[i].rows;
    return glyph('?');
}

/* Draws text at (x, y) in an RGB image, each font pixel a scale x scale square; clipped. */
static void draw_text(ts_image *im, int x, int y, const char *text, int scale, const uint8_t rgb[3]) {
    for (int k = 0; text[k]; k++) {
        const uint8_t *g = glyph(text[k]);
        for (int r = 0; r < 7; r++)
            for (int c = 0; c < 5; c++) {
                if (!(g[r] & (0x10 >> c))) continue;
                for (int dy = 0; dy < scale; dy++)
                    for (int dx = 0; dx < scale; dx++) {
                        int px = x + k * 6 * scale + c * scale + dx, py = y + r * scale + dy;
                        if (px < 0 || py < 0 || px >= im->width || py >= im->height) continue;
                        memcpy(im->data + ((size_t)py * im->width + px) * 3, rgb, 3);
                    }
            }
    }
}

/* The class name of label (its folder, '_' as spaces; else "label K") under an image S pixels wide at (x, y). */
static void draw_label(ts_image *grid, const ts_reader *r, int64_t lab, int x, int y, int S) {
    char label[64];
    const char *name = ts_reader_class_name(r, lab);
    if (name)
        snprintf(label, sizeof label, "%s", name);
    else
        snprintf(label, sizeof label, "label %lld", (long long)lab);
    for (char *q = label; *q; q++)
        if (*q == '_') *q = ' ';
    int scale = (int)strlen(label) * 12 <= S ? 2 : 1, maxc = S / (6 * scale);
    if ((int)strlen(label) > maxc) label[maxc] = '\0';
    static const uint8_t white[3] = {235, 235, 235};
    draw_text(grid, x, y, label, scale, white);
}

static int data_show(int argc, char **argv) {
    const char *out = "grid.png";
    int64_t batch = 16, size = 160, seed = 0, columns = 4, threads = 2;
    double min_scale = 0.25, flip = 0.5;
    bool no_augment = false, gray = false;
    const cli_flag flags[] = {
        {"out", CLI_STRING, &out, "PNG file to write", 1, 0},
        {"batch-size", CLI_INT, &batch, "images in the batch (the grid)", 1, 1024},
        {"image-size", CLI_INT, &size, "each image's side in pixels (the pipeline's output size)", 8, 2048},
        {"columns", CLI_INT, &columns, "images per row", 1, 64},
        {"seed", CLI_INT, &seed, "reader and augmentation seed", 0, 9.2e18},
        {"min-scale", CLI_FLOAT, &min_scale, "random resized crop: smallest area fraction", 0.01, 1},
        {"flip", CLI_FLOAT, &flip, "probability of a left-right mirror", 0, 1},
        {"no-augment", CLI_BOOL, &no_augment, "whole images, resized, no flips", 1, 0},
        {"gray", CLI_BOOL, &gray, "decode to gray", 1, 0},
        {"data-threads", CLI_INT, &threads, "pipeline worker threads decoding images", 1, 256},
        /* the old spellings (before the flags took tessera train's names) */
        {"batch", CLI_INT, &batch, NULL, 1, 1024},
        {"size", CLI_INT, &size, NULL, 8, 2048},
        {"threads", CLI_INT, &threads, NULL, 1, 256},
    };
    const cli_command cmd = {
        "data show", "tessera data show DIR|LIST [flags]",
        "Runs the input pipeline once (shuffled reader, decode, random resized crop, flip) and\n"
        "writes its first batch as a labelled grid of images. DIR has one sub-folder per class\n"
        "(or DIR/train has: the layout `tessera data export` writes); LIST is a file of \"path label\" lines.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    const char *pos[2];
    int npos = 0;
    int rc = cli_parse(&cmd, argc, argv, pos, 2, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos != 1) return cli_usage_error(&cmd, "expected one folder or file list");
    struct stat sb;
    if (stat(pos[0], &sb) != 0) return cli_usage_error(&cmd, "%s: %s", pos[0], strerror(errno));

    char rootbuf[4096];
    ts_pipeline_opts o = TS_PIPELINE_OPTS_INIT;
    ts_data_reader_opts(pos[0], "train", &o.reader, rootbuf, sizeof rootbuf);
    o.reader.random_shuffle = true;
    o.reader.seed = seed;
    o.batch_size = batch;
    o.num_threads = (int)threads;
    o.prefetch_queue_depth = 1;
    o.color = gray ? TS_COLOR_GRAY : TS_COLOR_RGB;
    o.out_width = o.out_height = (int)size;
    o.random_resized_crop = !no_augment;
    o.rrc_scale[0] = (float)min_scale;
    o.flip_prob = no_augment ? 0.0f : (float)flip;
    ts_pipeline *p = NULL;
    if (ts_pipeline_new(&o, &p) != TS_OK) {
        fprintf(stderr, "tessera data show: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    ts_tensor *x = NULL, *y = NULL;
    ts_batch_info bi;
    int status = 1;
    ts_image grid = TS_IMAGE_INIT;
    if (ts_pipeline_next(p, &x, &y, &bi) != TS_OK || !x) {
        fprintf(stderr, "tessera data show: %s\n", x || bi.epoch_end ? "no batch" : ts_last_error());
        goto done;
    }
    const ts_reader *r = ts_pipeline_reader(p);
    int n = (int)bi.size, cols = (int)(columns < n ? columns : n), rows = (n + cols - 1) / cols;
    int S = (int)size, pad = 8, text_h = 7 * 2 + 8, cw = S + pad, ch = S + pad + text_h;
    if (ts_image_alloc(&grid, cols * cw + pad, rows * ch + pad, 3) != TS_OK) {
        fprintf(stderr, "tessera data show: %s\n", ts_last_error());
        goto done;
    }
    memset(grid.data, 40, (size_t)grid.width * grid.height * 3);
    const float *px = ts_tensor_data_f32(x);
    const int64_t *py = ts_tensor_data(y);
    const int C = (int)ts_tensor_dim(x, 1);
    for (int i = 0; i < n; i++) {
        int gx = pad + (i % cols) * cw, gy = pad + (i / cols) * ch;
        for (int yy = 0; yy < S; yy++)
            for (int xx = 0; xx < S; xx++)
                for (int c = 0; c < 3; c++) { /* back from (v - 0) / 255 to pixels */
                    float v = px[((size_t)i * C + (C == 3 ? c : 0)) * S * S + (size_t)yy * S + xx] * 255.0f + 0.5f;
                    grid.data[((size_t)(gy + yy) * grid.width + gx + xx) * 3 + c] =
                        (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
        draw_label(&grid, r, py[i], gx, gy + S + 5, S);
    }
    if (ts_image_write_png(&grid, out) != TS_OK) {
        fprintf(stderr, "tessera data show: --out: %s\n", ts_last_error());
        goto done;
    }
    char e1[1024], e2[1024];
    printf("wrote %s: %d images of %dx%d (epoch %lld, batch %lld) from %s, %lld samples in %lld classes\n",
           cli_printable(out, e1, sizeof e1), n, S, S, (long long)bi.epoch, (long long)bi.batch,
           cli_printable(pos[0], e2, sizeof e2), (long long)ts_reader_size(r), (long long)ts_reader_num_classes(r));
    status = 0;
done:
    ts_image_free(&grid);
    ts_pipeline_free(p);
    return status;
}

static const char *cli_name_tok(int i) { return ts_tokenizer_kind_name((ts_tokenizer_kind)i); }

#define TOKENIZE_MAX_INPUTS 4096

static int data_tokenize(int argc, char **argv) {
    const char *out = NULL, *vocab = NULL, *merges = NULL, *name = "tokens";
    ts_tokenizer_kind kind = TS_TOKENIZER_BYTES;
    double val_fraction = 0.1;
    int64_t val_tokens = 0, shard_tokens = 100000000;
    bool special = false;
    const cli_flag flags[] = {
        {"out", CLI_STRING, &out, "output folder (made if missing): OUT/NAME_val_000000.bin, OUT/NAME_train_<k>.bin, ...", 1, 0},
        {"tokenizer", CLI_ENUM, CLI_ENUM_OF(kind, cli_name_tok), "bytes (ids 0-255, <|endoftext|> 256; no files) or gpt2 (--vocab, --merges)", TS_TOKENIZER_BYTES, TS_TOKENIZER_GPT2},
        {"vocab", CLI_STRING, &vocab, "gpt2: GPT-2's vocab.json (or any vocabulary in its format)", 1, 0},
        {"merges", CLI_STRING, &merges, "gpt2: its merges.txt", 1, 0},
        {"name", CLI_STRING, &name, "the shards' file name prefix", 1, 0},
        {"val-fraction", CLI_FLOAT, &val_fraction, "the share of the tokens (from the start) that is the validation split", 0, 0.999999},
        {"val-tokens", CLI_INT, &val_tokens, "exactly this many validation tokens instead (0: use --val-fraction)", 0, 9e18},
        {"shard-tokens", CLI_INT, &shard_tokens, "tokens per shard at most", 1, 2147483647},
        {"special", CLI_BOOL, &special, "<|endoftext|> written in the text is the EOT token (default: ordinary text, as llm.c's scripts)", 0, 0},
    };
    const cli_command cmd = {
        "data tokenize", "tessera data tokenize TEXT... --out DIR [--tokenizer bytes|gpt2 --vocab F --merges F] [flags]",
        "Encodes text files into llm.c token shards (uint16 tokens after a 256-int32 header). Each file is one\n"
        "document, preceded by <|endoftext|> as llm.c's data scripts do; the first tokens make the validation\n"
        "split, the rest the training split. Prints the counts and the unigram entropy of the training tokens.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    static const char *pos[TOKENIZE_MAX_INPUTS];
    int npos = 0;
    int rc = cli_parse(&cmd, argc, argv, pos, TOKENIZE_MAX_INPUTS, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos < 1) return cli_usage_error(&cmd, "expected one or more text files");
    if (!out) return cli_usage_error(&cmd, "--out DIR is required");
    if (kind == TS_TOKENIZER_GPT2 && (!vocab || !merges))
        return cli_usage_error(&cmd, "--tokenizer gpt2 needs --vocab vocab.json and --merges merges.txt");
    ts_tokenizer *tok = NULL;
    ts_status st = ts_tokenizer_new(kind, vocab, merges, &tok);
    if (st != TS_OK) return cli_fail("data tokenize", "tokenizer") ? cli_exit_for(st) : 0;
    ts_tokenize_opts o = TS_TOKENIZE_OPTS_INIT;
    o.inputs = pos, o.num_inputs = npos, o.out_dir = out, o.name = name, o.tok = tok;
    o.val_fraction = val_fraction, o.val_tokens = val_tokens, o.shard_tokens = shard_tokens, o.special = special;
    ts_tokenize_result r;
    st = ts_tokenize_files(&o, &r);
    ts_tokenizer_free(tok);
    if (st != TS_OK) return cli_fail("data tokenize", "error") ? cli_exit_for(st) : 0;
    char e[1024];
    printf("%lld tokens from %d files (%lld bytes, %.2f MB/s), vocabulary %lld (%s)\n", (long long)r.tokens, npos,
           (long long)r.bytes, r.seconds > 0 ? (double)r.bytes / 1e6 / r.seconds : 0.0, (long long)r.vocab_size,
           ts_tokenizer_kind_name(kind));
    printf("val:   %lld tokens in %d shards\ntrain: %lld tokens in %d shards, in %s\n", (long long)r.val_tokens,
           r.val_shards, (long long)r.train_tokens, r.train_shards, cli_printable(out, e, sizeof e));
    printf("unigram entropy of the training tokens: %.4f bits/token, %.4f nats/token\n", r.entropy_bits,
           r.entropy_nats);
    return 0;
}

static int data_info(int argc, char **argv) {
    int64_t vocab = 0;
    const cli_flag flags[] = {
        {"vocab-size", CLI_INT, &vocab, "also check every token is below this (0: no check)", 0, 65536},
    };
    const cli_command cmd = {"data info", "tessera data info SHARD.bin... [flags]",
                             "Checks llm.c token shards (header, size, tokens) and prints each one's token count,\n"
                             "largest id and unigram entropy.",
                             flags, (int)(sizeof flags / sizeof flags[0])};
    static const char *pos[TOKENIZE_MAX_INPUTS];
    int npos = 0;
    int rc = cli_parse(&cmd, argc, argv, pos, TOKENIZE_MAX_INPUTS, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (npos < 1) return cli_usage_error(&cmd, "expected one or more shard files");
    for (int i = 0; i < npos; i++) {
        ts_token_shard *s = NULL;
        ts_status st = ts_token_shard_open(pos[i], vocab, &s);
        if (st != TS_OK) return cli_fail("data info", "error") ? cli_exit_for(st) : 0;
        int64_t n = 0, most = ts_token_shard_max_id(s);
        const uint16_t *t = ts_token_shard_tokens(s, &n);
        char e[1024];
        printf("%s: %lld tokens, largest id %lld, unigram entropy %.4f bits/token\n", cli_printable(pos[i], e, sizeof e),
               (long long)n, (long long)(most > 0 ? most : 0), ts_tokens_entropy_bits(t, n));
        ts_token_shard_free(s);
    }
    return 0;
}

int ts_cmd_data(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: tessera data WHAT [flags]\n\n"
                   "  export   write Fashion-MNIST (or MNIST) as JPEG/PNG files, one folder per class\n"
                   "  show     write a grid of one decoded, augmented pipeline batch with labels\n"
                   "  tokenize encode text files into llm.c token shards (train and val splits)\n"
                   "  info     check llm.c token shards and print their counts\n"
                   "\n'tessera data WHAT --help' lists the flags.\n");
        return argc < 2 ? CLI_EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "export") == 0) return data_export(argc - 1, argv + 1);
    if (strcmp(argv[1], "show") == 0) return data_show(argc - 1, argv + 1);
    if (strcmp(argv[1], "tokenize") == 0) return data_tokenize(argc - 1, argv + 1);
    if (strcmp(argv[1], "info") == 0) return data_info(argc - 1, argv + 1);
    fprintf(stderr, "tessera data: unknown command '%s' (available: export, show, tokenize, info)\n", argv[1]);
    return CLI_EXIT_USAGE;
}
