/*
 * tests/fuzz/fuzz_safetensors.c — libFuzzer target: the safetensors parser (src/io/safetensors.c)
 * on arbitrary bytes, through ts__safetensors_load_mem (the same code ts_safetensors_load runs on a
 * file), with and without TS_SAFETENSORS_F32 (the input's last byte chooses). A file that loads is
 * walked whole: every name escaped and found again, every tensor byte read, the metadata looked up.
 * Seeds: tests/fuzz/corpus/safetensors (written by tests/fuzz/make_seeds.c).
 */
#include "core/internal.h"
#include "io/safetensors_internal.h"

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
    unsigned flags = size && (data[size - 1] & 1) ? TS_SAFETENSORS_F32 : 0;
    ts_tensor_list l = TS_TENSOR_LIST_INIT;
    ts_safetensors_meta m = TS_SAFETENSORS_META_INIT;
    if (ts__safetensors_load_mem(data, size, "fuzz.safetensors", flags, &l, &m) != TS_OK) {
        if (l.n || m.n) __builtin_trap(); /* nothing appended on error */
        return 0;
    }
    volatile unsigned sink = 0;
    char buf[256];
    for (int i = 0; i < l.n; i++) {
        sink += (unsigned)strlen(ts__printable(l.names[i], buf, sizeof buf));
        if (!l.names[i][0] || ts_tensor_list_find(&l, l.names[i]) != l.tensors[i]) __builtin_trap(); /* unique */
        ts_tensor *t = l.tensors[i];
        ts_dtype dt = ts_tensor_dtype(t);
        if ((flags & TS_SAFETENSORS_F32) && (dt == TS_F16 || dt == TS_BF16)) __builtin_trap();
        const uint8_t *p = ts_tensor_data(t);
        for (size_t j = 0; j < ts_tensor_nbytes(t); j++) sink += p[j];
    }
    for (int i = 0; i < m.n; i++)
        if (ts_safetensors_meta_get(&m, m.keys[i]) != m.values[i]) __builtin_trap(); /* unique keys */
    ts_tensor_list_clear(&l);
    ts_safetensors_meta_clear(&m);
    (void)sink;
    return 0;
}
