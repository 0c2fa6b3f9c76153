/*
 * bench/gpt_weights.c — the random GPT-2 weights bench_gpt trains (ts_model_gpt, seed 1, context T) written as a
 * safetensors file (Hugging Face's names), and the model's forward loss on the first batches of a token shard read
 * in order, for bench/gpt_vs_llmc.sh (scripts/llmc_checkpoint.py turns the file into llm.c's checkpoint).
 *
 * usage: bench_gpt_weights N_LAYER N_HEAD N_EMBD T VOCAB OUT.safetensors [SHARD B NBATCH]
 * With SHARD: batch i (i < NBATCH) is tokens [i B T, (i + 1) B T) with the next token as each one's target, as
 * llm.c's unshuffled DataLoader reads them (its validation loader); prints "loss=..." (the mean of the batches'
 * mean cross-entropies, summed in float as llm.c's main does) and each batch's loss.
 */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>

static void check(ts_status s) {
    if (s != TS_OK) {
        fprintf(stderr, "bench_gpt_weights: %s\n", ts_last_error());
        exit(1);
    }
}

/* The mean cross-entropy of the next-token prediction on tokens[0 .. B T] (B rows of T, targets shifted by one). */
static float batch_loss(ts_module *m, const uint16_t *tok, int64_t B, int64_t T, int64_t vocab) {
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(B * T) * 2);
    for (int64_t i = 0; i < B * T; i++) {
        ids[i] = tok[i];
        ids[B * T + i] = tok[i + 1];
    }
    ts_tensor *x = NULL, *t = NULL, *y = NULL, *y2 = NULL, *loss = NULL;
    check(ts_tensor_from_data(NULL, TS_I64, 2, (int64_t[]){B, T}, ids, &x));
    check(ts_tensor_from_data(NULL, TS_I64, 1, (int64_t[]){B * T}, ids + B * T, &t));
    check(ts_module_forward(m, x, &y));
    check(ts_reshape(y, 2, (int64_t[]){B * T, vocab}, &y2));
    check(ts_cross_entropy(y2, t, 0.0f, &loss));
    const float l = (float)ts_tensor_item(loss, 0);
    ts_tensor_release(loss);
    ts_tensor_release(y2);
    ts_tensor_release(y);
    ts_tensor_release(t);
    ts_tensor_release(x);
    free(ids);
    return l;
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 10) {
        fprintf(stderr, "usage: bench_gpt_weights N_LAYER N_HEAD N_EMBD T VOCAB OUT.safetensors [SHARD B NBATCH]\n");
        return 2;
    }
    ts_gpt_config c = TS_GPT_CONFIG_INIT;
    c.n_layer = atoll(argv[1]);
    c.n_head = atoll(argv[2]);
    c.n_embd = atoll(argv[3]);
    c.seq_len = atoll(argv[4]);
    c.vocab_size = atoll(argv[5]);
    ts_rng r;
    ts_rng_seed(&r, 1); /* bench_gpt's seed: the same weights it trains */
    ts_module *m = NULL;
    check(ts_model_gpt(&c, &r, &m));
    check(ts_gpt_save_safetensors(m, argv[6]));
    if (argc == 10) {
        const int64_t B = atoll(argv[8]), T = c.seq_len, nb = atoll(argv[9]);
        ts_token_shard *s = NULL;
        check(ts_token_shard_open(argv[7], c.vocab_size, &s));
        int64_t n = 0;
        const uint16_t *tok = ts_token_shard_tokens(s, &n);
        if (B < 1 || nb < 1 || nb * B * T + 1 > n) {
            fprintf(stderr, "bench_gpt_weights: %s holds %lld tokens, fewer than %lld batches of %lld x %lld + 1\n",
                    argv[7], (long long)n, (long long)nb, (long long)B, (long long)T);
            return 1;
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < nb; i++) {
            const float l = batch_loss(m, tok + i * B * T, B, T, c.vocab_size);
            printf("batch %lld: loss %.6f\n", (long long)i, (double)l);
            sum += l;
        }
        printf("loss=%.6f\n", (double)(sum / (float)nb));
        ts_token_shard_free(s);
    }
    ts_module_free(m);
    return 0;
}
