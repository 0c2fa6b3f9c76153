/*
 * tests/fuzz/fuzz_ckpt.c — libFuzzer target: the checkpoint parser (src/io/ckpt.c)
 * on arbitrary bytes, through ts__ckpt_load_mem (the same code ts_ckpt_load runs
 * on a file). A checkpoint that loads is walked whole: every name escaped, every
 * value and every tensor byte read, the typed getters called.
 * Seeds: tests/fuzz/corpus/ckpt (small checkpoints written by tests/fuzz/make_seeds.c).
 */
#include "core/internal.h"
#include "io/ckpt_internal.h"

#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    ts_log_set_level(TS_LOG_OFF);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ts_ckpt *ck = NULL;
    if (ts__ckpt_load_mem(data, size, "fuzz.ckpt", &ck) != TS_OK) return 0;
    volatile unsigned sink = 0;
    char buf[256];
    for (int k = TS_CKPT_TENSOR; k <= TS_CKPT_BYTES; k++)
        for (int i = 0; i < ts_ckpt_count(ck, (ts_ckpt_kind)k); i++) {
            const char *name = ts_ckpt_name(ck, (ts_ckpt_kind)k, i);
            sink += (unsigned)strlen(ts__printable(name, buf, sizeof buf));
            if (!ts_ckpt_has(ck, (ts_ckpt_kind)k, name)) __builtin_trap();
            if (k == TS_CKPT_I64) {
                int64_t v;
                if (ts_ckpt_get_i64(ck, name, &v) != TS_OK) __builtin_trap();
                sink += (unsigned)v;
            } else if (k == TS_CKPT_F64) {
                double v;
                if (ts_ckpt_get_f64(ck, name, &v) != TS_OK) __builtin_trap();
                sink += v == v;
            } else if (k == TS_CKPT_BYTES) {
                const void *p;
                size_t n;
                if (ts_ckpt_get_bytes(ck, name, &p, &n) != TS_OK) __builtin_trap();
                for (size_t j = 0; j < n; j++) sink += ((const uint8_t *)p)[j];
            } else {
                ts_tensor *t = ts_ckpt_find_tensor(ck, name);
                if (!t) __builtin_trap();
                const uint8_t *p = ts_tensor_data(t);
                for (size_t j = 0; j < ts_tensor_nbytes(t); j++) sink += p[j];
            }
        }
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    if (ts_ckpt_get_tensors(ck, "model.", &l) == TS_OK) sink += (unsigned)l.n;
    ts_tensor_list_clear(&l);
    ts_ckpt_free(ck);
    (void)sink;
    return 0;
}
