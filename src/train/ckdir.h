/*
 * train/ckdir.h — checkpoint folders (internal to src/train): the lineage every training checkpoint
 * records, and what a run may do in a folder of step-<N>.ckpt files (ckdir.c).
 *
 * Lineage. A trainer is one session (a random 64-bit id and its wall-clock start). Its checkpoints
 * record, as train.lineage, the sessions the run went through: the resumed checkpoint's lineage plus
 * one segment {session id, step it started at, start time}. A file F belongs to the lineage of a run
 * R when F's segments are R's (aligned on F's last one) and F was written before R's next segment
 * began (F's step <= that segment's start step): F is R's own file or one of its ancestors. A file of
 * a branch that went on after R's resume point, of another run, without a lineage record, unreadable,
 * or not a regular file, is not: --keep never removes it and a save never replaces it.
 */
#ifndef TS_TRAIN_CKDIR_H
#define TS_TRAIN_CKDIR_H

#include "core/internal.h"
#include "tessera/ckpt.h"

#define TS__LINEAGE_MAX 1024 /* segments kept (the oldest go first; files older than that cannot be verified) */

typedef struct ts__lineage_seg {
    uint64_t id;        /* the session's random id */
    int64_t start_step; /* the step it started at (0, or the resumed checkpoint's) */
    int64_t start_ns;   /* its wall-clock start, nanoseconds since the epoch */
} ts__lineage_seg;

typedef struct ts__lineage {
    ts__lineage_seg *seg; /* owned; seg[n - 1] is the session that wrote the file (or the running one) */
    int n;
} ts__lineage;

void ts__lineage_clear(ts__lineage *l);
/* *l = parent's segments (NULL: none) + a new session {id, step, ns}; the oldest dropped past the cap. */
ts_status ts__lineage_extend(ts__lineage *l, const ts__lineage *parent, uint64_t id, int64_t step, int64_t ns);
/* The checkpoint's train.lineage into *l (*present false and l empty when the key is absent); a record that
 * is not one is TS_ERR_FORMAT naming path and the key. */
ts_status ts__lineage_read(const ts_ckpt *ck, const char *path, ts__lineage *l, bool *present);
ts_status ts__lineage_write(ts_ckpt *ck, const ts__lineage *l);
/* Whether a file with lineage f saved at step belongs to the lineage cur (above). */
bool ts__lineage_holds(const ts__lineage *cur, const ts__lineage *f, int64_t step);

/* A trainer's checkpoint folder: the files of its lineage it may remove, by step (ascending). */
typedef struct ts__ckdir_file {
    int64_t step;
    uint64_t dev, ino; /* the file as it was verified or written: removed only while it is still that file */
} ts__ckdir_file;

typedef struct ts__ckdir {
    ts__ckdir_file *f;
    int n, cap;
    bool scanned;
} ts__ckdir;

void ts__ckdir_clear(ts__ckdir *d);
/* Records the files of dir that belong to lineage cur; warns (one line) about those that do not. */
void ts__ckdir_scan(ts__ckdir *d, const char *dir, const ts__lineage *cur);
/* The path of step's checkpoint in dir into path (n bytes). A file already there that is not one of
 * d's is moved aside to "<path>.other-<k>" (warning naming both) so the save cannot replace it. */
ts_status ts__ckdir_prepare(ts__ckdir *d, const char *dir, int64_t step, char *path, size_t n);
/* After the save of step's file at path: records it, then removes all but the newest `keep` of d's files
 * (0: none removed), never the one just written, each only while it is still the file recorded. */
void ts__ckdir_saved(ts__ckdir *d, const char *dir, int64_t step, const char *path, int keep);

#endif
