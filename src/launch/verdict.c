/*
 * launch/verdict.c — whom a failure is about. A rank that exits non-zero
 * because a collective failed is rarely the one to blame: the reports its
 * group's ranks wrote (distributed/report.h, in TS_RUN_DIR) and the process
 * table say who is. In order:
 *   1. heartbeats: the rank most reports say went silent while they waited on it
 *      (reports that gave up on it first; else those that failed otherwise while
 *      it was silent);
 *   2. a local rank that is stopped (state T or t in /proc: SIGSTOP, a debugger);
 *   3. a collective that timed out: the rank most reports say had not started it.
 */
#include "launch/launch.h"

#include "distributed/report.h"

#include <dirent.h>
#include <stdio.h>

#define MAX_REPORTS 256

typedef struct verdict {
    ts__launcher *L;
    const ts__lrank *culprit;
    ts__fail_report *rep;
    int nrep;
    int votes[MAX_REPORTS * TS__REPORT_MAX_BEHIND];
    char state[96];
} verdict;

ts__lrank *ts__launch_local_rank(ts__launcher *L, int rank) {
    for (int i = 0; i < L->n; i++)
        if (L->ranks[i].rank == rank) return &L->ranks[i];
    return NULL;
}

/* Every report of this run (at most cap). */
static int read_reports(const char *dir, ts__fail_report *out, int cap) {
    int n = 0;
    DIR *d = dir[0] ? opendir(dir) : NULL;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap) {
        if (!ts__fail_report_is_name(e->d_name)) continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (ts__fail_report_read(path, &out[n]) == TS_OK) n++;
    }
    closedir(d);
    return n;
}

/* The scheduler state of a process ('R', 'S', 'T' stopped, 't' traced, 'Z', ...), 0 if unknown. */
char ts__launch_proc_state(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

/* The rank named most often in votes[0..n) (ties: the lowest), or -1. */
static int most_named(const int *votes, int n) {
    int best = -1, best_count = 0;
    for (int i = 0; i < n; i++) {
        int c = 0;
        for (int j = 0; j < n; j++) c += votes[j] == votes[i];
        if (c > best_count || (c == best_count && votes[i] < best)) best = votes[i], best_count = c;
    }
    return best;
}

/* What we can see of a rank: "; it is stopped (...)", "; it is still running (...)", "; it is on another
 * node", or "" (it exited, or /proc cannot tell). */
static const char *local_state(verdict *v, int rank) {
    ts__lrank *p = ts__launch_local_rank(v->L, rank);
    v->state[0] = 0;
    if (!p) {
        snprintf(v->state, sizeof v->state, "; it is on another node");
        return v->state;
    }
    if (p->exited) return v->state;
    char st = ts__launch_proc_state(p->pid);
    if (st == 'T') snprintf(v->state, sizeof v->state, "; it is stopped (SIGSTOP or job control)");
    else if (st == 't') snprintf(v->state, sizeof v->state, "; it is stopped by a debugger (traced)");
    else if (st) snprintf(v->state, sizeof v->state, "; it is still running (state %c: hung?)", st);
    return v->state;
}

static void tell(verdict *v, int blamed, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void tell(verdict *v, int blamed, const char *fmt, ...) {
    char text[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ts_launch_event ev = TS__LAUNCH_EV(TS_LAUNCH_EV_VERDICT);
    ev.blamed = blamed;
    ev.rank = v->culprit->rank;
    ts__launch_event(v->L, ev, "%s", text);
}

/* 1. heartbeats: pass 0 counts reports of cause heartbeat, pass 1 the others that name a silent peer. */
static int by_heartbeat(verdict *v, bool hb_only) {
    int nv = 0;
    const ts__fail_report *rep = v->rep;
    for (int i = 0; i < v->nrep; i++)
        if (rep[i].blame_rank >= 0 && (rep[i].cause == TS__CAUSE_HEARTBEAT) == hb_only) v->votes[nv++] = rep[i].blame_rank;
    int blamed = most_named(v->votes, nv);
    if (blamed < 0) return -1;
    const ts__fail_report *ex = NULL; /* the report quoted: the failing rank's own if it is one */
    char others[128] = "";
    for (int i = 0; i < v->nrep; i++)
        if (rep[i].blame_rank == blamed && (rep[i].cause == TS__CAUSE_HEARTBEAT) == hb_only &&
            (!ex || rep[i].rank == v->culprit->rank))
            ex = &rep[i];
    for (int i = 0; i < v->nrep; i++)
        if (&rep[i] != ex && rep[i].blame_rank == blamed && strlen(others) < sizeof others - 16)
            snprintf(others + strlen(others), sizeof others - strlen(others), "%s%d", others[0] ? ", " : "",
                     rep[i].rank);
    tell(v, blamed,
         "rank %d (pid %d on %s) stopped responding: rank %d %s %s and had not heard from it for %.1f s%s%s%s%s%s%s",
         blamed, ex->blame_pid, ex->blame_host, ex->rank, hb_only ? "waited for it in" : "failed in", ex->op,
         ex->silent_s, others[0] ? " (nor had rank " : "", others, others[0] ? ")" : "",
         ex->blame_position[0] ? "; its last heartbeat: " : "", ex->blame_position, local_state(v, blamed));
    return blamed;
}

/* 2. a local rank that is stopped */
static int by_stopped(verdict *v) {
    for (int i = 0; i < v->L->n; i++) {
        const ts__lrank *p = &v->L->ranks[i];
        char st = p->exited ? 0 : ts__launch_proc_state(p->pid);
        if (st != 'T' && st != 't') continue;
        const ts__fail_report *own = NULL; /* what the failing rank was in, if it said */
        for (int k = 0; k < v->nrep; k++)
            if (v->rep[k].rank == v->culprit->rank && strcmp(v->rep[k].op, "none") != 0) own = &v->rep[k];
        tell(v, p->rank, "rank %d (pid %d) is stopped%s; rank %d failed%s%s%s", p->rank, (int)p->pid,
             st == 't' ? " by a debugger" : " (SIGSTOP or job control)", v->culprit->rank, own ? " in " : "",
             own ? own->op : "", own ? "" : " meanwhile");
        return p->rank;
    }
    return -1;
}

/* 3. a collective timed out: the rank(s) that had not started it */
static int by_timeout(verdict *v) {
    int nv = 0;
    const ts__fail_report *ex = NULL;
    for (int i = 0; i < v->nrep; i++) {
        if (v->rep[i].cause != TS__CAUSE_TIMEOUT) continue;
        for (int k = 0; k < v->rep[i].nbehind; k++) v->votes[nv++] = v->rep[i].behind[k];
        if (v->rep[i].nbehind && (!ex || v->rep[i].rank == v->culprit->rank)) ex = &v->rep[i];
    }
    int blamed = most_named(v->votes, nv);
    if (blamed < 0 || !ex) return -1;
    tell(v, blamed, "rank %d never reached %s, which rank %d waited in for %.1f s%s", blamed, ex->op, ex->rank,
         ex->op_for_s, local_state(v, blamed));
    return blamed;
}

int ts__launch_verdict(ts__launcher *L, const ts__lrank *culprit) {
    verdict *v = ts__calloc(1, sizeof *v);
    if (!v) return -1;
    v->L = L;
    v->culprit = culprit;
    v->rep = ts__calloc(MAX_REPORTS, sizeof *v->rep);
    v->nrep = v->rep ? read_reports(L->run_dir, v->rep, MAX_REPORTS) : 0;
    int blamed = by_heartbeat(v, true);
    if (blamed < 0) blamed = by_heartbeat(v, false);
    if (blamed < 0) blamed = by_stopped(v);
    if (blamed < 0) blamed = by_timeout(v);
    free(v->rep);
    free(v);
    return blamed;
}
