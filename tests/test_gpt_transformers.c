/*
 * tests/test_gpt_transformers.c — a GPT Tessera initialised and saved (ts_gpt_save_safetensors) loads into
 * transformers with GPT2LMHeadModel.from_pretrained and gives Tessera's logits (tests/gpt_transformers_check.py).
 * Needs a Python with torch, safetensors and transformers ($TS_PYTHON, tests/find_python.sh's list, or the
 * source tree's .pyvenv-torch/): skipped (77) without one.
 */
#include "test_util.h"

/* A Python that imports torch, safetensors and transformers, or NULL. */
static const char *find_python(char *buf, size_t n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "bash '%s/find_python.sh' torch safetensors transformers 2>/dev/null || "
             "('%s/../.pyvenv-torch/bin/python3' -c 'import torch, safetensors, transformers' >/dev/null 2>&1 && "
             "echo '%s/../.pyvenv-torch/bin/python3')",
             TS_TEST_DIR, TS_TEST_DIR, TS_TEST_DIR);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    const bool got = fgets(buf, (int)n, p) != NULL;
    pclose(p);
    if (!got) return NULL;
    buf[strcspn(buf, "\n")] = 0;
    return buf[0] ? buf : NULL;
}

static void test_transformers_loads_ours(void) {
    char py[512], path[512], cmd[2048];
    if (!find_python(py, sizeof py)) {
        printf("SKIP: no Python with torch, safetensors and transformers\n");
        exit(77);
    }
    ts_gpt_config c;
    CHECK_OK(ts_gpt_preset("gpt2-tiny", &c));
    c.n_layer = 3;
    c.n_head = 4;
    c.n_embd = 32;
    c.seq_len = 70;
    c.vocab_size = 300;
    c.init_std = 0.1f;
    ts_rng r;
    ts_rng_seed(&r, 21);
    ts_module *m = NULL;
    CHECK_OK(ts_model_gpt(&c, &r, &m));
    ts_module_train(m, false);
    const char *dir = tu_tmpdir();
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(ts_gpt_save_safetensors(m, path));
    int64_t ids[2 * 67];
    for (int i = 0; i < 2 * 67; i++) ids[i] = (int64_t)ts_rng_below(&r, 300);
    ts_tensor *x = NULL, *y = NULL;
    CHECK_OK(ts_tensor_from_data(NULL, TS_I64, 2, (int64_t[]){2, 67}, ids, &x));
    CHECK_OK(ts_module_forward(m, x, &y));
    ts_tensor_list io = TS_TENSOR_LIST_INIT;
    CHECK_OK(ts_tensor_list_append(&io, "ids", x));
    CHECK_OK(ts_tensor_list_append(&io, "logits", y));
    snprintf(path, sizeof path, "%s/io.safetensors", dir);
    CHECK_OK(ts_safetensors_save(path, &io, NULL));
    snprintf(path, sizeof path, "%s/sizes.txt", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fprintf(f, "%lld %lld %lld %lld %lld\n", (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd,
                (long long)c.seq_len, (long long)c.vocab_size);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "'%s' '%s/gpt_transformers_check.py' '%s'", py, TS_TEST_DIR, dir);
    CHECK(system(cmd) == 0);
    ts_tensor_list_clear(&io);
    ts_tensor_release(x);
    ts_tensor_release(y);
    ts_module_free(m);
    tu_rm_tmpdir();
}

TU_MAIN(T(test_transformers_loads_ours))
