/*
 * nn/models.c — model builders with PyTorch's state-dict names: the reference
 * CNN and the MLP (both for 1x28x28 inputs), torchvision's ResNets, and lookup
 * by name.
 */
#include "nn/module.h"

#include <math.h>
#include <stdio.h>

static ts_status reference_cnn(int64_t classes, ts_rng *rng, ts_module **out);
static ts_status mlp(int64_t classes, ts_rng *rng, ts_module **out);

/* Appends *child, made by a constructor call whose status is st (read *child
 * only here: argument evaluation order is unspecified). */
static ts_status add(ts_module *seq, ts_status st, ts_module **child) {
    if (st != TS_OK) return st;
    ts_module *c = *child;
    *child = NULL;
    return ts_nn_sequential_add(seq, NULL, c);
}

ts_status ts_model_reference_cnn(ts_rng *rng, ts_module **out) { return reference_cnn(10, rng, out); }

static ts_status reference_cnn(int64_t classes, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_model_reference_cnn: NULL out");
    ts_module *s = NULL, *c = NULL;
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    ts_pool2d_params pool = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, false};
    ts_status st;
    TS_CHECK_GOTO(ts_nn_sequential_new(&s));
    /* (N, 1, 28, 28) -> (N, 32, 14, 14) */
    TS_CHECK_GOTO(add(s, ts_nn_conv2d_new(1, 32, 3, 3, p, true, rng, &c), &c));        /* 0 */
    TS_CHECK_GOTO(add(s, ts_nn_batchnorm2d_new(32, 1e-5f, 0.1f, true, true, &c), &c)); /* 1 */
    TS_CHECK_GOTO(add(s, ts_nn_relu_new(&c), &c));                                      /* 2 */
    TS_CHECK_GOTO(add(s, ts_nn_maxpool2d_new(pool, &c), &c));                           /* 3 */
    /* -> (N, 64, 7, 7) */
    TS_CHECK_GOTO(add(s, ts_nn_conv2d_new(32, 64, 3, 3, p, true, rng, &c), &c));       /* 4 */
    TS_CHECK_GOTO(add(s, ts_nn_batchnorm2d_new(64, 1e-5f, 0.1f, true, true, &c), &c)); /* 5 */
    TS_CHECK_GOTO(add(s, ts_nn_relu_new(&c), &c));                                      /* 6 */
    TS_CHECK_GOTO(add(s, ts_nn_maxpool2d_new(pool, &c), &c));                           /* 7 */
    /* -> (N, 3136) -> (N, 128) -> (N, 10) */
    TS_CHECK_GOTO(add(s, ts_nn_flatten_new(&c), &c));                                   /* 8 */
    TS_CHECK_GOTO(add(s, ts_nn_linear_new(3136, 128, true, rng, &c), &c));              /* 9 */
    TS_CHECK_GOTO(add(s, ts_nn_relu_new(&c), &c));                                      /* 10 */
    TS_CHECK_GOTO(add(s, ts_nn_linear_new(128, classes, true, rng, &c), &c));           /* 11 */
    *out = s;
    return TS_OK;
fail:
    ts_module_free(s);
    return st;
}

ts_status ts_model_mlp(ts_rng *rng, ts_module **out) { return mlp(10, rng, out); }

static ts_status mlp(int64_t classes, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_model_mlp: NULL out");
    ts_module *s = NULL, *c = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_nn_sequential_new(&s));
    TS_CHECK_GOTO(add(s, ts_nn_flatten_new(&c), &c));                      /* 0: (N, 1, 28, 28) -> (N, 784) */
    TS_CHECK_GOTO(add(s, ts_nn_linear_new(784, 256, true, rng, &c), &c));  /* 1 */
    TS_CHECK_GOTO(add(s, ts_nn_relu_new(&c), &c));                         /* 2 */
    TS_CHECK_GOTO(add(s, ts_nn_linear_new(256, classes, true, rng, &c), &c)); /* 3 */
    *out = s;
    return TS_OK;
fail:
    ts_module_free(s);
    return st;
}

/* ---- ResNets (torchvision.models.resnet) ---------------------------------------------------------- */
/* torchvision's initialisation of every Conv2d below m: kaiming_normal_(mode="fan_out",
 * nonlinearity="relu"), std = sqrt(2 / (out_channels * kh * kw)). BatchNorm2d is already
 * weight 1, bias 0; fc keeps Linear's default. */
static ts_status kaiming_fan_out(ts_module *m, ts_rng *rng) {
    if (ts_module_kind(m) == TS_MODULE_CONV2D) {
        int64_t cout = 0;
        int kh = 0, kw = 0;
        TS_TRY(ts_conv2d_get_config(m, NULL, &cout, &kh, &kw, NULL, NULL));
        TS_TRY(ts_tensor_normal_(ts_module_param(m, "weight"), 0.0f, (float)sqrt(2.0 / (double)(cout * kh * kw)),
                                 rng));
    }
    for (int i = 0; i < m->nchildren; i++) TS_TRY(kaiming_fan_out(m->children[i], rng));
    return TS_OK;
}

/* layer<k>: `blocks` blocks, the first with `stride` (and the downsample), as torchvision's _make_layer. */
static ts_status resnet_layer(bool bottleneck, int64_t *inplanes, int64_t planes, int blocks, int stride,
                              ts_rng *rng, ts_module **out) {
    ts_module *seq = NULL, *b = NULL;
    ts_status st;
    TS_CHECK_GOTO(ts_nn_sequential_new(&seq));
    for (int i = 0; i < blocks; i++) {
        int s = i == 0 ? stride : 1;
        if (bottleneck) {
            TS_CHECK_GOTO(add(seq, ts_nn_bottleneck_new(*inplanes, planes, planes * 4, s, rng, &b), &b));
            *inplanes = planes * 4;
        } else {
            TS_CHECK_GOTO(add(seq, ts_nn_residual_block_new(*inplanes, planes, s, rng, &b), &b));
            *inplanes = planes;
        }
    }
    *out = seq;
    return TS_OK;
fail:
    ts_module_free(seq);
    return st;
}

/* Appends *child under `name` (a constructor's result, as add()). */
static ts_status add_named(ts_module *seq, const char *name, ts_status st, ts_module **child) {
    if (st != TS_OK) return st;
    ts_module *c = *child;
    *child = NULL;
    return ts_nn_sequential_add(seq, name, c);
}

static const char *resnet_name(int depth);

ts_status ts_model_resnet(int depth, int64_t num_classes, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_model_resnet: NULL out");
    static const struct {
        int depth, blocks[4];
        bool bottleneck;
    } arch[] = {{18, {2, 2, 2, 2}, false}, {34, {3, 4, 6, 3}, false}, {50, {3, 4, 6, 3}, true},
                {101, {3, 4, 23, 3}, true}, {152, {3, 8, 36, 3}, true}};
    int a = -1;
    for (int i = 0; i < (int)(sizeof arch / sizeof arch[0]); i++)
        if (arch[i].depth == depth) a = i;
    TS_ARG(a >= 0, "ts_model_resnet: no ResNet of depth %d (18, 34, 50, 101, 152)", depth);
    TS_ARG(num_classes >= 1, "ts_model_resnet: num_classes %lld must be >= 1", (long long)num_classes);
    ts_module *s = NULL, *c = NULL;
    ts_conv2d_params p = TS_CONV2D_DEFAULT;
    p.stride[0] = p.stride[1] = 2;
    p.padding[0] = p.padding[1] = 3;
    ts_pool2d_params pool = {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false, false};
    int64_t inplanes = 64;
    static const char *const layer_names[4] = {"layer1", "layer2", "layer3", "layer4"};
    ts_status st;
    TS_CHECK_GOTO(ts_nn_sequential_new(&s));
    /* (N, 3, H, W) -> (N, 64, H/4, W/4) */
    TS_CHECK_GOTO(add_named(s, "conv1", ts_nn_conv2d_new(3, 64, 7, 7, p, false, rng, &c), &c));
    TS_CHECK_GOTO(add_named(s, "bn1", ts_nn_batchnorm2d_new(64, 1e-5f, 0.1f, true, true, &c), &c));
    TS_CHECK_GOTO(add_named(s, "relu", ts_nn_relu_new(&c), &c));
    TS_CHECK_GOTO(add_named(s, "maxpool", ts_nn_maxpool2d_new(pool, &c), &c));
    /* -> (N, 512 * expansion, H/32, W/32) */
    for (int l = 0; l < 4; l++)
        TS_CHECK_GOTO(add_named(s, layer_names[l],
                                resnet_layer(arch[a].bottleneck, &inplanes, 64 << l, arch[a].blocks[l], l ? 2 : 1,
                                             rng, &c),
                                &c));
    /* -> (N, 512 * expansion) -> (N, num_classes) */
    TS_CHECK_GOTO(add_named(s, "avgpool", ts_nn_global_avgpool2d_new(&c), &c));
    TS_CHECK_GOTO(add_named(s, "flatten", ts_nn_flatten_new(&c), &c));
    TS_CHECK_GOTO(add_named(s, "fc", ts_nn_linear_new(inplanes, num_classes, true, rng, &c), &c));
    TS_CHECK_GOTO(kaiming_fan_out(s, rng));
    s->model_name = resnet_name(depth);
    *out = s;
    return TS_OK;
fail:
    ts_module_free(s);
    return st;
}

/* ---- lookup by name ------------------------------------------------------------------------------- */
static const struct {
    const char *name;
    int depth;            /* ResNets; 0 for the 28x28 models */
    int64_t classes;      /* default */
    int channels, size;   /* input: 1x28x28 gray, or RGB at any size (224 is ImageNet's) */
} models[] = {{"cnn", 0, 10, 1, 28},         {"mlp", 0, 10, 1, 28},         {"resnet18", 18, 1000, 3, 224},
              {"resnet34", 34, 1000, 3, 224}, {"resnet50", 50, 1000, 3, 224}, {"resnet101", 101, 1000, 3, 224},
              {"resnet152", 152, 1000, 3, 224}};
#define NMODELS ((int)(sizeof models / sizeof models[0]))

static int find_model(const char *name) {
    for (int i = 0; name && i < NMODELS; i++)
        if (!strcmp(models[i].name, name)) return i;
    return -1;
}

/* The index of GPT preset `name` among ts_gpt_preset_name_at's, or -1. */
static int find_gpt(const char *name) {
    for (int i = 0; name && ts_gpt_preset_name_at(i); i++)
        if (!strcmp(ts_gpt_preset_name_at(i), name)) return i;
    return -1;
}

static ts_status unknown_model(const char *fn, const char *name) {
    char known[512] = "";
    for (int i = 0; ts_model_name_at(i); i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", ts_model_name_at(i));
    return ts_error(TS_ERR_INVALID_ARG, "%s: unknown model '%s' (known: %s)", fn, name ? name : "(null)", known);
}

bool ts_model_info(const char *name, ts_model_desc *out) {
    int i = find_model(name), g = i < 0 ? find_gpt(name) : -1;
    if (i < 0 && g < 0) return false;
    if (!out) return true;
    memset(out, 0, sizeof *out);
    if (g >= 0) {
        ts_gpt_config c;
        (void)ts_gpt_preset(ts_gpt_preset_name_at(g), &c);
        out->name = ts_gpt_preset_name_at(g);
        out->num_classes = c.vocab_size;
        out->tokens = true;
        out->seq_len = c.seq_len;
        return true;
    }
    out->name = models[i].name;
    out->num_classes = models[i].classes;
    out->in_channels = models[i].channels;
    out->image_size = models[i].size;
    out->fixed_size = models[i].depth == 0;
    return true;
}

const char *ts_model_name_at(int i) {
    if (i >= 0 && i < NMODELS) return models[i].name;
    return i >= NMODELS ? ts_gpt_preset_name_at(i - NMODELS) : NULL;
}

ts_status ts_model_new(const char *name, int64_t num_classes, ts_rng *rng, ts_module **out) {
    TS_ARG(out, "ts_model_new: NULL out");
    int i = find_model(name);
    if (i < 0 && find_gpt(name) >= 0) { /* a GPT-2 preset with num_classes tokens */
        ts_gpt_config c;
        TS_TRY(ts_gpt_preset(name, &c));
        if (num_classes > 0) c.vocab_size = num_classes;
        return ts_model_gpt(&c, rng, out);
    }
    if (i < 0) return unknown_model("ts_model_new", name);
    if (num_classes <= 0) num_classes = models[i].classes;
    if (models[i].depth) return ts_model_resnet(models[i].depth, num_classes, rng, out);
    TS_TRY(strcmp(name, "cnn") == 0 ? reference_cnn(num_classes, rng, out) : mlp(num_classes, rng, out));
    (*out)->model_name = models[i].name;
    return TS_OK;
}

/* The zoo's name of the ResNet of this depth (static). */
static const char *resnet_name(int depth) {
    for (int i = 0; i < NMODELS; i++)
        if (models[i].depth == depth) return models[i].name;
    return NULL;
}

ts_status ts_model_by_name(const char *name, ts_rng *rng, ts_module **out) {
    TS_ARG(name && out, "ts_model_by_name: NULL argument");
    if (!ts_model_info(name, NULL)) return unknown_model("ts_model_by_name", name);
    return ts_model_new(name, 0, rng, out);
}
