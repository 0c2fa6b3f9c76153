/*
 * tests/fuzz/fuzz_idx.c — libFuzzer target: the IDX reader (src/data/idx.c),
 * plain and gzip, on arbitrary bytes. The first byte picks expect_ndim (0..4),
 * the rest is the file, written to a memfd (a regular file) and read through
 * ts__idx_read_fd — the code ts_idx_read runs after opening the path, with the
 * file-size and gzip-ratio checks that come before any allocation.
 * Seeds: tests/fuzz/corpus/idx (tiny IDX files, plain and gzip).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "data/idx_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static int memfd = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    ts_log_set_level(TS_LOG_OFF);
    memfd = memfd_create("fuzz_idx", MFD_CLOEXEC);
    if (memfd < 0) {
        perror("memfd_create");
        return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || memfd < 0) return 0;
    int nd = data[0] % 5;
    data++, size--;
    if (ftruncate(memfd, 0) != 0 || (size && pwrite(memfd, data, size, 0) != (ssize_t)size)) __builtin_trap();
    int fd = dup(memfd); /* the reader closes its descriptor */
    if (fd < 0 || lseek(fd, 0, SEEK_SET) != 0) __builtin_trap();
    ts_tensor *t = NULL;
    if (ts__idx_read_fd(fd, size, "fuzz.idx", nd, &t) == TS_OK) {
        volatile unsigned sink = 0;
        const uint8_t *p = ts_tensor_data(t);
        for (size_t i = 0; i < ts_tensor_nbytes(t); i++) sink += p[i];
        if (nd && ts_tensor_ndim(t) != nd) __builtin_trap();
        (void)sink;
        ts_tensor_release(t);
    }
    return 0;
}
