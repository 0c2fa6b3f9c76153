/*
 * tools/cmd_eval.c — `tessera eval` (accuracy, top-5, loss and the confusion
 * matrix of a checkpoint on a data set's evaluation split) and `tessera predict`
 * (top-k classes of image files). Both rebuild the model a training checkpoint
 * holds with the class count and input it was trained on (ts_checkpoint_model_load).
 */
#include "cli.h"
#include "commands.h"
#include "core/json.h"

#include "tessera.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A model rebuilt from a checkpoint (ts_checkpoint_model_load), and what the checkpoint says about its data. */
typedef struct loaded_model {
    ts_module *m;
    ts_checkpoint_model_info info;
} loaded_model;

static void loaded_free(loaded_model *lm) {
    ts_module_free(lm->m);
    ts_checkpoint_model_info_clear(&lm->info);
    memset(lm, 0, sizeof *lm);
}

static int load_model(const char *cmd, const char *path, const char *model, loaded_model *lm) {
    memset(lm, 0, sizeof *lm);
    ts_status st = ts_checkpoint_model_load(path, model, &lm->m, &lm->info);
    if (st == TS_OK) return 0;
    fprintf(stderr, "tessera %s: %s\n", cmd, ts_last_error());
    loaded_free(lm);
    return cli_exit_for(st);
}

/* ---- tessera eval ------------------------------------------------------------------------------- */
static const char *class_name(const loaded_model *lm, int64_t k, char *buf, size_t n) {
    return ts_checkpoint_class_name(&lm->info, k, buf, n);
}

static void print_confusion(const loaded_model *lm, const int64_t *cm) {
    int64_t C = lm->info.num_classes;
    char nb[64];
    int w = 5;
    for (int64_t k = 0; k < C; k++) {
        int l = (int)strlen(class_name(lm, k, nb, sizeof nb));
        if (l > w) w = l;
    }
    if (w > 24) w = 24;
    printf("confusion matrix (rows: label, columns: prediction)\n%*s", w, "");
    for (int64_t j = 0; j < C; j++) printf(" %6lld", (long long)j);
    printf("  recall\n");
    for (int64_t i = 0; i < C; i++) {
        int64_t row = 0;
        for (int64_t j = 0; j < C; j++) row += cm[i * C + j];
        printf("%*.*s", w, w, class_name(lm, i, nb, sizeof nb));
        for (int64_t j = 0; j < C; j++) printf(" %6lld", (long long)cm[i * C + j]);
        if (row)
            printf("  %5.1f%%\n", 100.0 * (double)cm[i * C + i] / (double)row);
        else
            printf("      -\n");
    }
}

/* The data's classes must be the checkpoint's: no more of them, and the folders it was trained on. */
static int check_classes(const char *data, const loaded_model *lm, const ts_batch_source *train) {
    int64_t dc = ts_batch_source_num_classes(train);
    if (dc > lm->info.num_classes) {
        fprintf(stderr, "tessera eval: --data %s has %lld classes, the checkpoint's model %lld\n", data, (long long)dc,
                (long long)lm->info.num_classes);
        return CLI_EXIT_USAGE;
    }
    char nb[256], esc[256], esc2[256];
    for (int64_t k = 0; lm->info.class_names && k < dc; k++) {
        const char *have = ts_batch_source_class_name(train, k), *want = class_name(lm, k, nb, sizeof nb);
        if (have && !ts_class_names_match(want, have, k)) { /* 'Sneaker' is the exported folder '7_sneaker' */
            fprintf(stderr, "tessera eval: --data %s: class %lld is '%s', the checkpoint's is '%s'\n", data,
                    (long long)k, cli_printable(have, esc, sizeof esc), cli_printable(want, esc2, sizeof esc2));
            return CLI_EXIT_USAGE;
        }
    }
    return 0;
}

static int write_json(const char *path, const loaded_model *lm, const char *split, const ts_eval_result *r,
                      const int64_t *cm) {
    ts_outfile *o = NULL;
    if (ts_outfile_open(path, "a JSON file", &o) != TS_OK) {
        fprintf(stderr, "tessera eval: --json: %s\n", ts_last_error());
        return 1;
    }
    FILE *f = ts_outfile_stream(o);
    int64_t C = lm->info.num_classes;
    fputs("{\n  \"model\": ", f);
    ts__json_put_string(f, lm->info.model);
    fputs(",\n  \"split\": ", f);
    ts__json_put_string(f, split);
    fprintf(f, ",\n  \"samples\": %lld,\n  \"accuracy\": %.6f,\n  \"top5_accuracy\": %.6f,\n"
               "  \"loss\": %.6f,\n  \"confusion\": [",
            (long long)r->samples, r->accuracy, r->top5_accuracy, r->loss);
    for (int64_t i = 0; cm && i < C; i++) {
        fprintf(f, "%s[", i ? ", " : "");
        for (int64_t j = 0; j < C; j++) fprintf(f, "%s%lld", j ? ", " : "", (long long)cm[i * C + j]);
        fprintf(f, "]");
    }
    fprintf(f, "]\n}\n");
    if (ts_outfile_close(o) != TS_OK) {
        fprintf(stderr, "tessera eval: --json: %s\n", ts_last_error());
        return 1;
    }
    return 0;
}

typedef struct eval_args {
    const char *checkpoint, *data, *model, *json, *split;
    int64_t batch_size, data_threads, threads, confusion;
} eval_args;

/* Evaluates lm on a's data: *cm (C x C, malloc'd) and *r. */
static int evaluate(const eval_args *a, const loaded_model *lm, ts_eval_result *r, int64_t **cm) {
    ts_batch_source *train = NULL, *test = NULL;
    ts_data_opts d = TS_DATA_OPTS_INIT;
    d.path = a->data;
    d.batch_size = 1; /* the training source is opened for its class list only */
    d.eval_batch_size = a->batch_size;
    if (lm->info.seq_len > 0) { /* a language model on token shards: rows of seq_len tokens, no confusion matrix */
        d.seq_len = lm->info.seq_len;
        d.batch_size = a->batch_size;
    }
    d.threads = (int)a->data_threads;
    d.image_size = lm->info.image_size;
    d.eval_on_train = strcmp(a->split, "train") == 0;
    int rc = 0;
    if (ts_data_open(&d, &train, &test) != TS_OK) {
        fprintf(stderr, "tessera eval: --data %s: %s\n", a->data, ts_last_error());
        rc = CLI_EXIT_USAGE;
    }
    if (rc == 0) rc = check_classes(a->data, lm, train);
    int64_t C = lm->info.num_classes;
    if (rc == 0 && lm->info.seq_len > 0 && ts_evaluate(lm->m, test, r) != TS_OK) {
        fprintf(stderr, "tessera eval: %s\n", ts_last_error());
        rc = 1;
    } else if (rc == 0 && lm->info.seq_len == 0 &&
               (!(*cm = calloc((size_t)(C * C), sizeof **cm)) || ts_evaluate_confusion(lm->m, test, *cm, C, r) != TS_OK)) {
        fprintf(stderr, "tessera eval: %s\n", *cm ? ts_last_error() : "out of memory");
        rc = 1;
    }
    ts_batch_source_free(train);
    ts_batch_source_free(test);
    return rc;
}

int ts_cmd_eval(int argc, char **argv) {
    eval_args a = {.data = "/usr/share/datasets/fashion-mnist", .split = "test", .batch_size = 100, .data_threads = 2,
                   .confusion = -1};
    const cli_flag flags[] = {
        {"checkpoint", CLI_STRING, &a.checkpoint, "training checkpoint to evaluate (required)", 1, 0},
        {"data", CLI_STRING, &a.data, "the data set as tessera train takes it; its evaluation split is used (t10k-* files, val/ or test/)", 1, 0},
        {"split", CLI_STRING, &a.split, "test (the evaluation split) or train (the training images, preprocessed for evaluation)", 1, 0},
        {"model", CLI_STRING, &a.model, "the model, for a checkpoint that does not record one (it must be the one it records)", 1, 0},
        {"batch-size", CLI_INT, &a.batch_size, "images per forward pass (a GPT: rows of its context length)", 1, 1 << 20},
        {"data-threads", CLI_INT, &a.data_threads, "worker threads decoding images", 1, 256},
        {"threads", CLI_INT, &a.threads, "CPU threads (0: OMP_NUM_THREADS or all cores)", 0, 4096},
        {"confusion", CLI_INT, &a.confusion, "print the confusion matrix: 1 yes, 0 no (default: up to 20 classes)", -1, 1},
        {"json", CLI_STRING, &a.json, "also write the figures (and the matrix) to this JSON file", 1, 0},
    };
    const cli_command cmd = {
        "eval", "tessera eval --checkpoint CKPT [--data DIR] [--split test|train] [flags]",
        "Evaluates a training checkpoint on a data set's evaluation split, as tessera train does after\n"
        "every epoch: top-1 and top-5 accuracy, mean cross-entropy and the confusion matrix.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (!a.checkpoint) return cli_usage_error(&cmd, "--checkpoint is required");
    if (strcmp(a.split, "test") != 0 && strcmp(a.split, "train") != 0)
        return cli_usage_error(&cmd, "unknown --split '%s' (expected test or train)", a.split);
    if (a.threads > 0) ts_set_num_threads((int)a.threads);
    if (a.json && ts_outfile_check(a.json, "a JSON file") != TS_OK) { /* before the evaluation */
        fprintf(stderr, "tessera eval: --json: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    loaded_model lm;
    if ((rc = load_model("eval", a.checkpoint, a.model, &lm)) != 0) return rc;
    int64_t *cm = NULL;
    ts_eval_result r;
    if ((rc = evaluate(&a, &lm, &r, &cm)) == 0 && lm.info.seq_len > 0) {
        printf("%s on %s%s: %lld tokens, loss %.4f (%.3f bits/token, perplexity %.2f), next-token accuracy %.2f%%\n",
               lm.info.model, a.data, strcmp(a.split, "train") == 0 ? " (training split)" : "", (long long)r.samples,
               r.loss, r.loss / log(2.0), exp(r.loss), 100.0 * r.accuracy);
        if (a.json) rc = write_json(a.json, &lm, a.split, &r, NULL);
    } else if (rc == 0) {
        printf("%s on %s%s: %lld images, accuracy %.2f%% (%lld correct), top-5 %.2f%%, loss %.4f\n", lm.info.model,
               a.data, strcmp(a.split, "train") == 0 ? " (training split)" : "", (long long)r.samples,
               100.0 * r.accuracy, (long long)r.correct, 100.0 * r.top5_accuracy, r.loss);
        if (a.confusion == 1 || (a.confusion < 0 && lm.info.num_classes <= 20)) print_confusion(&lm, cm);
        if (a.json) rc = write_json(a.json, &lm, a.split, &r, cm);
    }
    free(cm);
    loaded_free(&lm);
    return rc;
}

/* ---- tessera predict ---------------------------------------------------------------------------- */
/* The top `top` classes of one image file, printed as "FILE: name p%, ..."; x is the (1, C, S, S) input. */
static int predict_one(const loaded_model *lm, const char *file, ts_tensor *x, int64_t top, int64_t *order) {
    ts_image im = TS_IMAGE_INIT;
    ts_tensor *logits = NULL, *wide = NULL;
    int C = lm->info.image_size > 0 ? 3 : 1;
    int64_t K = lm->info.num_classes;
    ts_status st = ts_image_read(file, C == 3 ? TS_COLOR_RGB : TS_COLOR_GRAY, &im);
    if (st == TS_OK) st = ts_data_preprocess(&im, lm->info.image_size, ts_tensor_data(x));
    if (st == TS_OK) st = ts_module_forward(lm->m, x, &logits);
    /* 16-bit under autocast (TS_AUTOCAST): read in float32 */
    if (st == TS_OK) st = ts_to_dtype(logits, TS_F32, &wide);
    ts_image_free(&im);
    ts_tensor_release(logits);
    if (st != TS_OK) {
        fprintf(stderr, "tessera predict: %s\n", ts_last_error());
        return 1;
    }
    const float *z = ts_tensor_data(wide);
    double mx = z[0], se = 0;
    for (int64_t k = 1; k < K; k++) mx = z[k] > mx ? z[k] : mx;
    for (int64_t k = 0; k < K; k++) se += exp(z[k] - mx);
    for (int64_t k = 0; k < K; k++) order[k] = k;
    for (int64_t i = 0; i < top; i++) /* partial selection sort: the top-k in order */
        for (int64_t j = i + 1; j < K; j++)
            if (z[order[j]] > z[order[i]]) {
                int64_t t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    printf("%s:", file);
    char nb[256];
    for (int64_t i = 0; i < top; i++)
        printf("%s %s %.2f%%", i ? "," : "", class_name(lm, order[i], nb, sizeof nb), 100.0 * exp(z[order[i]] - mx) / se);
    printf("\n");
    ts_tensor_release(wide);
    return 0;
}

int ts_cmd_predict(int argc, char **argv) {
    const char *checkpoint = NULL, *model = NULL;
    int64_t top = 5, threads = 0;
    const char *files[4096];
    int nfiles = 0;
    const cli_flag flags[] = {
        {"checkpoint", CLI_STRING, &checkpoint, "training checkpoint (required)", 1, 0},
        {"model", CLI_STRING, &model, "the model, for a checkpoint that does not record one (it must be the one it records)", 1, 0},
        {"top", CLI_INT, &top, "classes to print per image", 1, 1000},
        {"threads", CLI_INT, &threads, "CPU threads (0: OMP_NUM_THREADS or all cores)", 0, 4096},
    };
    const cli_command cmd = {
        "predict", "tessera predict --checkpoint CKPT [--top K] IMAGE...",
        "Prints the most likely classes of JPEG/PNG files (with the class folders' names the checkpoint\n"
        "recorded) and their probabilities, preprocessed as tessera train evaluates.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, files, 4096, &nfiles);
    if (rc) return rc == 1 ? 0 : rc;
    if (!checkpoint) return cli_usage_error(&cmd, "--checkpoint is required");
    if (nfiles == 0) return cli_usage_error(&cmd, "no image files given");
    if (threads > 0) ts_set_num_threads((int)threads);
    loaded_model lm;
    if ((rc = load_model("predict", checkpoint, model, &lm)) != 0) return rc;
    if (top > lm.info.num_classes) top = lm.info.num_classes;
    int64_t S = lm.info.image_size > 0 ? lm.info.image_size : 28, shape[4] = {1, lm.info.image_size > 0 ? 3 : 1, S, S};
    ts_tensor *x = NULL;
    int64_t *order = calloc((size_t)lm.info.num_classes, sizeof *order);
    if (!order || ts_tensor_empty(ts_device_cpu(), TS_F32, 4, shape, &x) != TS_OK) {
        fprintf(stderr, "tessera predict: out of memory\n");
        rc = 1;
    } else {
        bool prev = ts_grad_set_enabled(false);
        for (int f = 0; f < nfiles; f++) rc |= predict_one(&lm, files[f], x, top, order); /* every file, also after a bad one */
        ts_grad_set_enabled(prev);
    }
    free(order);
    ts_tensor_release(x);
    loaded_free(&lm);
    return rc;
}
