/*
 * tests/test_gpt.c — the GPT-2 model (src/nn/gpt.c) and its cached generation (src/nn/gpt_generate.c):
 *  - against Hugging Face's GPT2LMHeadModel through tests/golden/gpt.tsg.gz and gpt_tiny.safetensors
 *    (scripts/gen_gpt_golden.py; the file names the torch and transformers versions): the safetensors
 *    file imported, logits and loss within 1e-5, every gradient within 1e-4 of its largest value, 20
 *    AdamW steps with nanoGPT's decay groups within 1e-4 (gpt_tiny_trained.safetensors), the trained
 *    model's greedy generation token for token;
 *  - names, shapes, presets, initialisation, argument errors, the state dict's tied head;
 *  - the key/value cache: logits at every position equal to the full forward's, one token at a time
 *    and after a prefill; sampling deterministic for a seed, top-k, nanoGPT's crop past seq_len;
 *  - the optimizers' weight-decay groups.
 */
#include "golden_io.h"
#include "test_util.h"

static ts_tensor_list golden;
static bool golden_ok;

static char *version_of(const char *rec, char *buf, size_t n) {
    ts_tensor *v = tg_get(&golden, rec);
    buf[0] = 0;
    for (int64_t i = 0; v && i < ts_tensor_numel(v) && i < (int64_t)n - 1; i++) {
        buf[i] = (char)((const int32_t *)ts_tensor_data(v))[i];
        buf[i + 1] = 0;
    }
    return buf;
}

static bool load_golden(void) {
    static bool tried;
    if (!tried) {
        tried = true;
        golden_ok = tg_load(TS_TEST_DIR "/golden/gpt.tsg.gz", &golden) == TS_OK;
        if (!golden_ok) fprintf(stderr, "golden: %s\n", ts_last_error());
        char a[64], b[64];
        printf("  golden values from torch %s, transformers %s\n", version_of("torch_version", a, sizeof a),
               version_of("transformers_version", b, sizeof b));
    }
    CHECK(golden_ok);
    return golden_ok;
}

static ts_gpt_config golden_config(void) {
    ts_tensor *c = tg_get(&golden, "config");
    ts_gpt_config g = TS_GPT_CONFIG_INIT;
    g.n_layer = tg_int(c, 0);
    g.n_head = tg_int(c, 1);
    g.n_embd = tg_int(c, 2);
    g.seq_len = tg_int(c, 3);
    g.vocab_size = tg_int(c, 4);
    return g;
}

#define GOLDEN_INIT TS_TEST_DIR "/golden/gpt_tiny.safetensors"           /* as initialised */
#define GOLDEN_TRAINED TS_TEST_DIR "/golden/gpt_tiny_trained.safetensors" /* after 20 AdamW steps */

/* The golden model: built, then Hugging Face's safetensors file loaded. */
static ts_module *golden_model_from(const char *path) {
    ts_module *m = NULL;
    ts_gpt_config c = golden_config();
    CHECK_OK(ts_model_gpt(&c, NULL, &m));
    CHECK_OK(ts_gpt_load_safetensors(m, path));
    return m;
}
static ts_module *golden_model(void) { return golden_model_from(GOLDEN_INIT); }

/* max |a - b| and max |b| over two same-shaped f32 tensors */
static void diff(const ts_tensor *a, const ts_tensor *b, double *max_abs, double *max_ref) {
    tg_diff d = tg_compare(a, b, 1.0, 0.0);
    CHECK(d.shape_ok);
    *max_abs = d.max_abs;
    *max_ref = 0;
    const int64_t n = ts_tensor_numel(b);
    float *p = malloc(sizeof(float) * (size_t)n);
    CHECK_OK(ts_tensor_to_host(b, p, sizeof(float) * (size_t)n));
    for (int64_t i = 0; i < n; i++) *max_ref = fmax(*max_ref, fabs(p[i]));
    free(p);
}

/* logits, loss and loss's gradients of the golden case against transformers', on dev: logits and loss within
 * tol, every gradient within gtol of its largest value */
static void check_case(const char *cas, ts_device *dev, double tol, double gtol) {
    if (!load_golden()) return;
    ts_module *m = golden_model();
    CHECK_OK(ts_module_to(m, dev));
    ts_tensor *ids = tg_on_device(tg_getf(&golden, "%s/ids", cas), dev),
              *tg = tg_on_device(tg_getf(&golden, "%s/targets", cas), dev), *lg = NULL, *l2 = NULL, *t1 = NULL,
              *loss = NULL;
    const int64_t V = golden_config().vocab_size;
    CHECK_OK(ts_module_forward(m, ids, &lg));
    double e, ref;
    diff(lg, tg_getf(&golden, "%s/logits", cas), &e, &ref);
    printf("  %s on %s: logits max |diff| %.3g (max |logit| %.3g)\n", cas, ts_device_name(dev), e, ref);
    CHECK(e <= tol);
    CHECK_OK(ts_reshape(lg, 2, (int64_t[]){-1, V}, &l2));
    CHECK_OK(ts_reshape(tg, 1, (int64_t[]){-1}, &t1));
    CHECK_OK(ts_cross_entropy(l2, t1, 0.0f, &loss));
    const double dl = fabs(ts_tensor_item(loss, 0) - tg_float(tg_getf(&golden, "%s/loss", cas), 0));
    printf("  %s: loss %.7f, |diff| %.3g\n", cas, ts_tensor_item(loss, 0), dl);
    CHECK(dl <= tol);
    CHECK_OK(ts_backward(loss, NULL, false));
    ts_tensor_list ps = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_parameters(m, &ps));
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < ps.n; i++) {
        ts_tensor *want = tg_getf(&golden, "%s/grad/%s", cas, ps.names[i]);
        CHECK(want && ts_tensor_grad(ps.tensors[i]));
        if (!want || !ts_tensor_grad(ps.tensors[i])) continue;
        diff(ts_tensor_grad(ps.tensors[i]), want, &e, &ref);
        if (e / ref > worst) worst = e / ref, worst_name = ps.names[i];
        if (e > gtol * ref) fprintf(stderr, "  grad %s: |diff| %.3g, max |grad| %.3g\n", ps.names[i], e, ref);
        CHECK(e <= gtol * ref);
    }
    printf("  %s: %d gradients, worst max |diff| / max |grad| %.3g (%s)\n", cas, ps.n, worst, worst_name);
    ts_tensor_list_clear(&ps);
    ts_tensor_release(ids);
    ts_tensor_release(tg);
    ts_tensor_release(lg);
    ts_tensor_release(l2);
    ts_tensor_release(t1);
    ts_tensor_release(loss);
    ts_module_free(m);
}

static void test_golden_full(void) { check_case("full", ts_device_cpu(), 1e-5, 1e-4); }
static void test_golden_short(void) { check_case("short", ts_device_cpu(), 1e-5, 1e-4); }

static void test_golden_adamw(void) {
    if (!load_golden()) return;
    ts_module *m = golden_model();
    ts_tensor *hp = tg_get(&golden, "adamw/hparams"), *ids = tg_get(&golden, "full/ids"), *tg = tg_get(&golden, "full/targets");
    ts_adamw_config c = TS_ADAMW_CONFIG_INIT;
    c.lr = tg_float(hp, 0);
    c.beta1 = tg_float(hp, 1);
    c.beta2 = tg_float(hp, 2);
    c.eps = tg_float(hp, 3);
    c.weight_decay = tg_float(hp, 4);
    ts_tensor_list ps = TS_TENSOR_LIST_INIT;
    ts_optimizer *opt = NULL;
    CHECK_OK(ts_module_parameters(m, &ps));
    CHECK_OK(ts_optim_adamw_new(&ps, &c, &opt));
    CHECK_OK(ts_optimizer_set_decay_rule(opt, TS_DECAY_MATRICES));
    CHECK(ts_optimizer_decays(opt, "transformer.wte.weight") && ts_optimizer_decays(opt, "transformer.h.0.attn.c_attn.weight"));
    CHECK(!ts_optimizer_decays(opt, "transformer.h.0.attn.c_attn.bias") && !ts_optimizer_decays(opt, "transformer.ln_f.weight"));
    ts_tensor *t1 = NULL;
    CHECK_OK(ts_reshape(tg, 1, (int64_t[]){-1}, &t1));
    double worst_loss = 0;
    for (int s = 0; s < 20; s++) {
        ts_tensor *lg = NULL, *l2 = NULL, *loss = NULL;
        ts_optimizer_zero_grad(opt);
        CHECK_OK(ts_module_forward(m, ids, &lg));
        CHECK_OK(ts_reshape(lg, 2, (int64_t[]){-1, golden_config().vocab_size}, &l2));
        CHECK_OK(ts_cross_entropy(l2, t1, 0.0f, &loss));
        worst_loss = fmax(worst_loss, fabs(ts_tensor_item(loss, 0) - tg_float(tg_get(&golden, "adamw/loss"), s)));
        CHECK_OK(ts_backward(loss, NULL, false));
        CHECK_OK(ts_optimizer_step(opt));
        ts_tensor_release(lg);
        ts_tensor_release(l2);
        ts_tensor_release(loss);
    }
    double worst = 0, e, ref;
    ts_tensor_list trained = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_safetensors_load(GOLDEN_TRAINED, 0, &trained, NULL));
    CHECK(trained.n == ps.n);
    for (int i = 0; i < ps.n; i++) {
        ts_tensor *want = ts_tensor_list_find(&trained, ps.names[i]);
        CHECK(want != NULL);
        if (!want) continue;
        diff(ps.tensors[i], want, &e, &ref);
        worst = fmax(worst, e);
        if (e > 1e-4) fprintf(stderr, "  %s after 20 steps: |diff| %.3g\n", ps.names[i], e);
        CHECK(e <= 1e-4);
    }
    printf("  20 AdamW steps: losses max |diff| %.3g, parameters max |diff| %.3g\n", worst_loss, worst);
    CHECK(worst_loss <= 1e-4);
    ts_tensor_list_clear(&trained);
    ts_tensor_release(t1);
    ts_optimizer_free(opt);
    ts_tensor_list_clear(&ps);
    ts_module_free(m);
}

/* the trained golden model's greedy tokens on dev against transformers' */
static void check_greedy(ts_device *dev) {
    if (!load_golden()) return;
    ts_module *m = golden_model_from(GOLDEN_TRAINED);
    CHECK_OK(ts_module_to(m, dev));
    ts_tensor *p = tg_get(&golden, "gen/prompt"), *want = tg_get(&golden, "gen/greedy");
    const int64_t np = ts_tensor_numel(p), nw = ts_tensor_numel(want);
    int64_t prompt[16], out[64], n = -1;
    for (int64_t i = 0; i < np; i++) prompt[i] = tg_int(p, i);
    ts_gpt_sample_config sc = TS_GPT_SAMPLE_CONFIG_INIT;
    sc.max_new_tokens = nw;
    sc.temperature = 0.0f;
    CHECK_OK(ts_gpt_generate(m, prompt, np, &sc, out, &n));
    CHECK(n == nw);
    int same = 0;
    for (int64_t i = 0; i < nw && i < n; i++) same += out[i] == tg_int(want, i);
    printf("  greedy: %d of %lld tokens equal to transformers' generate(do_sample=False)\n", same, (long long)nw);
    CHECK(same == nw);
    /* top_k 1 is greedy too, whatever the temperature */
    int64_t out2[64];
    sc.temperature = 0.7f;
    sc.top_k = 1;
    sc.seed = 5;
    CHECK_OK(ts_gpt_generate(m, prompt, np, &sc, out2, &n));
    CHECK(n == nw && !memcmp(out, out2, sizeof(int64_t) * (size_t)nw));
    ts_module_free(m);
}

static void test_golden_greedy(void) { check_greedy(ts_device_cpu()); }

/* On TS_TEST_DEVICE (cuda:0 in scripts/gpu_check.sh; the CPU when unset): the golden cases' logits, loss and
 * gradients (the device's own float32 sums: 1e-4 and 1e-3 of the largest gradient) and greedy generation
 * through the cache (the attention kernel, or the matmul path where the device has none). */
static void test_device(void) {
    ts_device *dev = tu_test_device();
    check_case("full", dev, 1e-4, 1e-3);
    check_case("short", dev, 1e-4, 1e-3);
    check_greedy(dev);
}

/* ---- names, shapes, presets ---------------------------------------------------------------------------- */
static void test_names_match_transformers_file(void) {
    if (!load_golden()) return;
    ts_module *m = NULL;
    ts_gpt_config c = golden_config();
    CHECK_OK(ts_model_gpt(&c, NULL, &m));
    ts_tensor_list hf = TS_TENSOR_LIST_INIT, sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_safetensors_load(GOLDEN_INIT, 0, &hf, NULL));
    CHECK_OK(ts_module_state_dict(m, &sd));
    CHECK(hf.n == sd.n && sd.n == 2 + 12 * (int)c.n_layer + 2);
    for (int i = 0; i < sd.n; i++) {
        ts_tensor *t = ts_tensor_list_find(&hf, sd.names[i]);
        CHECK(t && ts_tensor_ndim(t) == ts_tensor_ndim(sd.tensors[i]));
        if (t) CHECK(!memcmp(ts_tensor_shape(t), ts_tensor_shape(sd.tensors[i]), sizeof(int64_t) * (size_t)ts_tensor_ndim(t)));
    }
    CHECK(!strcmp(sd.names[0], "transformer.wte.weight") && !strcmp(sd.names[4], "transformer.h.0.attn.c_attn.weight"));
    CHECK(!strcmp(ts_module_model_name(m), "gpt2"));
    ts_tensor_list_clear(&hf);
    ts_tensor_list_clear(&sd);
    ts_module_free(m);
}

static void test_presets_and_errors(void) {
    ts_gpt_config c;
    CHECK_OK(ts_gpt_preset("gpt2-medium", &c));
    CHECK(c.n_layer == 24 && c.n_head == 16 && c.n_embd == 1024 && c.seq_len == 1024 && c.vocab_size == 50257);
    CHECK_OK(ts_gpt_preset("gpt2", &c));
    ts_gpt_config d = TS_GPT_CONFIG_INIT;
    CHECK(c.n_layer == d.n_layer && c.n_head == d.n_head && c.n_embd == d.n_embd && c.seq_len == d.seq_len &&
          c.vocab_size == d.vocab_size && c.dropout == 0 && c.layer_norm_eps == 1e-5f && c.init_std == 0.02f);
    CHECK(d.n_layer == 12 && d.n_head == 12 && d.n_embd == 768 && d.seq_len == 1024 && d.vocab_size == 50257);
    CHECK_STATUS(ts_gpt_preset("gpt5", &c), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("gpt2-tiny");
    CHECK(ts_gpt_preset_name_at(0) && !ts_gpt_preset_name_at(99));
    ts_module *m = NULL;
    CHECK_OK(ts_gpt_preset("gpt2-tiny", &c));
    c.n_head = 3;
    CHECK_STATUS(ts_model_gpt(&c, NULL, &m), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("n_head 3");
    c.n_head = 2;
    c.seq_len = 8;
    CHECK_OK(ts_model_gpt(&c, NULL, &m));
    ts_tensor *ids = NULL, *y = NULL, *f = NULL;
    int64_t v[18] = {0};
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 2, (int64_t[]){2, 9}, v, &ids));
    CHECK_STATUS(ts_module_forward(m, ids, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("sequence length 9");
    CHECK_ERR_MENTIONS("seq_len 8");
    CHECK_OK(ts_tensor_zeros(NULL, TS_F32, 2, (int64_t[]){2, 4}, &f));
    CHECK_STATUS(ts_module_forward(m, f, &y), TS_ERR_SHAPE);
    CHECK_ERR_MENTIONS("int64");
    ts_tensor_release(ids);
    ts_tensor_release(f);
    CHECK_STATUS(ts_gpt_get_config(NULL, &c), TS_ERR_INVALID_ARG);
    ts_module *lin = NULL;
    CHECK_OK(ts_nn_linear_new(2, 2, true, NULL, &lin));
    CHECK_STATUS(ts_gpt_get_config(lin, &c), TS_ERR_INVALID_ARG);
    ts_module_free(lin);
    ts_module_free(m);
}

/* GPT-2's initialisation: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)), biases 0, LN 1/0 */
static void test_init(void) {
    ts_gpt_config c = TS_GPT_CONFIG_INIT;
    c.n_layer = 8;
    c.n_head = 4;
    c.n_embd = 128;
    c.seq_len = 64;
    c.vocab_size = 1000;
    ts_rng r;
    ts_rng_seed(&r, 7);
    ts_module *m = NULL;
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    static const struct {
        const char *name;
        double std;
    } want[] = {{"transformer.wte.weight", 0.02}, {"transformer.wpe.weight", 0.02},
                {"transformer.h.3.attn.c_attn.weight", 0.02}, {"transformer.h.3.mlp.c_fc.weight", 0.02},
                {"transformer.h.3.attn.c_proj.weight", 0.005}, {"transformer.h.7.mlp.c_proj.weight", 0.005},
                {"transformer.h.3.attn.c_proj.bias", 0}, {"transformer.h.3.ln_1.bias", 0}};
    ts_tensor_list sd = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &sd));
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        ts_tensor *t = ts_tensor_list_find(&sd, want[k].name);
        double s = 0, mean = 0;
        const int64_t n = ts_tensor_numel(t);
        const float *p = ts_tensor_data_f32(t);
        for (int64_t i = 0; i < n; i++) mean += p[i] / (double)n;
        for (int64_t i = 0; i < n; i++) s += (p[i] - mean) * (p[i] - mean) / (double)n;
        CHECK_NEAR(sqrt(s), want[k].std, 0.05 * want[k].std + 1e-9);
        CHECK_NEAR(mean, 0.0, 0.1 * want[k].std + 1e-9);
    }
    CHECK(ts_tensor_item(ts_tensor_list_find(&sd, "transformer.ln_f.weight"), 5) == 1.0);
    const int64_t per_layer = 12 * 128 * 128 + 13 * 128;
    CHECK(ts_module_num_parameters(m) == 1000 * 128 + 64 * 128 + 8 * per_layer + 2 * 128);
    ts_tensor_list_clear(&sd);
    ts_module_free(m);
}

/* The state dict in and out: lm_head.weight accepted when tied, refused when not; GPT2Model's names (no
 * prefix) and old mask buffers accepted; our file equals transformers' key for key. */
static void test_state_dict_forms(void) {
    if (!load_golden()) return;
    ts_gpt_config c = golden_config();
    ts_module *m = golden_model(), *m2 = NULL;
    CHECK_OK(ts_model_gpt(&c, NULL, &m2));
    ts_tensor_list sd = TS_TENSOR_LIST_INIT, alt = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_module_state_dict(m, &sd));
    for (int i = 0; i < sd.n; i++) CHECK_OK(ts_tensor_list_append(&alt, sd.names[i] + 12, sd.tensors[i])); /* no "transformer." */
    ts_tensor *mask = NULL, *bad = NULL;
    CHECK_OK(ts_tensor_zeros(NULL, TS_F32, 4, (int64_t[]){1, 1, 4, 4}, &mask));
    CHECK_OK(ts_tensor_list_append(&alt, "h.0.attn.bias", mask));
    CHECK_OK(ts_tensor_list_append(&alt, "lm_head.weight", ts_tensor_list_find(&sd, "transformer.wte.weight")));
    CHECK_OK(ts_gpt_load_state_dict(m2, &alt));
    const char *path = "gpt_test_roundtrip.safetensors";
    CHECK_OK(ts_gpt_save_safetensors(m2, path));
    ts_tensor_list back = TS_TENSOR_LIST_INIT, hf = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_safetensors_load(path, 0, &back, NULL));
    CHECK_OK(ts_safetensors_load(GOLDEN_INIT, 0, &hf, NULL));
    CHECK(back.n == hf.n);
    for (int i = 0; i < hf.n; i++) {
        ts_tensor *t = ts_tensor_list_find(&back, hf.names[i]);
        CHECK(t && tg_compare(t, hf.tensors[i], 0, 0).max_abs == 0);
    }
    /* an untied head */
    CHECK_OK(ts_tensor_clone(ts_tensor_list_find(&sd, "transformer.wte.weight"), &bad));
    CHECK_OK(ts_tensor_fill_(bad, 0.5f));
    CHECK_OK(ts_tensor_list_append(&sd, "lm_head.weight", bad));
    CHECK_STATUS(ts_gpt_load_state_dict(m2, &sd), TS_ERR_UNSUPPORTED);
    CHECK_ERR_MENTIONS("untied");
    remove(path);
    ts_tensor_release(mask);
    ts_tensor_release(bad);
    ts_tensor_list_clear(&sd);
    ts_tensor_list_clear(&alt);
    ts_tensor_list_clear(&back);
    ts_tensor_list_clear(&hf);
    ts_module_free(m);
    ts_module_free(m2);
}

/* ---- the key/value cache ------------------------------------------------------------------------------------ */
static ts_module *tiny_model(uint64_t seed, int64_t seq_len) {
    ts_gpt_config c;
    CHECK_OK(ts_gpt_preset("gpt2-tiny", &c));
    c.n_head = 4;
    c.n_embd = 48;
    c.seq_len = seq_len;
    c.init_std = 0.2f; /* peaked logits: greedy choices far from ties */
    ts_rng r;
    ts_rng_seed(&r, seed);
    ts_module *m = NULL;
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    return m;
}

/* Full forward logits (T, V) of ids[0..T). */
static ts_tensor *full_logits(ts_module *m, const int64_t *ids, int64_t T) {
    ts_tensor *t = NULL, *y = NULL, *y2 = NULL;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 2, (int64_t[]){1, T}, ids, &t));
    bool g = ts_grad_set_enabled(false);
    CHECK_OK(ts_module_forward(m, t, &y));
    ts_grad_set_enabled(g);
    CHECK_OK(ts_reshape(y, 2, (int64_t[]){T, -1}, &y2));
    ts_tensor_release(t);
    ts_tensor_release(y);
    return y2;
}

static void test_cache_equals_full_forward(void) {
    ts_module *m = tiny_model(11, 100);
    const int64_t T = 100; /* more than one 64-query tile, not a multiple of it */
    int64_t ids[100];
    ts_rng r;
    ts_rng_seed(&r, 3);
    for (int i = 0; i < T; i++) ids[i] = (int64_t)ts_rng_below(&r, 512);
    ts_tensor *want = full_logits(m, ids, T);
    ts_gpt_cache *c = NULL;
    CHECK_OK(ts_gpt_cache_new(m, &c));
    double worst = 0;
    for (int pass = 0; pass < 2; pass++) { /* 0: one token at a time; 1: a prefill of 37, then one at a time */
        ts_gpt_cache_reset(c);
        int64_t t = 0;
        while (t < T) {
            const int64_t n = pass == 1 && t == 0 ? 37 : 1;
            ts_tensor *lg = NULL, *w = NULL;
            CHECK_OK(ts_gpt_cache_forward(c, ids + t, n, &lg));
            CHECK_OK(ts_slice(want, 0, t, t + n, &w));
            double e, ref;
            diff(lg, w, &e, &ref);
            worst = fmax(worst, e);
            ts_tensor_release(lg);
            ts_tensor_release(w);
            t += n;
        }
        CHECK(ts_gpt_cache_len(c) == T);
    }
    printf("  cached logits vs the full forward, 100 positions: max |diff| %.3g\n", worst);
    CHECK(worst <= 1e-5);
    /* several tokens after a prefill: run one at a time, the same numbers */
    ts_gpt_cache_reset(c);
    ts_tensor *a = NULL, *b = NULL, *w = NULL;
    CHECK_OK(ts_gpt_cache_forward(c, ids, 10, &a));
    CHECK_OK(ts_gpt_cache_forward(c, ids + 10, 15, &b));
    CHECK_OK(ts_slice(want, 0, 10, 25, &w));
    double e, ref;
    diff(b, w, &e, &ref);
    CHECK(e <= 1e-5);
    CHECK_STATUS(ts_gpt_cache_forward(c, ids, 76, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("seq_len 100");
    int64_t badtok = 512;
    CHECK_STATUS(ts_gpt_cache_forward(c, &badtok, 1, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("token 512");
    ts_tensor_release(a);
    ts_tensor_release(b);
    ts_tensor_release(w);
    ts_tensor_release(want);
    ts_gpt_cache_free(c);
    ts_module_free(m);
}

/* index of the first largest of row t of l (T, V) */
static int64_t row_argmax(ts_tensor *l, int64_t t, int64_t *rank_of, int64_t tok) {
    const int64_t V = ts_tensor_dim(l, 1);
    const float *p = ts_tensor_data_f32(l) + t * V;
    int64_t best = 0, rank = 0;
    for (int64_t i = 1; i < V; i++)
        if (p[i] > p[best]) best = i;
    for (int64_t i = 0; rank_of && i < V; i++) rank += p[i] > p[tok];
    if (rank_of) *rank_of = rank;
    return best;
}

struct collect {
    int64_t n, last;
};
static bool on_token(int64_t i, int64_t token, void *user) {
    struct collect *c = user;
    c->n = i + 1;
    c->last = token;
    return i < 4; /* stop after the fifth */
}

static void test_sampling(void) {
    ts_module *m = tiny_model(5, 64);
    const int64_t prompt[3] = {1, 2, 3};
    int64_t a[40], b[40], d[40], n = 0;
    ts_gpt_sample_config sc = TS_GPT_SAMPLE_CONFIG_INIT;
    sc.max_new_tokens = 40;
    sc.seed = 42;
    CHECK_OK(ts_gpt_generate(m, prompt, 3, &sc, a, &n));
    CHECK(n == 40);
    CHECK_OK(ts_gpt_generate(m, prompt, 3, &sc, b, &n));
    CHECK(!memcmp(a, b, sizeof a)); /* the same seed, the same tokens */
    sc.seed = 43;
    CHECK_OK(ts_gpt_generate(m, prompt, 3, &sc, d, &n));
    CHECK(memcmp(a, d, sizeof a) != 0);
    /* top-k 3: every token is among the 3 largest logits of the full forward at its position */
    sc.top_k = 3;
    sc.temperature = 2.0f;
    CHECK_OK(ts_gpt_generate(m, prompt, 3, &sc, a, &n));
    int64_t seq[43];
    memcpy(seq, prompt, sizeof prompt);
    memcpy(seq + 3, a, sizeof(int64_t) * 40);
    ts_tensor *l = full_logits(m, seq, 43);
    int in_top = 0, distinct_ranks = 0;
    for (int i = 0; i < 40; i++) {
        int64_t rank = 0;
        row_argmax(l, 2 + i, &rank, a[i]);
        in_top += rank < 3;
        distinct_ranks += rank > 0;
    }
    CHECK(in_top == 40);
    CHECK(distinct_ranks > 0); /* temperature 2 over 3 tokens: not always the first */
    ts_tensor_release(l);
    /* a tiny temperature is greedy, not NaN */
    int64_t g[40];
    sc.top_k = 0;
    sc.temperature = 0;
    CHECK_OK(ts_gpt_generate(m, prompt, 3, &sc, g, &n));
    sc.temperature = 1e-20f;
    CHECK_OK(ts_gpt_generate(m, prompt, 3, &sc, a, &n));
    CHECK(!memcmp(a, g, sizeof a));
    /* the callback sees each token and can stop */
    struct collect col = {0, -1};
    sc.on_token = on_token;
    sc.user = &col;
    CHECK_OK(ts_gpt_generate(m, prompt, 3, &sc, a, &n));
    CHECK(n == 5 && col.n == 5 && col.last == a[4]);
    sc.on_token = NULL;
    CHECK_STATUS(ts_gpt_generate(m, prompt, 0, &sc, a, &n), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("empty prompt");
    sc.temperature = -1;
    CHECK_STATUS(ts_gpt_generate(m, prompt, 3, &sc, a, &n), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("temperature");
    ts_module_free(m);
}

/* Past seq_len: nanoGPT's crop (the model sees the last seq_len tokens), greedy against full forwards. */
static void test_generate_past_context(void) {
    ts_module *m = tiny_model(9, 16);
    int64_t seq[60] = {0};
    ts_rng r;
    ts_rng_seed(&r, 1);
    for (int i = 0; i < 20; i++) seq[i] = (int64_t)ts_rng_below(&r, 512); /* a prompt longer than seq_len */
    int64_t out[30], n = 0;
    ts_gpt_sample_config sc = TS_GPT_SAMPLE_CONFIG_INIT;
    sc.max_new_tokens = 30;
    sc.temperature = 0;
    CHECK_OK(ts_gpt_generate(m, seq, 20, &sc, out, &n));
    CHECK(n == 30);
    int same = 0;
    for (int i = 0; i < 30; i++) {
        const int64_t L = 20 + i, start = L - 16;
        ts_tensor *l = full_logits(m, seq + start, 16);
        seq[L] = row_argmax(l, 15, NULL, 0);
        same += seq[L] == out[i];
        ts_tensor_release(l);
    }
    CHECK(same == 30);
    ts_module_free(m);
}

/* ---- weight-decay groups ------------------------------------------------------------------------------------- */
static void test_decay_groups(void) {
    for (int kind = 0; kind < 2; kind++) { /* 0 AdamW, 1 SGD */
        ts_tensor *w = NULL, *b = NULL;
        CHECK_OK(ts_tensor_full(NULL, 2, (int64_t[]){2, 3}, 1.0f, &w));
        CHECK_OK(ts_tensor_full(NULL, 1, (int64_t[]){3}, 1.0f, &b));
        ts_tensor_set_requires_grad(w, true);
        ts_tensor_set_requires_grad(b, true);
        ts_tensor_list ps = TS_TENSOR_LIST_INIT;
        CHECK_OK(ts_tensor_list_append(&ps, "w", w));
        CHECK_OK(ts_tensor_list_append(&ps, "b", b));
        ts_optimizer *o = NULL;
        if (kind == 0) {
            ts_adamw_config c = TS_ADAMW_CONFIG_INIT;
            c.lr = 0.1f;
            c.weight_decay = 0.5f;
            CHECK_OK(ts_optim_adamw_new(&ps, &c, &o));
        } else {
            ts_sgd_config c = TS_SGD_CONFIG_INIT;
            c.lr = 0.1f;
            c.weight_decay = 0.5f;
            CHECK_OK(ts_optim_sgd_new(&ps, &c, &o));
        }
        CHECK(ts_optimizer_decays(o, "w") && ts_optimizer_decays(o, "b")); /* the default: all */
        CHECK_OK(ts_optimizer_set_decay_rule(o, TS_DECAY_MATRICES));
        CHECK(ts_optimizer_decays(o, "w") && !ts_optimizer_decays(o, "b"));
        for (int s = 0; s < 3; s++) { /* zero gradients: only the decay moves a parameter */
            ts_tensor *gw = NULL, *gb = NULL;
            CHECK_OK(ts_tensor_zeros(NULL, TS_F32, 2, (int64_t[]){2, 3}, &gw));
            CHECK_OK(ts_tensor_zeros(NULL, TS_F32, 1, (int64_t[]){3}, &gb));
            ts_tensor_set_grad(w, gw);
            ts_tensor_set_grad(b, gb);
            ts_tensor_release(gw);
            ts_tensor_release(gb);
            CHECK_OK(ts_optimizer_step(o));
        }
        CHECK(ts_tensor_item(b, 0) == 1.0 && ts_tensor_item(b, 2) == 1.0);
        CHECK_NEAR(ts_tensor_item(w, 0), pow(1.0 - 0.1 * 0.5, 3), 1e-6); /* AdamW: (1 - lr wd)^3; SGD: the same */
        CHECK_OK(ts_optimizer_set_decay(o, "b", true));
        CHECK(ts_optimizer_decays(o, "b"));
        CHECK_STATUS(ts_optimizer_set_decay(o, "nope", false), TS_ERR_INVALID_ARG);
        CHECK_ERR_MENTIONS("'nope'");
        ts_optimizer_free(o);
        ts_tensor_list_clear(&ps);
        ts_tensor_release(w);
        ts_tensor_release(b);
    }
}

TU_MAIN(T(test_golden_full), T(test_golden_short), T(test_golden_adamw), T(test_golden_greedy), T(test_device),
        T(test_names_match_transformers_file), T(test_presets_and_errors), T(test_init), T(test_state_dict_forms),
        T(test_cache_equals_full_forward), T(test_sampling), T(test_generate_past_context), T(test_decay_groups))
