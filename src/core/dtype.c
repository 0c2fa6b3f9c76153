/*
 * core/dtype.c — dtype sizes and names, and float32 <-> bfloat16 / float16
 * conversion of host buffers (the element rules: core/half.h).
 */
#include "core/internal.h"
#include "core/half.h"

#include <strings.h>

size_t ts_dtype_size(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return 4;
    case TS_F16: return 2;
    case TS_BF16: return 2;
    case TS_I64: return 8;
    case TS_I32: return 4;
    case TS_U8: return 1;
    default: return 0;
    }
}

const char *ts_dtype_name(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return "float32";
    case TS_F16: return "float16";
    case TS_BF16: return "bfloat16";
    case TS_I64: return "int64";
    case TS_I32: return "int32";
    case TS_U8: return "uint8";
    default: return "unknown";
    }
}

ts_status ts_dtype_parse(const char *name, ts_dtype *out) {
    static const struct {
        const char *name;
        ts_dtype dt;
    } names[] = {{"float32", TS_F32}, {"f32", TS_F32},  {"fp32", TS_F32},      {"float16", TS_F16},
                 {"f16", TS_F16},     {"fp16", TS_F16}, {"half", TS_F16},      {"bfloat16", TS_BF16},
                 {"bf16", TS_BF16},   {"int64", TS_I64}, {"int32", TS_I32},    {"uint8", TS_U8}};
    TS_ARG(out, "ts_dtype_parse: NULL argument");
    for (size_t i = 0; name && i < TS_ARRAY_LEN(names); i++)
        if (strcasecmp(name, names[i].name) == 0) {
            *out = names[i].dt;
            return TS_OK;
        }
    return ts_error(TS_ERR_INVALID_ARG, "unknown dtype '%s' (expected float32, float16, bfloat16, int64, int32 or uint8)",
                    name ? name : "(null)");
}

bool ts_dtype_is_float(ts_dtype dt) { return dt == TS_F32 || dt == TS_F16 || dt == TS_BF16; }

uint16_t ts_f32_to_bf16(float f) { return ts__bf16_from_f32(f); }
float ts_bf16_to_f32(uint16_t h) { return ts__bf16_to_f32(h); }
uint16_t ts_f32_to_f16(float f) { return ts__f16_from_f32(f); }
float ts_f16_to_f32(uint16_t h) { return ts__f16_to_f32(h); }

/* The bfloat16 conversions, cloned per ISA (TS_CLONES): the integer rounding vectorises with AVX-512; the CPU
 * kernels of bfloat16 activations convert their planes and rows through ts_convert */
TS_CLONES static void f32_to_bf16_n(uint16_t *d, const float *s, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = ts__bf16_from_f32(s[i]);
}
TS_CLONES static void bf16_to_f32_n(float *d, const uint16_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = ts__bf16_to_f32(s[i]);
}

ts_status ts_convert(void *dst, ts_dtype to, const void *src, ts_dtype from, size_t n) {
    TS_ARG((dst && src) || n == 0, "ts_convert: NULL buffer");
    if (!ts_dtype_is_float(to) || !ts_dtype_is_float(from))
        return ts_error(TS_ERR_DTYPE, "ts_convert: %s to %s (want float32, float16 or bfloat16)", ts_dtype_name(from),
                        ts_dtype_name(to));
    if (to == from) {
        if (n) memcpy(dst, src, n * ts_dtype_size(to));
        return TS_OK;
    }
    float *fd = dst;
    uint16_t *hd = dst;
    const float *fs = src;
    const uint16_t *hs = src;
    if (from == TS_F32 && to == TS_BF16)
        f32_to_bf16_n(hd, fs, n);
    else if (from == TS_F32)
        for (size_t i = 0; i < n; i++) hd[i] = ts__f16_from_f32(fs[i]);
    else if (from == TS_BF16 && to == TS_F32)
        bf16_to_f32_n(fd, hs, n);
    else if (from == TS_F16 && to == TS_F32)
        for (size_t i = 0; i < n; i++) fd[i] = ts__f16_to_f32(hs[i]);
    else if (from == TS_BF16) /* to f16, through float32 (exact) */
        for (size_t i = 0; i < n; i++) hd[i] = ts__f16_from_f32(ts__bf16_to_f32(hs[i]));
    else
        for (size_t i = 0; i < n; i++) hd[i] = ts__bf16_from_f32(ts__f16_to_f32(hs[i]));
    return TS_OK;
}
