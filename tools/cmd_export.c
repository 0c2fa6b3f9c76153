/*
 * tools/cmd_export.c — `tessera export --format onnx`: a model (built by name,
 * or a checkpoint's: ts_checkpoint_model_load) written as an ONNX file for inference
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

/* Writes t (float32 or int64, CPU or not) as a NumPy .npy file (format 1.0, little-endian '<f4' or '<i8', C
 * order). */
static int write_npy(const char *path, ts_tensor *t) {
    int nd = ts_tensor_ndim(t);
    const int64_t *sh = ts_tensor_shape(t);
    char dict[256], shape[160] = "";
    size_t k = 0;
    for (int d = 0; d < nd; d++)
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%lld%s", (long long)sh[d], nd == 1 || d + 1 < nd ? ", " : "");
    int hl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                      ts_tensor_dtype(t) == TS_I64 ? "<i8" : "<f4", shape);
    size_t total = 10 + (size_t)hl + 1, pad = (64 - total % 64) % 64; /* header padded to 64 bytes, '\n' last */
    size_t nb = ts_tensor_nbytes(t);
    void *data = malloc(nb ? nb : 1);
    if (!data || ts_tensor_to_host(t, data, nb) != TS_OK) {
        free(data);
        fprintf(stderr, "tessera export: %s: cannot read the tensor: %s\n", path, ts_last_error());
        return 1;
    }
    ts_outfile *o = NULL;
    if (ts_outfile_open(path, "a NumPy file", &o) != TS_OK) {
        free(data);
        fprintf(stderr, "tessera export: %s\n", ts_last_error());
        return 1;
    }
    FILE *f = ts_outfile_stream(o);
    uint16_t hlen = (uint16_t)((size_t)hl + pad + 1);
    unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                               (unsigned char)(hlen >> 8)};
    bool ok = fwrite(magic, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)hl, f) == (size_t)hl;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF && fwrite(data, 1, nb, f) == nb;
    free(data);
    if (!ok) {
        ts_outfile_discard(o);
        fprintf(stderr, "tessera export: writing %s failed: %s\n", path, strerror(errno));
        return 1;
    }
    if (ts_outfile_close(o) != TS_OK) {
        fprintf(stderr, "tessera export: %s\n", ts_last_error());
        return 1;
    }
    return 0;
}

typedef struct export_args {
    const char *format, *model, *checkpoint, *out, *shape, *reference;
    int64_t seed;
    bool static_batch;
    int ndim;
    int64_t dims[EXPORT_MAX_DIMS];
} export_args;

static int export_flags(int argc, char **argv, export_args *a) {
    const cli_flag flags[] = {
        {"format", CLI_STRING, &a->format, "output format: onnx", 1, 0},
        {"model", CLI_STRING, &a->model, "model name (cnn, mlp, ...; default: the checkpoint's)", 1, 0},
        {"checkpoint", CLI_STRING, &a->checkpoint, "checkpoint whose model to export (default: fresh weights)", 1, 0},
        {"out", CLI_STRING, &a->out, "file to write (replaced atomically)", 1, 0},
        {"input-shape", CLI_STRING, &a->shape, "shape of the example input N,C,H,W (N is symbolic in the graph; default 1 x the checkpoint's input, else the model's: 1,1,28,28 or 1,3,224,224; a GPT: batch,sequence, default 1,its context)", 1, 0},
        {"seed", CLI_INT, &a->seed, "seed of fresh weights and of the example input's values", 0, 9.2e18},
        {"reference", CLI_STRING, &a->reference,
         "also write PREFIX.input.npy (the example) and PREFIX.output.npy (Tessera's outputs)", 1, 0},
        {"static-batch", CLI_BOOL, &a->static_batch, "fix the batch size to the example's instead of 'N'", 1, 0},
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
    if (rc) return rc;
    if (strcmp(a->format, "onnx") != 0) return cli_usage_error(&cmd, "unknown --format '%s' (supported: onnx)", a->format);
    if (!a->out) return cli_usage_error(&cmd, "--out FILE is required");
    if (a->shape && !parse_shape(a->shape, &a->ndim, a->dims))
        return cli_usage_error(&cmd, "--input-shape '%s': expected positive sizes separated by commas, e.g. 8,1,28,28",
                               a->shape);
    if (!a->model && !a->checkpoint) return cli_usage_error(&cmd, "--model NAME or --checkpoint CKPT is required");
    return 0;
}

/* --reference: the example and the model's outputs for it as .npy files. */
static int write_reference(const char *prefix, ts_module *m, ts_tensor *x) {
    char path[4096];
    ts_tensor *y = NULL;
    ts_module_train(m, false);
    bool g = ts_grad_set_enabled(false);
    ts_status st = ts_module_forward(m, x, &y);
    ts_grad_set_enabled(g);
    if (st != TS_OK) return cli_fail("export", "--reference forward");
    snprintf(path, sizeof path, "%s.input.npy", prefix);
    int rc = write_npy(path, x);
    snprintf(path, sizeof path, "%s.output.npy", prefix);
    if (rc == 0) rc = write_npy(path, y);
    ts_tensor_release(y);
    return rc;
}

int ts_cmd_export(int argc, char **argv) {
    export_args a = {.format = "onnx"};
    int rc = export_flags(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    ts_module *m = NULL;
    ts_tensor *x = NULL;
    const char *name = NULL;
    ts_status st = ts_export_model_new(a.checkpoint, a.model, (uint64_t)a.seed, a.shape ? a.ndim : 0, a.dims, &m, &x,
                                       &name);
    if (st != TS_OK) {
        fprintf(stderr, "tessera export: %s%s\n", a.checkpoint ? "" : "--model: ", ts_last_error());
        return cli_exit_for(st);
    }
    char shape[96]; /* "1,3,224,224": --input-shape's spelling */
    size_t k = 0;
    for (int i = 0; i < ts_tensor_ndim(x) && k < sizeof shape; i++)
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", i ? "," : "", (long long)ts_tensor_shape(x)[i]);
    rc = 1;
    ts_onnx_opts o = TS_ONNX_OPTS_INIT;
    o.dynamic_batch = !a.static_batch;
    if (ts_export_onnx(m, x, a.out, &o) != TS_OK)
        fprintf(stderr, "tessera export: %s\n", ts_last_error());
    else if (!a.reference || write_reference(a.reference, m, x) == 0)
        rc = 0;
    if (rc == 0) {
        struct stat sb;
        long long bytes = stat(a.out, &sb) == 0 ? (long long)sb.st_size : -1;
        char esc[1024];
        printf("wrote %s: %s as ONNX (IR 8, opset 17), input %s, %lld bytes\n", cli_printable(a.out, esc, sizeof esc),
               name, shape, bytes);
    }
    ts_tensor_release(x);
    ts_module_free(m);
    return rc;
}
