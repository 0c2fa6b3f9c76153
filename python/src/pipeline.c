/*
 * python/src/pipeline.c — (being written)
 */
#include "tspy.h"

int tspy_add_pipeline(PyObject *m) {
    (void)m;
    return 0;
}
