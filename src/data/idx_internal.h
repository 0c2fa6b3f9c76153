/*
 * data/idx_internal.h — the IDX reader over an open descriptor (internal: the
 * fuzz target tests/fuzz/fuzz_idx.c reaches the parser through it).
 */
#ifndef TS_DATA_IDX_INTERNAL_H
#define TS_DATA_IDX_INTERNAL_H

#include "core/internal.h"

/* ts_idx_read over fd (a regular file of `size` bytes, positioned at its start;
 * the call always closes it); path names it in messages. */
ts_status ts__idx_read_fd(int fd, uint64_t size, const char *path, int expect_ndim, ts_tensor **out);

/* Class names (data/classes.c). */
#define TS__CLASS_NAME_MAX 255  /* bytes in one class name */
#define TS__IDX_MAX_CLASSES 255 /* IDX labels are bytes; 255 is no class */

/* The class names of the IDX split in dir whose images (n, h, w) and labels (n) u8 tensors are given,
 * and whose largest label is max_label: dir/classes.txt when it exists (an error when it is malformed
 * or names fewer than max_label + 1 classes), else the names of a data set recognised by its content
 * (Fashion-MNIST), else none (*names NULL, *n 0). *names (n strings) is freed with
 * ts__class_names_free. */
ts_status ts__idx_class_names(const char *dir, const ts_tensor *images, const ts_tensor *labels, int64_t max_label,
                              char ***names, int64_t *n);
void ts__class_names_free(char **names, int64_t n);

#endif /* TS_DATA_IDX_INTERNAL_H */
