/*
 * tools/cmd_eval.c — `tessera eval` (accuracy, top-5, loss and the confusion
 * matrix of a checkpoint on a data set's evaluation split) and `tessera predict`
 * (top-k classes of image files). Both rebuild the model a training checkpoint
 * names (train.model, or --model) with the class count and input it was trained
 * on (data.num_classes, data.height; tools/cmd_train.c writes them through the
 * trainer) and load its model.* state dict strictly.
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A model rebuilt from a checkpoint, and what the checkpoint says about its data. */
typedef struct loaded_model {
    ts_module *m;
    char name[64];
    int image_size;    /* 0: the 28x28 gray reference input */
    int64_t classes;
    char *names;       /* class names, '\n'-separated (owned), or NULL */
} loaded_model;

static void loaded_free(loaded_model *lm) {
    ts_module_free(lm->m);
    free(lm->names);
    memset(lm, 0, sizeof *lm);
}

/* The name of class k (its folder), or "class K" in buf. */
static const char *class_name(const loaded_model *lm, int64_t k, char *buf, size_t n) {
    const char *p = lm->names;
    for (int64_t i = 0; p && i < k; i++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    if (p && *p) {
        size_t len = strcspn(p, "\n");
        snprintf(buf, n, "%.*s", (int)(len < n ? len : n - 1), p);
    } else {
        snprintf(buf, n, "class %lld", (long long)k);
    }
    return buf;
}

/* Loads ckpt: the model (model_flag overrides train.model), its classes and input size. */
static ts_status load_model(const char *ckpt_path, const char *model_flag, loaded_model *lm) {
    ts_ckpt *ck = NULL;
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    ts_status st;
    memset(lm, 0, sizeof *lm);
    if ((st = ts_ckpt_load(ckpt_path, &ck)) != TS_OK) return st;
    const void *b = NULL;
    size_t n = 0;
    char saved[64] = ""; /* the model the checkpoint was saved from */
    if (ts_ckpt_get_bytes(ck, "train.model", &b, &n) == TS_OK && n > 0 && n < sizeof saved) {
        memcpy(saved, b, n);
        saved[n] = '\0';
    }
    if (model_flag) {
        snprintf(lm->name, sizeof lm->name, "%s", model_flag);
    } else if (saved[0]) {
        snprintf(lm->name, sizeof lm->name, "%s", saved);
    } else {
        st = ts_error(TS_ERR_FORMAT, "%s records no model name (train.model): pass --model", ckpt_path);
        goto fail;
    }
    ts_model_desc md;
    if (!ts_model_info(lm->name, &md)) {
        char esc[200];
        st = ts_error(TS_ERR_FORMAT, "%s: model '%s' is not one of the zoo's (pass --model)", ckpt_path,
                      cli_printable(lm->name, esc, sizeof esc));
        goto fail;
    }
    int64_t h = 0;
    if (ts_ckpt_get_i64(ck, "data.height", &h) != TS_OK) h = md.image_size;
    lm->image_size = md.fixed_size ? 0 : (int)h;
    if (!md.fixed_size && (h < 1 || h > 4096)) {
        st = ts_error(TS_ERR_FORMAT, "%s: data.height %lld is not an image size", ckpt_path, (long long)h);
        goto fail;
    }
    if ((st = ts_ckpt_get_tensors(ck, "model.", &sd)) != TS_OK) goto fail;
    if (!ts_train_checkpoint_classes(ck, &lm->classes)) {
        /* older checkpoints: the output layer's rows */
        ts_tensor *w = NULL;
        for (int i = 0; i < sd.n; i++)
            if (ts_tensor_ndim(sd.tensors[i]) == 2 && strstr(sd.names[i], "weight")) w = sd.tensors[i];
        lm->classes = w ? ts_tensor_shape(w)[0] : 0;
    }
    if (lm->classes < 1 || lm->classes > (1 << 24)) {
        st = ts_error(TS_ERR_FORMAT, "%s: %lld classes", ckpt_path, (long long)lm->classes);
        goto fail;
    }
    if (ts_ckpt_get_bytes(ck, "data.classes", &b, &n) == TS_OK && n > 0) {
        lm->names = malloc(n + 1);
        if (!lm->names) {
            st = ts_error(TS_ERR_NOMEM, "out of memory");
            goto fail;
        }
        memcpy(lm->names, b, n);
        lm->names[n] = '\0';
    }
    if ((st = ts_model_new(lm->name, lm->classes, NULL, &lm->m)) != TS_OK) goto fail;
    st = ts_module_load_state_dict_from(lm->m, &sd, true, saved[0] ? saved : NULL);
    if (st != TS_OK) {
        char why[1024]; /* ts_error writes the buffer ts_last_error reads: copy it first */
        snprintf(why, sizeof why, "%s", ts_last_error());
        st = ts_error(st, "%s: the weights do not fit --model %s with %lld classes: %s", ckpt_path, lm->name,
                      (long long)lm->classes, why);
        goto fail;
    }
    ts_module_train(lm->m, false);
    ts_tensor_list_clear(&sd);
    ts_ckpt_free(ck);
    return TS_OK;
fail:
    ts_tensor_list_clear(&sd);
    ts_ckpt_free(ck);
    loaded_free(lm);
    return st;
}

/* ---- tessera eval ------------------------------------------------------------------------------- */
static void print_confusion(const loaded_model *lm, const int64_t *cm) {
    int64_t C = lm->classes;
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

int ts_cmd_eval(int argc, char **argv) {
    const char *checkpoint = NULL, *data = "/usr/share/datasets/fashion-mnist", *model = NULL, *json = NULL, *split = "test";
    int64_t batch_size = 100, data_threads = 2, threads = 0, confusion = -1;
    const cli_flag flags[] = {
        {"checkpoint", CLI_STRING, &checkpoint, "training checkpoint to evaluate (required)", 1, 0},
        {"data", CLI_STRING, &data, "the data set as tessera train takes it; its evaluation split is used (t10k-* files, val/ or test/)", 1, 0},
        {"split", CLI_STRING, &split, "test (the evaluation split) or train (the training images, preprocessed for evaluation)", 1, 0},
        {"model", CLI_STRING, &model, "the model (default: the one the checkpoint records)", 1, 0},
        {"batch-size", CLI_INT, &batch_size, "images per forward pass", 1, 1 << 20},
        {"data-threads", CLI_INT, &data_threads, "worker threads decoding images", 1, 256},
        {"threads", CLI_INT, &threads, "CPU threads (0: OMP_NUM_THREADS or all cores)", 0, 4096},
        {"confusion", CLI_INT, &confusion, "print the confusion matrix: 1 yes, 0 no (default: up to 20 classes)", -1, 1},
        {"json", CLI_STRING, &json, "also write the figures (and the matrix) to this JSON file", 1, 0},
    };
    const cli_command cmd = {
        "eval", "tessera eval --checkpoint CKPT [--data DIR] [--split test|train] [flags]",
        "Evaluates a training checkpoint on a data set's evaluation split, as tessera train does after\n"
        "every epoch: top-1 and top-5 accuracy, mean cross-entropy and the confusion matrix.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (!checkpoint) return cli_usage_error(&cmd, "--checkpoint is required");
    if (strcmp(split, "test") != 0 && strcmp(split, "train") != 0)
        return cli_usage_error(&cmd, "unknown --split '%s' (expected test or train)", split);
    if (threads > 0) ts_set_num_threads((int)threads);
    loaded_model lm;
    if (load_model(checkpoint, model, &lm) != TS_OK) {
        fprintf(stderr, "tessera eval: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    int status = 1;
    ts_batch_source *train = NULL, *test = NULL;
    int64_t *cm = NULL;
    ts_data_opts d = TS_DATA_OPTS_INIT;
    d.path = data;
    d.batch_size = 1; /* the training source is opened for its class list only */
    d.eval_batch_size = batch_size;
    d.threads = (int)data_threads;
    d.image_size = lm.image_size;
    d.eval_on_train = strcmp(split, "train") == 0;
    if (ts_data_open(&d, &train, &test) != TS_OK) {
        fprintf(stderr, "tessera eval: --data %s: %s\n", data, ts_last_error());
        status = CLI_EXIT_USAGE;
        goto done;
    }
    int64_t dc = ts_batch_source_num_classes(train);
    if (dc > lm.classes) {
        fprintf(stderr, "tessera eval: --data %s has %lld classes, the checkpoint's model %lld\n", data, (long long)dc,
                (long long)lm.classes);
        status = CLI_EXIT_USAGE;
        goto done;
    }
    char nb[256];
    for (int64_t k = 0; lm.names && k < dc; k++) { /* the folders must be the ones it was trained on */
        const char *have = ts_batch_source_class_name(train, k);
        if (have && !ts_class_names_match(class_name(&lm, k, nb, sizeof nb), have, k)) {
            char esc[256];
            fprintf(stderr, "tessera eval: --data %s: class %lld is '%s', the checkpoint's is '%s'\n", data,
                    (long long)k, cli_printable(have, esc, sizeof esc), nb);
            status = CLI_EXIT_USAGE;
            goto done;
        }
    }
    cm = calloc((size_t)(lm.classes * lm.classes), sizeof *cm);
    ts_eval_result r;
    if (!cm || ts_evaluate_confusion(lm.m, test, cm, lm.classes, &r) != TS_OK) {
        fprintf(stderr, "tessera eval: %s\n", cm ? ts_last_error() : "out of memory");
        goto done;
    }
    printf("%s on %s%s: %lld images, accuracy %.2f%% (%lld correct), top-5 %.2f%%, loss %.4f\n", lm.name, data,
           d.eval_on_train ? " (training split)" : "", (long long)r.samples, 100.0 * r.accuracy, (long long)r.correct, 100.0 * r.top5_accuracy, r.loss);
    if (confusion == 1 || (confusion < 0 && lm.classes <= 20)) print_confusion(&lm, cm);
    status = 0;
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "tessera eval: --json %s: cannot write\n", json);
            status = 1;
            goto done;
        }
        fprintf(f, "{\n  \"model\": \"%s\",\n  \"split\": \"%s\",\n  \"samples\": %lld,\n  \"accuracy\": %.6f,\n  \"top5_accuracy\": %.6f,\n"
                   "  \"loss\": %.6f,\n  \"confusion\": [",
                lm.name, split, (long long)r.samples, r.accuracy, r.top5_accuracy, r.loss);
        for (int64_t i = 0; i < lm.classes; i++) {
            fprintf(f, "%s[", i ? ", " : "");
            for (int64_t j = 0; j < lm.classes; j++) fprintf(f, "%s%lld", j ? ", " : "", (long long)cm[i * lm.classes + j]);
            fprintf(f, "]");
        }
        fprintf(f, "]\n}\n");
        if (fclose(f) != 0) status = 1;
    }
done:
    free(cm);
    ts_batch_source_free(train);
    ts_batch_source_free(test);
    loaded_free(&lm);
    return status;
}

/* ---- tessera predict ---------------------------------------------------------------------------- */
int ts_cmd_predict(int argc, char **argv) {
    const char *checkpoint = NULL, *model = NULL;
    int64_t top = 5, threads = 0;
    const char *files[4096];
    int nfiles = 0;
    const cli_flag flags[] = {
        {"checkpoint", CLI_STRING, &checkpoint, "training checkpoint (required)", 1, 0},
        {"model", CLI_STRING, &model, "the model (default: the one the checkpoint records)", 1, 0},
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
    if (load_model(checkpoint, model, &lm) != TS_OK) {
        fprintf(stderr, "tessera predict: %s\n", ts_last_error());
        return CLI_EXIT_USAGE;
    }
    if (top > lm.classes) top = lm.classes;
    int C = lm.image_size > 0 ? 3 : 1, S = lm.image_size > 0 ? lm.image_size : 28, status = 0;
    ts_image im = TS_IMAGE_INIT;
    ts_tensor *x = NULL, *logits = NULL;
    int64_t *order = calloc((size_t)lm.classes, sizeof *order);
    if (!order || ts_tensor_empty(ts_device_cpu(), TS_F32, 4, (int64_t[]){1, C, S, S}, &x) != TS_OK) {
        fprintf(stderr, "tessera predict: out of memory\n");
        status = 1;
        goto done;
    }
    bool prev = ts_grad_set_enabled(false);
    for (int f = 0; f < nfiles; f++) {
        if (ts_image_read(files[f], C == 3 ? TS_COLOR_RGB : TS_COLOR_GRAY, &im) != TS_OK ||
            ts_data_preprocess(&im, lm.image_size, ts_tensor_data(x)) != TS_OK ||
            ts_module_forward(lm.m, x, &logits) != TS_OK) {
            fprintf(stderr, "tessera predict: %s\n", ts_last_error());
            status = 1;
            continue;
        }
        if (ts_tensor_dtype(logits) != TS_F32) { /* 16-bit under autocast (TS_AUTOCAST): read in float32 */
            ts_tensor *wide = NULL;
            ts_status st = ts_to_dtype(logits, TS_F32, &wide);
            ts_tensor_release(logits);
            logits = wide;
            if (st != TS_OK) {
                fprintf(stderr, "tessera predict: %s\n", ts_last_error());
                status = 1;
                continue;
            }
        }
        const float *z = ts_tensor_data(logits);
        double mx = z[0], se = 0;
        for (int64_t k = 1; k < lm.classes; k++) mx = z[k] > mx ? z[k] : mx;
        for (int64_t k = 0; k < lm.classes; k++) se += exp(z[k] - mx);
        for (int64_t k = 0; k < lm.classes; k++) order[k] = k;
        for (int64_t i = 0; i < top; i++) /* partial selection sort: the top-k in order */
            for (int64_t j = i + 1; j < lm.classes; j++)
                if (z[order[j]] > z[order[i]]) {
                    int64_t t = order[i];
                    order[i] = order[j];
                    order[j] = t;
                }
        printf("%s:", files[f]);
        char nb[256];
        for (int64_t i = 0; i < top; i++)
            printf("%s %s %.2f%%", i ? "," : "", class_name(&lm, order[i], nb, sizeof nb),
                   100.0 * exp(z[order[i]] - mx) / se);
        printf("\n");
        ts_tensor_release(logits);
        logits = NULL;
    }
    ts_grad_set_enabled(prev);
done:
    free(order);
    ts_image_free(&im);
    ts_tensor_release(x);
    loaded_free(&lm);
    return status;
}
