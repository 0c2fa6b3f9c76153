/*
 * launch/supervise.c — one attempt, from the ranks' start to the last closed
 * pipe: a poll loop over a signal self-pipe and every rank's output, exits
 * noticed with waitid(WNOWAIT) (ranks stay zombies, so their process group ids
 * stay ours), the first failure judged, and the grace period between SIGTERM
 * and SIGKILL (tessera/launch.h, "Signals" and "Failure").
 */
#include "launch/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Time a rank that exited non-zero gets for a peer's death to become visible (see check_exits). */
#define EXIT_SETTLE_S 0.25

static const int handled_sigs[TS__LAUNCH_NSIGS] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
static int sig_pipe_w = -1; /* the self-pipe's write end, for the handler */
static bool installed;

static void on_signal(int sig) {
    int saved = errno;
    unsigned char b = (unsigned char)sig;
    ssize_t r = write(sig_pipe_w, &b, 1); /* a full pipe drops the byte (only SIGCHLD floods) */
    (void)r;
    errno = saved;
}

ts_status ts__launch_signals_install(ts__launcher *L) {
    int sp[2];
    if (pipe2(sp, O_CLOEXEC | O_NONBLOCK) != 0) return ts_error(TS_ERR_IO, "ts_launch_run: pipe: %s", strerror(errno));
    L->sig_r = sp[0];
    sig_pipe_w = sp[1];
    /* A signal the launcher was started with ignored (nohup, a background job's SIGINT) stays
     * ignored, as shells do. */
    sigprocmask(SIG_SETMASK, NULL, &L->old_mask);
    for (int k = 0; k < TS__LAUNCH_NSIGS; k++) {
        sigaction(handled_sigs[k], NULL, &L->old_act[k]);
        if (L->old_act[k].sa_handler == SIG_IGN && handled_sigs[k] != SIGCHLD) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART | (handled_sigs[k] == SIGCHLD ? SA_NOCLDSTOP : 0);
        sigaction(handled_sigs[k], &sa, NULL);
    }
    installed = true;
    return TS_OK;
}

void ts__launch_signals_restore(ts__launcher *L) {
    if (!installed) return;
    for (int k = 0; k < TS__LAUNCH_NSIGS; k++) sigaction(handled_sigs[k], &L->old_act[k], NULL);
    close(sig_pipe_w);
    close(L->sig_r);
    sig_pipe_w = L->sig_r = -1;
    installed = false;
}

void ts__launch_signal_all(ts__launcher *L, int sig) {
    for (int i = 0; i < L->n; i++)
        if (L->ranks[i].pid > 0) kill(-L->ranks[i].pid, sig); /* exited ranks are zombies: the pgid is still ours */
}

/* ---- exits -------------------------------------------------------------------------------------- */

/* Marks the ranks that exited since the last look (leaving them zombies) and returns the failure to
 * report among them: a rank killed by a signal before one that exited non-zero; else culprit. */
static ts__lrank *reap_exits(ts__launcher *L, ts__lrank *culprit) {
    for (int i = 0; i < L->n; i++) {
        ts__lrank *r = &L->ranks[i];
        if (r->exited || r->pid <= 0) continue;
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)r->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0) continue;
        r->exited = true;
        L->nexited++;
        bool by_signal = si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED;
        r->signal = by_signal ? si.si_status : 0;
        r->status = by_signal ? 128 + si.si_status : si.si_status;
        /* its last words first, then our verdict */
        ts__lstream_read(L, r, &r->out, true);
        ts__lstream_read(L, r, &r->err, true);
        if (r->status != 0 && (!culprit || (r->signal && !culprit->signal))) culprit = r;
    }
    return culprit;
}

static void report_failure(ts__launcher *L, ts__lrank *culprit, int blamed) {
    char b[16];
    ts_launch_event ev = TS__LAUNCH_EV(TS_LAUNCH_EV_FAILED);
    ev.rank = culprit->rank;
    ev.pid = (int)culprit->pid;
    ev.status = culprit->status;
    ev.signal = culprit->signal;
    ev.blamed = blamed;
    if (culprit->signal)
        ts__launch_event(L, ev, "rank %d (pid %d) was killed by signal %s", culprit->rank, (int)culprit->pid,
                         ts__signal_name(culprit->signal, b, sizeof b));
    else if (blamed >= 0)
        ts__launch_event(L, ev, "rank %d (pid %d) exited with status %d after waiting for rank %d", culprit->rank,
                         (int)culprit->pid, culprit->status, blamed);
    else
        ts__launch_event(L, ev, "rank %d (pid %d) exited with status %d", culprit->rank, (int)culprit->pid,
                         culprit->status);
}

/* Notices ranks that exited and acts on the first failure. Ranks that exit together are judged
 * together: a rank killed by a signal is the cause, and peers that exit non-zero because it vanished
 * (their collectives fail at once) are not, whatever order waitid finds them in. A killed process
 * closes its sockets before it becomes a zombie, so a peer can see it gone, exit and be reaped first:
 * a non-zero exit waits up to EXIT_SETTLE_S for such a death. */
static void check_exits(ts__launcher *L) {
    ts__lrank *culprit = reap_exits(L, NULL);
    if (!culprit || L->failed || L->got_signal) return;
    for (double until = ts__launch_now() + EXIT_SETTLE_S;
         !culprit->signal && L->nexited < L->n && ts__launch_now() < until;) {
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        culprit = reap_exits(L, culprit);
    }
    int blamed = culprit->signal ? -1 : ts__launch_verdict(L, culprit);
    report_failure(L, culprit, blamed);
    L->failed = true;
    L->fail_status = culprit->status;
    L->culprit_rank = culprit->rank;
    ts__lrank *hung = blamed >= 0 ? ts__launch_local_rank(L, blamed) : NULL;
    if (hung && !hung->exited) {
        ts_launch_event ev = TS__LAUNCH_EV(TS_LAUNCH_EV_KILL_BLAMED);
        ev.rank = hung->rank;
        ev.pid = (int)hung->pid;
        ts__launch_event(L, ev, "killing rank %d (pid %d, SIGKILL)", hung->rank, (int)hung->pid);
        kill(-hung->pid, SIGKILL);
    }
    if (L->nexited < L->n && L->nexited + (hung && !hung->exited) < L->n)
        ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_STOPPING),
                         "stopping the other ranks (SIGTERM, then SIGKILL after %gs)", L->o.grace_s);
    ts__launch_signal_all(L, SIGTERM);
    ts__launch_signal_all(L, SIGCONT); /* a stopped process acts on SIGTERM only once it runs */
    L->deadline = ts__launch_now() + L->o.grace_s;
}

/* ---- stopped ranks -------------------------------------------------------------------------------- */

/* A rank stopped (SIGSTOP, job control, a debugger) before its heartbeats run — in its first
 * moments, or waiting in the rendezvous while rank 0's store is the one stopped — would hold every
 * other rank until the rendezvous timeout (1800 s). Once heartbeats run, the ranks name a stopped
 * peer themselves after the heartbeat timeout (checked every heartbeat interval, at most 1 s); the
 * launcher waits TS__LAUNCH_STOP_MARGIN_S longer (stop_limit) so that their verdict, which names the
 * collective, comes first, and ends the job itself otherwise. */
static void fail_stopped(ts__launcher *L, ts__lrank *r, double stopped_s) {
    char st = ts__launch_proc_state(r->pid);
    ts_launch_event ev = TS__LAUNCH_EV(TS_LAUNCH_EV_FAILED);
    ev.rank = r->rank;
    ev.pid = (int)r->pid;
    ev.status = 128 + SIGKILL;
    ev.blamed = r->rank;
    ts__launch_event(L, ev,
                     "rank %d (pid %d) has been stopped (%s) for %.1f s and no peer has named it (the launcher's "
                     "limit is the heartbeat timeout + %g s: %g s)",
                     r->rank, (int)r->pid, st == 't' ? "traced by a debugger" : "SIGSTOP or job control", stopped_s,
                     TS__LAUNCH_STOP_MARGIN_S, L->stop_limit);
    L->failed = true;
    L->fail_status = 128 + SIGKILL;
    L->culprit_rank = r->rank;
    ts_launch_event kev = TS__LAUNCH_EV(TS_LAUNCH_EV_KILL_BLAMED);
    kev.rank = r->rank;
    kev.pid = (int)r->pid;
    ts__launch_event(L, kev, "killing rank %d (pid %d, SIGKILL)", r->rank, (int)r->pid);
    kill(-r->pid, SIGKILL);
    if (L->nexited + 1 < L->n)
        ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_STOPPING),
                         "stopping the other ranks (SIGTERM, then SIGKILL after %gs)", L->o.grace_s);
    ts__launch_signal_all(L, SIGTERM);
    ts__launch_signal_all(L, SIGCONT);
    L->deadline = ts__launch_now() + L->o.grace_s;
}

/* Reads every running rank's state (every TS__LAUNCH_STOP_CHECK_S) and fails the job on a rank
 * stopped for stop_limit. */
static void check_stops(ts__launcher *L) {
    double now = ts__launch_now();
    if (L->stop_limit <= 0 || L->failed || L->got_signal || now < L->next_stop_check) return;
    L->next_stop_check = now + TS__LAUNCH_STOP_CHECK_S;
    for (int i = 0; i < L->n; i++) {
        ts__lrank *r = &L->ranks[i];
        if (r->exited || r->pid <= 0) continue;
        char st = ts__launch_proc_state(r->pid);
        if (st != 'T' && st != 't') {
            r->stopped_since = 0;
            continue;
        }
        if (r->stopped_since == 0) r->stopped_since = now;
        else if (now - r->stopped_since >= L->stop_limit) {
            fail_stopped(L, r, now - r->stopped_since);
            return;
        }
    }
}

/* ---- signals to the launcher ---------------------------------------------------------------------- */

static void on_terminating_signal(ts__launcher *L, int sig) {
    char b[16];
    double now = ts__launch_now();
    if (!L->got_signal) {
        L->got_signal = sig;
        L->signal_at = now;
        ts_launch_event ev = TS__LAUNCH_EV(TS_LAUNCH_EV_SIGNAL);
        ev.signal = sig;
        if (L->killed) { /* the ranks were SIGKILLed already (a failure's grace ran out) */
            ts__launch_event(L, ev, "got %s; the ranks are being killed", ts__signal_name(sig, b, sizeof b));
            return;
        }
        ts__launch_event(L, ev, "got %s; forwarding it to the ranks (SIGKILL in %gs; SIGINT again: at once)",
                         ts__signal_name(sig, b, sizeof b), L->o.grace_s);
        ts__launch_signal_all(L, sig);
        ts__launch_signal_all(L, SIGCONT);
        if (!L->failed || L->deadline < 0 || L->deadline > now + L->o.grace_s) L->deadline = now + L->o.grace_s;
        return;
    }
    /* Again: SIGTERM and SIGHUP change nothing (timeout and a kill of the process group deliver them
     * twice); SIGINT is someone pressing Ctrl-C again, unless it is the first one's echo. */
    if (sig != SIGINT || L->killed || (L->got_signal == SIGINT && now - L->signal_at < TS__LAUNCH_SIGINT_REPEAT_S))
        return;
    ts_launch_event ev = TS__LAUNCH_EV(TS_LAUNCH_EV_SIGNAL_KILL);
    ev.signal = sig;
    ts__launch_event(L, ev, "got %s again; killing the ranks", ts__signal_name(sig, b, sizeof b));
    ts__launch_signal_all(L, SIGKILL);
    L->killed = true;
    L->deadline = -1;
}

void ts__launch_handle_signals(ts__launcher *L) {
    unsigned char b[64];
    ssize_t r;
    while ((r = read(L->sig_r, b, sizeof b)) > 0)
        for (ssize_t k = 0; k < r; k++)
            if (b[k] == SIGINT || b[k] == SIGTERM || b[k] == SIGHUP) on_terminating_signal(L, b[k]);
    /* SIGCHLD: check_exits runs every round; SIGPIPE: writes see EPIPE */
}

/* Appends "R (what)" to a list of ranks; "..." once it is full. */
static void list_rank(char *list, size_t cap, int *count, int rank, const char *what) {
    size_t len = strlen(list);
    if (len + 48 < cap) snprintf(list + len, cap - len, "%s%d%s", *count ? ", " : "", rank, what);
    else if (len + 5 < cap && (len < 3 || strcmp(list + len - 3, "...") != 0)) snprintf(list + len, cap - len, ", ...");
    (*count)++;
}

/* After a signal to the launcher, once every rank has ended: which ended by themselves (and how),
 * which were killed. */
static void report_signal_outcome(ts__launcher *L) {
    char self[400] = "", killed[400] = "", what[48], b[16];
    int nself = 0, nkilled = 0;
    for (int i = 0; i < L->n; i++) {
        const ts__lrank *r = &L->ranks[i];
        if (L->killed && r->signal == SIGKILL) {
            list_rank(killed, sizeof killed, &nkilled, r->rank, "");
            continue;
        }
        if (r->signal) snprintf(what, sizeof what, " (%s)", ts__signal_name(r->signal, b, sizeof b));
        else snprintf(what, sizeof what, " (status %d)", r->status);
        list_rank(self, sizeof self, &nself, r->rank, what);
    }
    ts_launch_event ev = TS__LAUNCH_EV(TS_LAUNCH_EV_SIGNAL_DONE);
    ev.signal = L->got_signal;
    ts__launch_event(L, ev, "after %s: %s%s%s%s%s%s%s", ts__signal_name(L->got_signal, b, sizeof b),
                     nself ? (nself == 1 ? "rank " : "ranks ") : "", self, nself ? (nself == 1 ? " ended by itself" : " ended by themselves") : "",
                     nself && nkilled ? "; " : "", nkilled ? (nkilled == 1 ? "rank " : "ranks ") : "", killed,
                     nkilled ? (nkilled == 1 ? " was killed (SIGKILL)" : " were killed (SIGKILL)") : "");
}

/* ---- the loop ----------------------------------------------------------------------------------- */

/* One poll round over the self-pipe and every open stream; timeout in seconds (< 0: none). */
static void poll_round(ts__launcher *L, double timeout) {
    struct pollfd *pfds = L->pfds;
    int np = 0;
    pfds[np++] = (struct pollfd){.fd = L->sig_r, .events = POLLIN};
    for (int i = 0; i < L->n; i++) {
        pfds[np++] = (struct pollfd){.fd = L->ranks[i].out.fd, .events = POLLIN}; /* fd -1 is skipped */
        pfds[np++] = (struct pollfd){.fd = L->ranks[i].err.fd, .events = POLLIN};
    }
    int ms = timeout < 0 ? -1 : (int)fmin(ceil(timeout * 1000.0), 1e9);
    if (poll(pfds, (nfds_t)np, ms) <= 0) return; /* timeout or EINTR: the caller looks again */
    if (pfds[0].revents) ts__launch_handle_signals(L);
    for (int i = 0; i < L->n; i++) {
        ts__lrank *r = &L->ranks[i];
        if (pfds[1 + 2 * i].revents) ts__lstream_read(L, r, &r->out, false);
        if (pfds[2 + 2 * i].revents) ts__lstream_read(L, r, &r->err, false);
    }
}

/* Every rank has exited. Whatever is left in their process groups gets SIGTERM, and SIGKILL once
 * the pipes are closed or the grace period is over. */
static void drain(ts__launcher *L) {
    ts__launch_signal_all(L, SIGTERM);
    double end = ts__launch_now() + L->o.grace_s;
    bool final_kill = false;
    while (ts__launch_open_streams(L) > 0) {
        double now = ts__launch_now();
        if (now >= end || (L->killed && !final_kill)) {
            if (final_kill) break;
            ts__launch_signal_all(L, SIGKILL);
            final_kill = true;
            end = now + TS__LAUNCH_DRAIN_AFTER_KILL_S;
            continue;
        }
        poll_round(L, end - now);
    }
    if (!final_kill) ts__launch_signal_all(L, SIGKILL);
    for (int i = 0; i < L->n; i++) {
        ts__lstream_close(L, &L->ranks[i].out);
        ts__lstream_close(L, &L->ranks[i].err);
    }
}

void ts__launch_supervise(ts__launcher *L) {
    for (int i = 0; i < L->n; i++) L->ranks[i].stopped_since = 0;
    L->next_stop_check = 0;
    while (L->nexited < L->n) {
        check_exits(L);
        if (L->nexited == L->n) break;
        check_stops(L);
        double now = ts__launch_now();
        if (L->deadline >= 0 && now >= L->deadline) {
            ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_GRACE_OVER),
                             "ranks still running %gs after SIGTERM; sending SIGKILL", L->o.grace_s);
            ts__launch_signal_all(L, SIGKILL);
            L->killed = true;
            L->deadline = -1;
            continue;
        }
        double wait = L->deadline < 0 ? -1.0 : L->deadline - now;
        if (L->stop_limit > 0 && !L->failed && !L->got_signal)
            wait = wait < 0 ? TS__LAUNCH_STOP_CHECK_S : fmin(wait, TS__LAUNCH_STOP_CHECK_S);
        poll_round(L, wait);
    }
    drain(L);
    if (L->got_signal) report_signal_outcome(L);
}
