/*
 * bench/gpt_memory.c — the memory of one GPT-2 (ts_model_gpt) training forward + backward (logits,
 * cross-entropy, backward), float32 on the CPU, for bench/gpt_memory.py (which runs it once per size in a
 * fresh process, beside a nanoGPT-style PyTorch model measured the same way).
 *
 * usage: bench_gpt_memory [N_LAYER N_HEAD N_EMBD B T VOCAB SEQ_LEN]   (defaults 6 6 384 2 1024 50257 2048)
 * SEQ_LEN is the model's context (the wpe rows): keep it fixed across T so the model is the same.
 *
 * One warm-up step (forward, cross-entropy, backward; the gradients then freed, as zero_grad does), then the
 * measured step. Prints one line "key=value ...", sizes in MiB (2^20 bytes):
 *   base_rss     VmRSS before the model is built (the program and its libraries)
 *   model_rss    VmRSS right after the model is built (its parameters initialised, so resident)
 *   pre_rss      VmRSS just before the measured step (the gradients freed; what the C library and the BLAS
 *                kept resident from the warm-up is in it)
 *   params       the parameters' bytes (count x 4); grads: the same again, so param_share = 2 x params
 *   peak_rss     VmHWM of the measured step: /proc/self/clear_refs ("5") resets the high-water mark to the
 *                resident size just before it, and VmHWM is read after it (absolute, the whole process)
 *   maxrss       getrusage's ru_maxrss: the whole run's peak, warm-up included (no reset)
 *   step         peak_rss - model_rss: what the step added at its peak (gradients, activations, temporaries,
 *                and memory the C library kept from the warm-up)
 *   act          step - grads: the activations' share (everything beyond the parameters and their gradients)
 *   alloc_step   Tessera's allocator's peak in the measured step minus what it held before it (the
 *                parameters): tensor bytes alone, exact; alloc_act = alloc_step - grads
 *   alloc_fwd    the allocator's bytes held after the forward and the loss beyond those before: the logits
 *                and every tensor the graph saved for backward
 *   logits       the (B T, vocab) float32 logits' bytes
 * The weights are GPT-2's random initialisation, the tokens random; the threads are Tessera's default.
 */
#include "tessera.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#define MIB 1048576.0

static void check(ts_status s) {
    if (s != TS_OK) {
        fprintf(stderr, "bench_gpt_memory: %s\n", ts_last_error());
        exit(1);
    }
}

/* VmRSS or VmHWM from /proc/self/status, in bytes (-1 if unreadable). */
static double proc_bytes(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = -1;
    const size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) v = atof(line + n + 1) * 1024.0;
    if (f) fclose(f);
    return v;
}

/* Resets VmHWM to the current VmRSS; false when the kernel does not let us. */
static bool reset_hwm(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    const bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* One forward + cross-entropy + backward; the logits and the loss released, the gradients kept. *fwd: the
 * allocator's bytes held after the forward and the loss beyond those held before (the logits and what the
 * graph saved for backward). */
static void step(ts_module *m, const ts_tensor *x, const ts_tensor *t, int64_t rows, int64_t vocab, double *fwd) {
    ts_device *dev = ts_device_cpu();
    const double a0 = (double)ts_device_memory_allocated(dev);
    ts_tensor *y = NULL, *y2 = NULL, *loss = NULL;
    check(ts_module_forward(m, x, &y));
    check(ts_reshape(y, 2, (int64_t[]){rows, vocab}, &y2));
    check(ts_cross_entropy(y2, t, 0.0f, &loss));
    *fwd = (double)ts_device_memory_allocated(dev) - a0;
    check(ts_backward(loss, NULL, false));
    ts_tensor_release(y);
    ts_tensor_release(y2);
    ts_tensor_release(loss);
}

int main(int argc, char **argv) {
    long long v[7] = {6, 6, 384, 2, 1024, 50257, 2048};
    for (int i = 1; i < argc && i <= 7; i++) v[i - 1] = atoll(argv[i]);
    const int64_t B = v[3], T = v[4];
    ts_gpt_config c = TS_GPT_CONFIG_INIT;
    c.n_layer = v[0];
    c.n_head = v[1];
    c.n_embd = v[2];
    c.vocab_size = v[5];
    c.seq_len = v[6] > T ? v[6] : T;
    ts_device *dev = ts_device_cpu();
    ts_rng r;
    ts_rng_seed(&r, 1);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(B * T) * 2);
    for (int64_t i = 0; i < 2 * B * T; i++) ids[i] = (int64_t)ts_rng_below(&r, (uint64_t)c.vocab_size);
    ts_tensor *x = NULL, *t = NULL;
    check(ts_tensor_from_data(NULL, TS_I64, 2, (int64_t[]){B, T}, ids, &x));
    check(ts_tensor_from_data(NULL, TS_I64, 1, (int64_t[]){B * T}, ids + B * T, &t));
    free(ids);

    const double base_rss = proc_bytes("VmRSS:");
    ts_module *m = NULL;
    check(ts_model_gpt(&c, &r, &m));
    const double model_rss = proc_bytes("VmRSS:");
    const double params = (double)ts_module_num_parameters(m) * 4.0;
    ts_tensor_list ps = TS_TENSOR_LIST_INIT;
    check(ts_module_parameters(m, &ps));

    double fwd = 0;
    step(m, x, t, B * T, c.vocab_size, &fwd); /* the warm-up: first-touch buffers, the BLAS's workspaces */
    for (int i = 0; i < ps.n; i++) ts_tensor_zero_grad(ps.tensors[i]);

    const double alloc0 = (double)ts_device_memory_allocated(dev);
    ts_device_memory_reset_peak(dev);
    const double pre_rss = proc_bytes("VmRSS:");
    const bool reset = reset_hwm();
    step(m, x, t, B * T, c.vocab_size, &fwd);
    const double peak_rss = proc_bytes("VmHWM:"), alloc_step = (double)ts_device_memory_peak(dev) - alloc0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double maxrss = (double)ru.ru_maxrss * 1024.0;
    /* without the reset (hwm_reset=0) VmHWM is the whole run's, as maxrss */
    printf("B=%lld T=%lld n_layer=%lld n_head=%lld n_embd=%lld vocab=%lld seq_len=%lld params_n=%lld threads=%d "
           "hwm_reset=%d ",
           (long long)B, (long long)T, v[0], v[1], v[2], v[5], (long long)c.seq_len,
           (long long)ts_module_num_parameters(m), ts_get_num_threads(), reset);
    printf("base_rss=%.1f model_rss=%.1f pre_rss=%.1f params=%.1f grads=%.1f param_share=%.1f peak_rss=%.1f "
           "maxrss=%.1f step=%.1f act=%.1f ",
           base_rss / MIB, model_rss / MIB, pre_rss / MIB, params / MIB, params / MIB, 2 * params / MIB,
           peak_rss / MIB, maxrss / MIB, (peak_rss - model_rss) / MIB, (peak_rss - model_rss - params) / MIB);
    printf("alloc_step=%.1f alloc_act=%.1f alloc_fwd=%.1f logits=%.1f\n", alloc_step / MIB,
           (alloc_step - params) / MIB, fwd / MIB, (double)(B * T) * (double)c.vocab_size * 4.0 / MIB);
    ts_tensor_list_clear(&ps);
    ts_tensor_release(x);
    ts_tensor_release(t);
    ts_module_free(m);
    return 0;
}
