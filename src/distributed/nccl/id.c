/*
 * distributed/nccl/id.c — the NCCL communicator's unique id through the rendezvous store (nccl.h).
 * No NCCL here: the exchange is plain store traffic, built and tested with or without NCCL.
 */
#include "distributed/nccl/nccl.h"
#include "distributed/store.h"

#include "core/internal.h"

#include <stdio.h>
#include <string.h>

ts_status ts__nccl_exchange_id(ts_store *store, int rank, double timeout_s, ts__nccl_id_maker make, void *user,
                               unsigned char id[TS_NCCL_ID_BYTES]) {
    TS_ARG(store && make && id, "nccl: exchanging the unique id: store, maker or id is NULL");
    if (rank == 0) {
        unsigned char val[1 + TS_NCCL_ID_BYTES];
        ts_status st = make(user, id);
        if (st != TS_OK) { /* tell the others at once, then fail */
            char msg[600];
            snprintf(msg, sizeof msg, "E%s", ts_last_error());
            char saved[512];
            snprintf(saved, sizeof saved, "%s", ts_last_error());
            (void)ts_store_set(store, TS_NCCL_ID_KEY, msg, strlen(msg));
            return ts_error(st, "%s", saved);
        }
        val[0] = 'I';
        memcpy(val + 1, id, TS_NCCL_ID_BYTES);
        st = ts_store_set(store, TS_NCCL_ID_KEY, val, sizeof val);
        return st == TS_OK ? TS_OK : ts__error_prefix(st, "nccl: publishing the unique id in the store");
    }
    void *v = NULL;
    size_t len = 0;
    ts_status st = ts__store_get_timeout(store, TS_NCCL_ID_KEY, timeout_s, &v, &len);
    if (st != TS_OK) {
        free(v);
        return ts__error_prefix(st, "nccl: rank %d waiting for rank 0's unique id", rank);
    }
    const unsigned char *b = v;
    if (len >= 1 && b[0] == 'E') {
        st = ts_error(TS_ERR_REMOTE, "nccl: rank 0 could not create the communicator's unique id: %.*s",
                      (int)(len - 1 > 400 ? 400 : len - 1), (const char *)b + 1);
    } else if (len != 1 + TS_NCCL_ID_BYTES || b[0] != 'I') {
        st = ts_error(TS_ERR_FORMAT, "nccl: the store's %s holds %zu bytes, not a unique id of %d (rank %d)",
                      TS_NCCL_ID_KEY, len, 1 + TS_NCCL_ID_BYTES, rank);
    } else {
        memcpy(id, b + 1, TS_NCCL_ID_BYTES);
    }
    free(v);
    return st;
}
