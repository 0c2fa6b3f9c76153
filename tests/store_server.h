/*
 * tests/store_server.h — a TCP store served by a child process, for tests that
 * fork ranks as processes. Header-only; include test_util.h first.
 *
 * Why a process: a test that serves the store from a thread of its own and
 * then forks ranks forks a multi-threaded process. A child then inherits any
 * lock another thread held at that moment — ASan's allocator takes no fork
 * locks (GCC 12), so a rank could hang in its first malloc of the size class
 * the store's thread was allocating (seen as a heartbeat thread stuck at its
 * start). Forked from the single-threaded test, the server keeps every thread
 * of the test out of the ranks' way.
 *
 *     tu_store_server srv;
 *     if (!tu_store_server_start(&srv)) return;    // srv.port: where ranks connect
 *     ... fork ranks: ts_store_tcp_new("127.0.0.1", srv.port, false, ...) ...
 *     tu_store_server_stop(&srv);                  // SIGKILL, reaped
 */
#ifndef TS_TEST_STORE_SERVER_H
#define TS_TEST_STORE_SERVER_H

#include "test_util.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct tu_store_server {
    pid_t pid;
    int port;
} tu_store_server;

/* Starts the server process; false (a failed check) if it could not. */
static inline bool tu_store_server_start(tu_store_server *s) {
    int p[2];
    s->pid = -1;
    s->port = -1;
    tu_checks++;
    if (pipe(p) != 0) {
        tu_failures++;
        return false;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        ts_store *st = NULL;
        int port = ts_store_tcp_new("127.0.0.1", 0, true, 30.0, &st) == TS_OK ? ts_store_tcp_port(st) : -1;
        ssize_t w = write(p[1], &port, sizeof port);
        close(p[1]);
        if (w == (ssize_t)sizeof port && port > 0)
            for (;;) pause(); /* until the test kills us */
        _exit(1);
    }
    close(p[1]);
    int port = -1;
    ssize_t r = pid > 0 ? read(p[0], &port, sizeof port) : -1;
    close(p[0]);
    s->pid = pid;
    s->port = r == (ssize_t)sizeof port ? port : -1;
    if (s->port <= 0) {
        tu_failures++;
        fprintf(stderr, "tu_store_server_start: no TCP store server\n");
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        return false;
    }
    return true;
}

static inline void tu_store_server_stop(tu_store_server *s) {
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = -1;
}

#endif
