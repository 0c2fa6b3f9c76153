/*
 * distributed/nccl/nccl.h — what the NCCL backend (nccl.c) shares with its host-side tests.
 */
#ifndef TS_DIST_NCCL_H
#define TS_DIST_NCCL_H

#include "tessera/dist.h"

#include <stddef.h>

#define TS_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES) */
#define TS_NCCL_ID_KEY "nccl/unique_id"

/* The communicator's unique id, through the group's store: rank 0 makes it (make(user, id), NCCL's
 * ncclGetUniqueId) and publishes it under TS_NCCL_ID_KEY, every other rank waits for that key up to
 * timeout_s. The value is "I" + the id's TS_NCCL_ID_BYTES bytes, or "E" + rank 0's error message when it
 * could not make one, so that the other ranks fail at once naming rank 0 instead of waiting out the
 * timeout. */
typedef ts_status (*ts__nccl_id_maker)(void *user, unsigned char id[TS_NCCL_ID_BYTES]);
ts_status ts__nccl_exchange_id(ts_store *store, int rank, double timeout_s, ts__nccl_id_maker make, void *user,
                               unsigned char id[TS_NCCL_ID_BYTES]);

#endif /* TS_DIST_NCCL_H */
