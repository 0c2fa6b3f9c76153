/*
 * python/src/train.c — (being written)
 */
#include "tspy.h"

int tspy_add_train(PyObject *m) {
    (void)m;
    return 0;
}
