/*
 * python/src/dist.c — (being written)
 */
#include "tspy.h"

int tspy_add_dist(PyObject *m) {
    (void)m;
    return 0;
}
