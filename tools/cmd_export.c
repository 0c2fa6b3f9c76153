/*
 * tools/cmd_export.c — `tessera export --format onnx`: a model (built by name,
 * with a checkpoint's `model.*` weights) written as an ONNX file for inference
 * runtimes. The export itself is the library's (ts_export_onnx, which traces
 * one forward); this file parses flags, builds the model and the example batch,
 * and with --reference also writes that batch and Tessera's outputs for it as
 * .npy files, so any runtime can be checked against them.
 */
#include "cli.h"
#include "commands.h"

#include "tessera.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EXPORT_MAX_DIMS 8

/* "8,1,28,28" -> shape; false when malformed (the caller prints). */
static bool parse_shape(const char *s, int *ndim, int64_t *shape) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 1 || v > (1LL << 31) || n == EXPORT_MAX_DIMS) return false;
        shape[n++] = v;
        if (*end == ',') end++;
        else if (*end) return false;
        p = end;
    }
    *ndim = n;
    return n > 0;
}

/* Writes t (float32, CPU or not) as a NumPy .npy file (format 1.0, little-endian '<f4', C order). */
static int write_npy(const char *path, ts_tensor *t) {
    int nd = ts_tensor_ndim(t);
    const int64_t *sh = ts_tensor_shape(t);
    char dict[256], shape[160] = "";
    size_t k = 0;
    for (int d = 0; d < nd; d++)
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%lld%s", (long long)sh[d], nd == 1 || d + 1 < nd ? ", " : "");
    int hl = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", shape);
    size_t total = 10 + (size_t)hl + 1, pad = (64 - total % 64) % 64; /* header padded to 64 bytes, '\n' last */
    size_t nb = ts_tensor_nbytes(t);
    float *data = malloc(nb ? nb : 1);
    if (!data || ts_tensor_to_host(t, data, nb) != TS_OK) {
        free(data);
        fprintf(stderr, "tessera export: %s: cannot read the tensor: %s\n", path, ts_last_error());
        return 1;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(data);
        fprintf(stderr, "tessera export: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    uint16_t hlen = (uint16_t)((size_t)hl + pad + 1);
    unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                               (unsigned char)(hlen >> 8)};
    bool ok = fwrite(magic, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)hl, f) == (size_t)hl;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF && fwrite(data, 1, nb, f) == nb;
    ok = (fclose(f) == 0) && ok;
    free(data);
    if (!ok) {
        fprintf(stderr, "tessera export: writing %s failed: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

/* Loads the checkpoint's model.* tensors into m (strict). *name gets train.model when present. */
static int load_checkpoint(const char *path, const char **model_name, char *name_buf, size_t cap, ts_ckpt **out) {
    if (ts_ckpt_load(path, out) != TS_OK) {
        fprintf(stderr, "tessera export: --checkpoint: %s\n", ts_last_error());
        return 1;
    }
    const void *p = NULL;
    size_t n = 0;
    if (ts_ckpt_has(*out, TS_CKPT_BYTES, "train.model") && ts_ckpt_get_bytes(*out, "train.model", &p, &n) == TS_OK &&
        n < cap) {
        memcpy(name_buf, p, n);
        name_buf[n] = '\0';
        if (*model_name && strcmp(*model_name, name_buf) != 0) {
            fprintf(stderr, "tessera export: --model %s, but %s was trained as '%s'\n", *model_name, path, name_buf);
            return CLI_EXIT_USAGE;
        }
        *model_name = name_buf;
    }
    return 0;
}

int ts_cmd_export(int argc, char **argv) {
    const char *format = "onnx", *model_name = NULL, *ckpt_path = NULL, *out = NULL, *shape_s = NULL,
               *reference = NULL;
    int64_t seed = 0;
    bool static_batch = false;
    const cli_flag flags[] = {
        {"format", CLI_STRING, &format, "output format: onnx", 1, 0},
        {"model", CLI_STRING, &model_name, "model name (cnn, mlp, ...; default: the checkpoint's)", 1, 0},
        {"checkpoint", CLI_STRING, &ckpt_path, "checkpoint whose model.* tensors to load (default: fresh weights)", 1, 0},
        {"out", CLI_STRING, &out, "file to write (replaced atomically)", 1, 0},
        {"input-shape", CLI_STRING, &shape_s, "shape of the example input N,C,H,W (N is symbolic in the graph; default 1 x the checkpoint's data.channels/height/width, else the model's input: 1,1,28,28 or 1,3,224,224)", 1, 0},
        {"seed", CLI_INT, &seed, "seed of fresh weights and of the example input's values", 0, 9.2e18},
        {"reference", CLI_STRING, &reference,
         "also write PREFIX.input.npy (the example) and PREFIX.output.npy (Tessera's outputs)", 1, 0},
        {"static-batch", CLI_BOOL, &static_batch, "fix the batch size to the example's instead of 'N'", 1, 0},
    };
    const cli_command cmd = {
        "export", "tessera export --format onnx --model NAME [--checkpoint CKPT] --out FILE [flags]",
        "Writes a model for inference runtimes. ONNX: the forward is traced once on an example\n"
        "input in eval mode (ONNX IR 8, opset 17); parameters and buffers become initializers under\n"
        "their state-dict names; the batch dimension is symbolic ('N') unless --static-batch.\n"
        "Exit status: 0 written, 1 export failed (an op without an ONNX mapping names itself),\n"
        "2 bad usage or unreadable checkpoint.",
        flags, (int)(sizeof flags / sizeof flags[0])};
    int rc = cli_parse(&cmd, argc, argv, NULL, 0, NULL);
    if (rc) return rc == 1 ? 0 : rc;
    if (strcmp(format, "onnx") != 0) return cli_usage_error(&cmd, "unknown --format '%s' (supported: onnx)", format);
    if (!out) return cli_usage_error(&cmd, "--out FILE is required");
    int ndim = 0;
    int64_t shape[EXPORT_MAX_DIMS];
    if (shape_s && !parse_shape(shape_s, &ndim, shape))
        return cli_usage_error(&cmd, "--input-shape '%s': expected positive sizes separated by commas, e.g. 8,1,28,28",
                               shape_s);

    ts_ckpt *ck = NULL;
    char name_buf[256];
    if (ckpt_path && (rc = load_checkpoint(ckpt_path, &model_name, name_buf, sizeof name_buf, &ck)) != 0) {
        ts_ckpt_free(ck);
        return rc == 1 ? CLI_EXIT_USAGE : rc;
    }
    if (!model_name) {
        ts_ckpt_free(ck);
        return cli_usage_error(&cmd, "--model NAME is required (the checkpoint does not name its model)");
    }

    ts_rng rng;
    ts_rng_seed(&rng, (uint64_t)seed);
    ts_module *m = NULL;
    ts_tensor *x = NULL, *y = NULL;
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    rc = 1;
    /* the class count and input the checkpoint's data had (tessera train records them), else the zoo's */
    ts_model_desc md;
    int64_t classes = 0, dc = 0, dh = 0, dw = 0;
    char shape_buf[96];
    ts_train_checkpoint_classes(ck, &classes);
    if (ts_model_new(model_name, classes, &rng, &m) != TS_OK || !ts_model_info(model_name, &md)) {
        fprintf(stderr, "tessera export: --model: %s\n", ts_last_error());
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    if (!shape_s) {
        if (!(ck && ts_ckpt_get_i64(ck, "data.channels", &dc) == TS_OK && ts_ckpt_get_i64(ck, "data.height", &dh) == TS_OK &&
              ts_ckpt_get_i64(ck, "data.width", &dw) == TS_OK && dc > 0 && dh > 0 && dw > 0)) {
            dc = md.in_channels;
            dh = dw = md.image_size;
        }
        ndim = 4;
        shape[0] = 1, shape[1] = dc, shape[2] = dh, shape[3] = dw;
        snprintf(shape_buf, sizeof shape_buf, "1,%lld,%lld,%lld", (long long)dc, (long long)dh, (long long)dw);
        shape_s = shape_buf;
    }
    if (ck && (ts_ckpt_get_tensors(ck, "model.", &sd) != TS_OK || ts_module_load_state_dict(m, &sd, true) != TS_OK)) {
        fprintf(stderr, "tessera export: loading %s into %s: %s\n", ckpt_path, model_name, ts_last_error());
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    ts_rng_seed(&rng, (uint64_t)seed + 1);
    if (ts_tensor_empty(ts_device_cpu(), TS_F32, ndim, shape, &x) != TS_OK || ts_tensor_normal_(x, 0, 1, &rng) != TS_OK) {
        cli_fail("export", "example input");
        goto done;
    }
    ts_onnx_opts o = TS_ONNX_OPTS_INIT;
    o.dynamic_batch = !static_batch;
    if (ts_export_onnx(m, x, out, &o) != TS_OK) {
        fprintf(stderr, "tessera export: %s\n", ts_last_error());
        goto done;
    }
    if (reference) {
        char path[4096];
        ts_module_train(m, false);
        bool g = ts_grad_set_enabled(false);
        ts_status st = ts_module_forward(m, x, &y);
        ts_grad_set_enabled(g);
        if (st != TS_OK) {
            cli_fail("export", "--reference forward");
            goto done;
        }
        snprintf(path, sizeof path, "%s.input.npy", reference);
        if (write_npy(path, x)) goto done;
        snprintf(path, sizeof path, "%s.output.npy", reference);
        if (write_npy(path, y)) goto done;
    }
    struct stat sb;
    long long bytes = stat(out, &sb) == 0 ? (long long)sb.st_size : -1;
    printf("wrote %s: %s as ONNX (IR 8, opset 17), input %s, %lld bytes\n", out, model_name, shape_s, bytes);
    rc = 0;
done:
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_tensor_list_clear(&sd);
    ts_module_free(m);
    ts_ckpt_free(ck);
    return rc;
}
