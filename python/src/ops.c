/*
 * python/src/ops.c — (being written)
 */
#include "tspy.h"

int tspy_add_ops(PyObject *m) {
    (void)m;
    return 0;
}
