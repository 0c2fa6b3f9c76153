/*
 * distributed/launched.c — what a process does once it knows it is one rank of
 * a launched job (ts__launched_setup, from ts_pg_new): it takes its share of the
 * host's CPUs and makes its stdout line-buffered when that is a pipe.
 *
 *  - Threads: CPUs / ranks on this host (core/threads.c's ts__threads_share),
 *    unless the program called ts_set_num_threads or OMP_NUM_THREADS is set
 *    (tessera run sets it for its ranks; torchrun sets 1). The ranks on the host
 *    are the launcher's LOCAL_WORLD_SIZE (or its equivalent), else what the
 *    group's join found from host names.
 *  - Output: launchers collect a rank's stdout through a pipe (tessera run,
 *    mpirun, srun), where C's stdio buffers whole blocks: printf lines would
 *    arrive at exit. Line-buffered, each line arrives when printed. A stdout
 *    that is a file or a terminal is left as it is.
 * Once per process, for the first group; never for ranks that are threads of
 * one process (no launcher variables).
 */
#include "distributed/rendezvous.h"

#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

void ts__launched_setup(int group_local_world) {
    static atomic_flag done = ATOMIC_FLAG_INIT;
    ts_dist_env env;
    bool in_job = false;
    if (ts_dist_env_detect(&env, &in_job) != TS_OK) return; /* the group's own join already said why */
    if (strcmp(env.source, "none") == 0 || atomic_flag_test_and_set(&done)) return;
    int local = env.local_world_size > 0 ? env.local_world_size : group_local_world;
    int threads = ts__threads_share(local);
    struct stat sb;
    bool piped = fstat(STDOUT_FILENO, &sb) == 0 && (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode));
    if (piped) { /* glibc keeps what is buffered and flushes it at the next newline; flush it now instead */
        fflush(stdout);
        setvbuf(stdout, NULL, _IOLBF, 0);
    }
    ts_log(TS_LOG_INFO, "rank %d of %d (%s): %d CPU threads (%d ranks on this host)%s", env.rank, env.world_size,
           env.source, threads, local, piped ? ", stdout line-buffered" : "");
}
