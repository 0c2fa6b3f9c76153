/*
 * tests/test_launch_env.c — ts_dist_env_detect / ts_dist_env_read under each
 * launcher's variables (torchrun, tessera run, by hand, mpirun, mpiexec/hydra,
 * PMIx, srun), partial and contradictory sets, the rendezvous address each
 * launcher implies, and Slurm's host-list expansion. The environment is
 * process-wide: every test starts from a cleared launch environment.
 */
#include "distributed/rendezvous.h"
#include "test_util.h"

extern char **environ;

/* Unsets every variable a launcher could have set. */
static void env_clear(void) {
    static const char *const prefixes[] = {"SLURM_", "OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "TORCHELASTIC_"};
    static const char *const names[] = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",     "LOCAL_WORLD_SIZE",
                                        "MASTER_ADDR", "MASTER_PORT", "TS_LAUNCHED_BY", "GROUP_RANK"};
    for (bool again = true; again;) {
        again = false;
        for (char **e = environ; e && *e && !again; e++)
            for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0] && !again; i++)
                if (strncmp(*e, prefixes[i], strlen(prefixes[i])) == 0) {
                    char name[256];
                    size_t n = strcspn(*e, "=");
                    snprintf(name, sizeof name, "%.*s", (int)n, *e);
                    unsetenv(name); /* environ changed: start over */
                    again = true;
                }
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);
}

static void set(const char *k, const char *v) { setenv(k, v, 1); }

/* Detects and expects an error mentioning both needles. */
#define CHECK_DETECT_FAILS(n1, n2)                                         \
    do {                                                                   \
        ts_dist_env e_;                                                    \
        CHECK_STATUS(ts_dist_env_detect(&e_, NULL), TS_ERR_INVALID_ARG);   \
        CHECK_ERR_MENTIONS(n1);                                            \
        CHECK_ERR_MENTIONS(n2);                                            \
    } while (0)

static void test_nodelist(void) {
    char h[64];
    int n = 0;
    CHECK_OK(ts__slurm_nodelist_host("L", "node[01-03,07]", 0, h, sizeof h, &n));
    CHECK(n == 4 && strcmp(h, "node01") == 0);
    const char *want[] = {"node01", "node02", "node03", "node07"};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(ts__slurm_nodelist_host("L", "node[01-03,07]", i, h, sizeof h, NULL));
        CHECK(strcmp(h, want[i]) == 0);
    }
    const char *want2[] = {"a1", "a2", "b3"};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(ts__slurm_nodelist_host("L", "a[1-2],b3", i, h, sizeof h, &n));
        CHECK(n == 3 && strcmp(h, want2[i]) == 0);
    }
    CHECK_OK(ts__slurm_nodelist_host("L", "localhost", 0, h, sizeof h, &n));
    CHECK(n == 1 && strcmp(h, "localhost") == 0);
    CHECK_OK(ts__slurm_nodelist_host("L", "n[9-11]", 2, h, sizeof h, &n)); /* no padding below "9" */
    CHECK(n == 3 && strcmp(h, "n11") == 0);
    CHECK_OK(ts__slurm_nodelist_host("L", "gpu[008-010]", 2, h, sizeof h, &n));
    CHECK(n == 3 && strcmp(h, "gpu010") == 0);
    /* two groups in one name: the last varies fastest */
    const char *want3[] = {"r1-n1", "r1-n2", "r2-n1", "r2-n2", "x"};
    for (int i = 0; i < 5; i++) {
        CHECK_OK(ts__slurm_nodelist_host("L", "r[1-2]-n[1-2],x", i, h, sizeof h, &n));
        CHECK(n == 5 && strcmp(h, want3[i]) == 0);
    }
    CHECK_OK(ts__slurm_nodelist_host("L", "c[1-1000]", 0, NULL, 0, &n)); /* counting only */
    CHECK(n == 1000);
    static const char *const bad[] = {"",     "n[1-", "n[3-1]", "n[a]",  "n[]",
                                      "n]1",  "a,,b", "a,",     "n[1,]", "n[1-]",
                                      "n[99999999999999999999]", "n[1-99999999999999999999]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_STATUS(ts__slurm_nodelist_host("SLURM_JOB_NODELIST", bad[i], 0, h, sizeof h, NULL), TS_ERR_INVALID_ARG);
        CHECK_ERR_MENTIONS("SLURM_JOB_NODELIST=");
        CHECK_ERR_MENTIONS("not a Slurm host list");
    }
    CHECK_STATUS(ts__slurm_nodelist_host("L", "a[1-2]", 2, h, sizeof h, NULL), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("there is no host 2");
}

static void test_no_launcher(void) {
    env_clear();
    ts_dist_env e;
    bool in_job = true;
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(!in_job && e.rank == 0 && e.world_size == 1 && strcmp(e.source, "none") == 0);
    CHECK(e.master_addr[0] == 0 && e.master_port == 0);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("RANK");
    /* an sbatch script or salloc shell: SLURM_PROCID and SLURM_NTASKS, but no job step */
    set("SLURM_PROCID", "0");
    set("SLURM_NTASKS", "4");
    set("SLURM_JOB_ID", "77");
    set("SLURM_JOB_NODELIST", "node[1-2]");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(!in_job && strcmp(e.source, "none") == 0);
    /* a world of one is not a job */
    env_clear();
    set("RANK", "0");
    set("WORLD_SIZE", "1");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(!in_job && strcmp(e.source, "env") == 0 && e.world_size == 1);
    env_clear();
}

static void test_torchrun(void) {
    env_clear();
    set("RANK", "3");
    set("WORLD_SIZE", "8");
    set("LOCAL_RANK", "1");
    set("LOCAL_WORLD_SIZE", "2");
    set("MASTER_ADDR", "127.0.0.1");
    set("MASTER_PORT", "29500");
    set("TORCHELASTIC_RUN_ID", "none");
    set("TORCHELASTIC_USE_AGENT_STORE", "True");
    set("TORCHELASTIC_RESTART_COUNT", "2");
    ts_dist_env e;
    bool in_job = false;
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(in_job && e.rank == 3 && e.world_size == 8 && e.local_rank == 1 && e.local_world_size == 2);
    CHECK(strcmp(e.source, "torchrun") == 0 && e.torch_agent_store && e.restart_count == 2);
    CHECK(strcmp(e.master_addr, "127.0.0.1") == 0 && e.master_port == 29500);
    CHECK(strcmp(e.master_addr_from, "MASTER_ADDR") == 0 && strcmp(e.master_port_from, "MASTER_PORT") == 0);
    set("TORCHELASTIC_USE_AGENT_STORE", "False");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(!e.torch_agent_store);
    /* srun torchrun ...: SLURM_PROCID is the agent's index, not ours: never compared */
    set("SLURM_PROCID", "1");
    set("SLURM_STEP_ID", "0");
    set("SLURM_NTASKS", "2");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(e.rank == 3 && strcmp(e.source, "torchrun") == 0);
    /* tessera run nested the same way */
    unsetenv("TORCHELASTIC_RUN_ID");
    set("TS_LAUNCHED_BY", "tessera-run");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(e.rank == 3 && strcmp(e.source, "tessera-run") == 0);
    set("TORCHELASTIC_RUN_ID", "none"); /* tessera run under torchrun: tessera run's children, tessera's store */
    set("TORCHELASTIC_USE_AGENT_STORE", "True");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(strcmp(e.source, "tessera-run") == 0 && !e.torch_agent_store);
    set("TORCHELASTIC_RESTART_COUNT", "x");
    CHECK_DETECT_FAILS("TORCHELASTIC_RESTART_COUNT", "'x'");
    env_clear();
}

static void test_by_hand(void) {
    env_clear();
    ts_dist_env e;
    bool in_job = false;
    set("RANK", "1");
    CHECK_DETECT_FAILS("RANK=1", "WORLD_SIZE is not");
    unsetenv("RANK");
    set("WORLD_SIZE", "2");
    CHECK_DETECT_FAILS("WORLD_SIZE=2", "RANK is not");
    set("RANK", "2");
    CHECK_DETECT_FAILS("RANK=2", "WORLD_SIZE=2");
    set("RANK", "-1");
    CHECK_DETECT_FAILS("RANK='-1'", "not a non-negative integer");
    set("RANK", "1");
    set("LOCAL_RANK", "3");
    set("LOCAL_WORLD_SIZE", "2");
    CHECK_DETECT_FAILS("LOCAL_RANK=3", "LOCAL_WORLD_SIZE=2");
    set("LOCAL_RANK", "1");
    set("LOCAL_WORLD_SIZE", "4");
    CHECK_DETECT_FAILS("LOCAL_WORLD_SIZE=4", "WORLD_SIZE=2");
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(in_job && e.rank == 1 && strcmp(e.source, "env") == 0 && e.local_rank == -1);
    CHECK(e.master_addr[0] == 0 && e.master_port == 0);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG); /* needs MASTER_ADDR */
    CHECK_ERR_MENTIONS("MASTER_ADDR");
    /* set by hand inside an srun step: srun's variables must agree */
    set("SLURM_PROCID", "0");
    set("SLURM_STEP_ID", "3");
    set("SLURM_NTASKS", "2");
    CHECK_DETECT_FAILS("RANK=1", "SLURM_PROCID=0");
    set("SLURM_PROCID", "1");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(strcmp(e.source, "env") == 0 && e.rank == 1);
    set("SLURM_NTASKS", "4");
    CHECK_DETECT_FAILS("WORLD_SIZE=2", "SLURM_NTASKS=4");
    /* ... and under mpirun, Open MPI's */
    env_clear();
    set("RANK", "1");
    set("WORLD_SIZE", "2");
    set("OMPI_COMM_WORLD_RANK", "0");
    set("OMPI_COMM_WORLD_SIZE", "2");
    CHECK_DETECT_FAILS("RANK=1", "OMPI_COMM_WORLD_RANK=0");
    env_clear();
}

static void test_mpirun(void) {
    env_clear();
    set("OMPI_COMM_WORLD_RANK", "1");
    set("OMPI_COMM_WORLD_SIZE", "2");
    set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
    set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
    set("OMPI_MCA_ess_base_jobid", "1463943169");
    set("PMIX_NAMESPACE", "1463943169");
    set("PMIX_RANK", "1");
    ts_dist_env e;
    bool in_job = false;
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(in_job && e.rank == 1 && e.world_size == 2 && e.local_rank == 1 && e.local_world_size == 2);
    CHECK(strcmp(e.source, "mpirun") == 0);
    /* every rank on this host: the store on 127.0.0.1, the port from the job id */
    CHECK(strcmp(e.master_addr, "127.0.0.1") == 0 && e.master_port == 10000 + 1463943169 % 20000);
    CHECK(strcmp(e.master_port_from, "OMPI_MCA_ess_base_jobid") == 0);
    CHECK_OK(ts_dist_env_read(&e));
    set("MASTER_ADDR", "10.1.2.3");
    set("MASTER_PORT", "4242");
    CHECK_OK(ts_dist_env_read(&e));
    CHECK(strcmp(e.master_addr, "10.1.2.3") == 0 && e.master_port == 4242);
    /* ranks on several hosts: MASTER_ADDR is needed */
    unsetenv("MASTER_ADDR");
    set("OMPI_COMM_WORLD_SIZE", "4");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(e.master_addr[0] == 0);
    CHECK_STATUS(ts_dist_env_read(&e), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("MASTER_ADDR");
    CHECK_ERR_MENTIONS("OMPI_COMM_WORLD_LOCAL_SIZE=2");
    /* mpirun inside a Slurm allocation: SLURM_PROCID is the daemon's, never compared */
    set("SLURM_PROCID", "0");
    set("SLURM_STEP_ID", "0");
    set("SLURM_NTASKS", "1");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(strcmp(e.source, "mpirun") == 0 && e.rank == 1 && e.world_size == 4);
    /* partial */
    unsetenv("OMPI_COMM_WORLD_SIZE");
    CHECK_DETECT_FAILS("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE is not");
    set("OMPI_COMM_WORLD_SIZE", "1");
    CHECK_DETECT_FAILS("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=1");
    env_clear();
}

static void test_srun(void) {
    env_clear();
    set("SLURM_PROCID", "1");
    set("SLURM_STEP_ID", "0");
    set("SLURM_NTASKS", "4"); /* the allocation's; the step's count wins */
    set("SLURM_STEP_NUM_TASKS", "2");
    set("SLURM_LOCALID", "1");
    set("SLURM_NODEID", "0");
    set("SLURM_STEP_TASKS_PER_NODE", "2");
    set("SLURM_JOB_NODELIST", "node[01-03,07]");
    set("SLURM_JOB_ID", "123456");
    set("SLURM_LAUNCH_NODE_IPADDR", "10.9.8.7");
    ts_dist_env e;
    bool in_job = false;
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(in_job && e.rank == 1 && e.world_size == 2 && e.local_rank == 1 && e.local_world_size == 2);
    CHECK(strcmp(e.source, "srun") == 0);
    CHECK(strcmp(e.master_addr, "node01") == 0 && strcmp(e.master_addr_from, "SLURM_JOB_NODELIST") == 0);
    CHECK(e.master_port == 10000 + 123456 % 20000 && strcmp(e.master_port_from, "SLURM_JOB_ID") == 0);
    set("SLURM_STEP_NODELIST", "gpu[3-4]");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(strcmp(e.master_addr, "gpu3") == 0 && strcmp(e.master_addr_from, "SLURM_STEP_NODELIST") == 0);
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_JOB_NODELIST");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(strcmp(e.master_addr, "10.9.8.7") == 0 && strcmp(e.master_addr_from, "SLURM_LAUNCH_NODE_IPADDR") == 0);
    set("MASTER_ADDR", "head");
    set("MASTER_PORT", "5555");
    CHECK_OK(ts_dist_env_read(&e));
    CHECK(strcmp(e.master_addr, "head") == 0 && e.master_port == 5555);
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    set("SLURM_JOB_NODELIST", "node[01-");
    CHECK_DETECT_FAILS("SLURM_JOB_NODELIST='node[01-'", "not a Slurm host list");
    set("SLURM_JOB_NODELIST", "node[01-03,07]");
    /* the tasks on this node, from the compressed per-node counts */
    unsetenv("SLURM_STEP_TASKS_PER_NODE");
    set("SLURM_STEP_NUM_TASKS", "7");
    set("SLURM_TASKS_PER_NODE", "2(x3),1");
    set("SLURM_PROCID", "6");
    set("SLURM_LOCALID", "0");
    set("SLURM_NODEID", "3");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(e.local_world_size == 1 && e.world_size == 7);
    set("SLURM_NODEID", "1");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(e.local_world_size == 2);
    set("SLURM_NODEID", "4");
    CHECK_DETECT_FAILS("SLURM_TASKS_PER_NODE='2(x3),1'", "SLURM_NODEID is 4");
    unsetenv("SLURM_NODEID");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(e.local_world_size == -1); /* unequal counts, no node index: from host names at rendezvous */
    set("SLURM_TASKS_PER_NODE", "2(3)");
    CHECK_DETECT_FAILS("SLURM_TASKS_PER_NODE='2(3)'", "task count list");
    set("SLURM_TASKS_PER_NODE", "2(x3),1");
    /* contradictions */
    set("SLURM_PROCID", "7");
    CHECK_DETECT_FAILS("SLURM_PROCID=7", "SLURM_STEP_NUM_TASKS=7");
    set("SLURM_PROCID", "2");
    set("SLURM_LOCALID", "2");
    set("SLURM_NODEID", "0");
    CHECK_DETECT_FAILS("SLURM_LOCALID=2", "SLURM_TASKS_PER_NODE=2");
    set("SLURM_LOCALID", "0");
    unsetenv("SLURM_STEP_NUM_TASKS");
    unsetenv("SLURM_NTASKS");
    CHECK_DETECT_FAILS("SLURM_PROCID=2", "SLURM_NTASKS is not");
    set("SLURM_NTASKS", "7");
    /* srun --mpi=pmix also sets PMIX_RANK: the same process, so the same rank */
    set("PMIX_RANK", "2");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(strcmp(e.source, "srun") == 0 && e.rank == 2);
    set("PMIX_RANK", "5");
    CHECK_DETECT_FAILS("PMIX_RANK=5", "SLURM_PROCID=2");
    /* srun --mpi=pmi2 sets PMI_RANK (and maybe no PMI_SIZE) */
    unsetenv("PMIX_RANK");
    set("PMI_RANK", "2");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(strcmp(e.source, "srun") == 0 && e.rank == 2);
    env_clear();
}

static void test_hydra_and_pmix(void) {
    env_clear();
    set("PMI_RANK", "1");
    set("PMI_SIZE", "2");
    set("MPI_LOCALRANKID", "1");
    set("MPI_LOCALNRANKS", "2");
    ts_dist_env e;
    bool in_job = false;
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(in_job && strcmp(e.source, "hydra") == 0 && e.rank == 1 && e.world_size == 2 && e.local_world_size == 2);
    CHECK(strcmp(e.master_addr, "127.0.0.1") == 0 && e.master_port == 0); /* no job id: MASTER_PORT needed */
    set("PMI_JOBID", "kvs_1234");
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(e.master_port >= 10000 && e.master_port < 30000 && strcmp(e.master_port_from, "PMI_JOBID") == 0);
    unsetenv("PMI_SIZE");
    CHECK_DETECT_FAILS("PMI_RANK=1", "PMI_SIZE is not");
    env_clear();
    set("PMIX_RANK", "3");
    CHECK_DETECT_FAILS("PMIX_RANK=3", "no world size");
    set("PMIX_RANK", "0"); /* an MPI singleton (Open MPI's MPI_Init sets it) */
    CHECK_OK(ts_dist_env_detect(&e, &in_job));
    CHECK(!in_job && strcmp(e.source, "none") == 0);
    set("PMIX_RANK", "x3");
    CHECK_DETECT_FAILS("PMIX_RANK='x3'", "not a non-negative integer");
    env_clear();
}

TU_MAIN(T(test_nodelist), T(test_no_launcher), T(test_torchrun), T(test_by_hand), T(test_mpirun), T(test_srun),
        T(test_hydra_and_pmix))
