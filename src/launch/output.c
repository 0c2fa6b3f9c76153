/*
 * launch/output.c — what the ranks write, passed on (tessera/launch.h, "Output").
 *
 * Lines mode (the destination is not a terminal): a stream's bytes wait in its
 * buffer until a newline; each complete line goes out as "[rank R] line\n" in
 * one write with the other lines of that read, so lines of different ranks
 * never tear. A line longer than TS__LAUNCH_LINE_CAP is broken there; the
 * partial line left at EOF gets a newline.
 *
 * Terminal mode (prefixing to a terminal): bytes go out as they come, so what a
 * rank draws and redraws shows at once. The rank's prefix is written at the
 * start of each of its lines and again after every '\r' (the rank returned to
 * the start of its line to redraw it). Per destination, shown[] is the stream
 * whose unfinished line is on screen; before another stream writes there, that
 * line is erased ("\r" + erase-to-end-of-line), and it is drawn again (prefix +
 * its text since its last '\r', kept in seg) once the other stream's text ends
 * at a line boundary.
 *
 * log_dir: every byte read also goes, unchanged, to the rank's file of the attempt.
 */
#include "launch/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static const char ERASE_LINE[] = "\r\033[K";

static bool reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 4096;
    while (c < need) c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb) return false;
    *buf = nb;
    *cap = c;
    return true;
}

static void write_all(ts__launcher *L, int dest, const char *p, size_t n) {
    int fd = dest ? L->o.err_fd : L->o.out_fd;
    while (n > 0 && !L->out_broken[dest]) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 100);
        } else {
            L->out_broken[dest] = true; /* EPIPE and friends: nobody is reading */
        }
    }
}

/* ---- the output buffer of one call ----------------------------------------------------------------- */

static void oflush(ts__launcher *L, int dest) {
    if (L->olen) write_all(L, dest, L->obuf, L->olen);
    L->olen = 0;
}

static void oput(ts__launcher *L, int dest, const char *p, size_t n) {
    if (!n) return;
    if (!reserve(&L->obuf, &L->ocap, L->olen + n)) { /* out of memory: write through */
        oflush(L, dest);
        write_all(L, dest, p, n);
        return;
    }
    memcpy(L->obuf + L->olen, p, n);
    L->olen += n;
}

static void oprefix(ts__launcher *L, const ts__lstream *s) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "[rank %d] ", s->rank);
    oput(L, s->dest, prefix, (size_t)n);
}

/* ---- lines mode ------------------------------------------------------------------------------------- */

/* Writes s's complete lines (and, with flush_all, the rest as a line). */
static void lines_emit(ts__launcher *L, ts__lstream *s, bool flush_all) {
    size_t start = 0;
    for (;;) {
        size_t avail = s->len - start, end; /* end: one past the line's last byte (without the newline) */
        char *nl = avail ? memchr(s->buf + start, '\n', TS_MIN(avail, (size_t)TS__LAUNCH_LINE_CAP + 1)) : NULL;
        if (nl) end = (size_t)(nl - s->buf);
        else if (avail >= TS__LAUNCH_LINE_CAP) end = start + TS__LAUNCH_LINE_CAP;
        else if (avail && flush_all) end = s->len;
        else break;
        oprefix(L, s);
        oput(L, s->dest, s->buf + start, end - start);
        oput(L, s->dest, "\n", 1);
        start = nl ? end + 1 : end;
    }
    oflush(L, s->dest);
    if (start) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
}

/* ---- terminal mode ---------------------------------------------------------------------------------- */

static void redraw(ts__launcher *L, ts__lstream *s) {
    oprefix(L, s);
    oput(L, s->dest, s->seg, s->seg_len);
    L->shown[s->dest] = s;
}

static void term_put(ts__launcher *L, ts__lstream *s, const char *p, size_t n) {
    const int d = s->dest;
    ts__lstream *other = L->shown[d] != s ? L->shown[d] : NULL;
    if (other) { /* someone else's unfinished line is on screen: out of the way */
        oput(L, d, ERASE_LINE, sizeof ERASE_LINE - 1);
        L->shown[d] = NULL;
    }
    if (s->open_line && L->shown[d] != s) redraw(L, s); /* our own line, erased earlier */
    for (size_t i = 0; i < n;) {
        if (!s->open_line) {
            oprefix(L, s);
            s->open_line = true;
            s->seg_len = 0;
            L->shown[d] = s;
        }
        size_t j = i;
        while (j < n && p[j] != '\n' && p[j] != '\r') j++;
        oput(L, d, p + i, j - i);
        if (j > i && s->seg_len + (j - i) <= TS__LAUNCH_LINE_CAP && reserve(&s->seg, &s->seg_cap, s->seg_len + (j - i))) {
            memcpy(s->seg + s->seg_len, p + i, j - i);
            s->seg_len += j - i;
        }
        if (j == n) break;
        if (p[j] == '\n') {
            oput(L, d, "\n", 1);
            s->open_line = false;
            L->shown[d] = NULL;
        } else { /* '\r': the rank redraws its line; so do we, prefix first */
            oput(L, d, "\r", 1);
            oprefix(L, s);
            s->seg_len = 0;
        }
        i = j + 1;
    }
    if (other && !L->shown[d] && other->open_line) redraw(L, other);
    oflush(L, d);
}

void ts__launch_output_pause(ts__launcher *L) {
    for (int d = 0; d < 2; d++)
        if (L->term[d] && L->shown[d]) write_all(L, d, ERASE_LINE, sizeof ERASE_LINE - 1);
}

void ts__launch_output_resume(ts__launcher *L) {
    for (int d = 0; d < 2; d++)
        if (L->term[d] && L->shown[d]) {
            redraw(L, L->shown[d]);
            oflush(L, d);
        }
}

/* ---- streams ---------------------------------------------------------------------------------------- */

static void log_write(ts__lrank *r, const char *p, size_t n) {
    while (r->log_fd >= 0 && n > 0) {
        ssize_t w = write(r->log_fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (!(w < 0 && errno == EINTR)) {
            close(r->log_fd); /* a full disk: the console still gets everything */
            r->log_fd = -1;
        }
    }
}

void ts__lstream_close(ts__launcher *L, ts__lstream *s) {
    if (s->fd < 0) return;
    if (L->term[s->dest]) {
        if (s->open_line) term_put(L, s, "\n", 1);
    } else {
        lines_emit(L, s, true);
    }
    close(s->fd);
    s->fd = -1;
}

void ts__lstream_read(ts__launcher *L, ts__lrank *r, ts__lstream *s, bool drain) {
    while (s->fd >= 0) {
        ssize_t k = read(s->fd, L->rbuf, TS__LAUNCH_READ_CHUNK);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k <= 0) { /* EOF or a real error */
            ts__lstream_close(L, s);
            return;
        }
        log_write(r, L->rbuf, (size_t)k);
        if (L->term[s->dest]) {
            term_put(L, s, L->rbuf, (size_t)k);
        } else {
            if (!reserve(&s->buf, &s->cap, s->len + (size_t)k)) {
                lines_emit(L, s, true); /* out of memory: out with what we have */
                if (!reserve(&s->buf, &s->cap, s->len + (size_t)k)) {
                    ts__lstream_close(L, s); /* rather than spin on a readable pipe */
                    return;
                }
            }
            memcpy(s->buf + s->len, L->rbuf, (size_t)k);
            s->len += (size_t)k;
            lines_emit(L, s, false);
        }
        if (!drain) return;
    }
}

int ts__launch_open_streams(const ts__launcher *L) {
    int k = 0;
    for (int i = 0; i < L->n; i++) k += (L->ranks[i].out.fd >= 0) + (L->ranks[i].err.fd >= 0);
    return k;
}

/* ---- setup ------------------------------------------------------------------------------------------ */

ts_status ts__launch_output_init(ts__launcher *L) {
    L->rbuf = malloc(TS__LAUNCH_READ_CHUNK);
    if (!L->rbuf) return ts_error(TS_ERR_NOMEM, "ts_launch_run: output buffer");
    if (L->o.output != TS_LAUNCH_PREFIX) return TS_OK;
    struct stat a, b;
    L->merged = fstat(L->o.out_fd, &a) == 0 && fstat(L->o.err_fd, &b) == 0 && a.st_dev == b.st_dev &&
                a.st_ino == b.st_ino && a.st_rdev == b.st_rdev;
    L->term[0] = isatty(L->o.out_fd);
    L->term[1] = isatty(L->o.err_fd);
    return TS_OK;
}

void ts__launch_output_free(ts__launcher *L) {
    for (int i = 0; L->ranks && i < L->o.nproc; i++) {
        ts__lstream *ss[2] = {&L->ranks[i].out, &L->ranks[i].err};
        for (int k = 0; k < 2; k++) {
            free(ss[k]->buf);
            free(ss[k]->seg);
        }
    }
    free(L->obuf);
    free(L->rbuf);
}

/* mkdir -p */
static int make_dirs(const char *path) {
    char p[PATH_MAX];
    if ((size_t)snprintf(p, sizeof p, "%s", path) >= sizeof p) return -1;
    for (char *q = p + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
        *q = '/';
    }
    return mkdir(p, 0777) == 0 || errno == EEXIST ? 0 : -1;
}

void ts__launch_logs_open(ts__launcher *L) {
    if (!L->o.log_dir) return;
    char dir[PATH_MAX], path[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/attempt_%d", L->o.log_dir, L->attempt);
    if (make_dirs(dir) != 0) {
        ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_WARNING), "cannot make the log directory %s: %s", dir,
                         strerror(errno));
        return;
    }
    for (int i = 0; i < L->n; i++) {
        ts__lrank *r = &L->ranks[i];
        snprintf(path, sizeof path, "%s/rank_%d.log", dir, r->rank);
        if (ts__open_output_fd(path, "a rank's log", false, &r->log_fd) != TS_OK) /* never a FIFO or a device */
            ts__launch_event(L, TS__LAUNCH_EV(TS_LAUNCH_EV_WARNING), "%s", ts_last_error());
    }
}

void ts__launch_logs_close(ts__launcher *L) {
    for (int i = 0; L->ranks && i < L->o.nproc; i++) {
        if (L->ranks[i].log_fd >= 0) close(L->ranks[i].log_fd);
        L->ranks[i].log_fd = -1;
    }
}
