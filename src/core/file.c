/*
 * core/file.c — opening input files safely, and printable names.
 *
 * Every reader of user-named files (checkpoints, IDX files, images, file lists)
 * opens them through ts__open_regular: the path is stat'ed first, so devices,
 * FIFOs and sockets are refused before anything opens them (open() on a FIFO
 * with no writer blocks forever; opening a device may have side effects), and
 * the open itself uses O_NONBLOCK with an fstat of the descriptor, so a path
 * swapped for a FIFO between the two calls cannot block either. Writers check
 * their target with ts__check_write_target: only a regular file (or nothing)
 * may be replaced. Every output file goes through one writer: ts__atomic_open /
 * ts__atomic_close (a temporary "<path>.tmp.<pid>" beside it, fsync, rename;
 * checkpoints and safetensors stream through it, ts__write_file_atomic writes a
 * buffer, the public ts_outfile_* is what the command uses); files that grow as a
 * run goes (the metrics CSV, the launcher's rank logs) open through
 * ts__open_output_stream (O_NONBLOCK, then fstat: a regular file or nothing).
 */
#include "core/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

const char *ts__file_type_name(unsigned mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "regular file";
    case S_IFDIR: return "directory";
    case S_IFCHR: return "character device";
    case S_IFBLK: return "block device";
    case S_IFIFO: return "FIFO (named pipe)";
    case S_IFSOCK: return "socket";
    case S_IFLNK: return "symbolic link";
    default: return "special file";
    }
}

ts_status ts__open_regular(const char *path, const char *what, int *fd_out, uint64_t *size_out) {
    TS_ARG(path && fd_out, "ts__open_regular: NULL argument");
    *fd_out = -1;
    if (!what) what = "a regular file";
    char esc[TS__PATH_ESC];
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_error(TS_ERR_IO, "%s: cannot open: %s", ts__path(path, esc), strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return ts_error(TS_ERR_IO, "%s: is a %s, expected %s (only regular files are read)", ts__path(path, esc),
                        ts__file_type_name((unsigned)sb.st_mode), what);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return ts_error(TS_ERR_IO, "%s: cannot open: %s", ts__path(path, esc), strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) { /* replaced between stat and open */
        int e = errno;
        close(fd);
        return ts_error(TS_ERR_IO, "%s: %s, expected %s", ts__path(path, esc),
                        e ? strerror(e) : "changed into something other than a regular file", what);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (size_out) *size_out = (uint64_t)sb.st_size;
    return TS_OK;
}

ts_status ts__open_listed_regular(const char *path, const char *what, int *fd_out, uint64_t *size_out) {
    TS_ARG(path && fd_out, "ts__open_listed_regular: NULL argument");
    *fd_out = -1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
        *fd_out = fd;
        if (size_out) *size_out = (uint64_t)sb.st_size;
        return TS_OK;
    }
    if (fd >= 0) close(fd);
    return ts__open_regular(path, what, fd_out, size_out); /* gone, a link now, or not a file: say which */
}

ts_status ts__check_write_target(const char *path, const char *what) {
    struct stat sb;
    char esc[TS__PATH_ESC];
    if (stat(path, &sb) != 0) return TS_OK; /* nothing there (or unreachable: creating it will say why) */
    if (!S_ISREG(sb.st_mode))
        return ts_error(TS_ERR_IO, "%s: is a %s; refusing to replace it with %s (give the path of a regular file)",
                        ts__path(path, esc), ts__file_type_name((unsigned)sb.st_mode), what ? what : "a file");
    return TS_OK;
}

const char *ts__printable(const char *s, char *buf, size_t cap) {
    if (!buf || cap == 0) return "";
    if (!s) s = "(null)";
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        bool plain = c >= 0x20 && c < 0x7f && c != '\\';
        size_t need = plain ? 1 : (c == '\\' ? 2 : 4);
        if (k + need + 4 > cap) { /* room for "..." and the NUL */
            if (k + 4 <= cap) memcpy(buf + k, "...", 3), k += 3;
            break;
        }
        if (plain) {
            buf[k++] = (char)c;
        } else if (c == '\\') {
            buf[k++] = '\\';
            buf[k++] = '\\';
        } else {
            buf[k++] = '\\';
            buf[k++] = 'x';
            buf[k++] = hex[c >> 4];
            buf[k++] = hex[c & 15];
        }
    }
    buf[k] = '\0';
    return buf;
}

ts_status ts_read_file(const char *path, const char *what, uint64_t max_bytes, char **buf, size_t *n) {
    TS_ARG(path && buf && n, "ts_read_file: NULL argument");
    *buf = NULL;
    *n = 0;
    if (!what) what = "a regular file";
    int fd = -1;
    uint64_t size = 0;
    char esc[TS__PATH_ESC];
    ts__printable(path, esc, sizeof esc);
    TS_TRY(ts__open_regular(path, what, &fd, &size));
    if (size > max_bytes || size >= SIZE_MAX) {
        close(fd);
        return ts_error(TS_ERR_FORMAT, "%s: %llu bytes, more than the %llu %s may have", esc, (unsigned long long)size,
                        (unsigned long long)max_bytes, what);
    }
    char *b = ts__malloc((size_t)size + 1);
    if (!b) {
        close(fd);
        return ts_error(TS_ERR_NOMEM, "%s: out of memory for %llu bytes", esc, (unsigned long long)size);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, b + got, (size_t)size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            free(b);
            return ts_error(TS_ERR_IO, "%s: read error: %s", esc, strerror(e));
        }
        if (r == 0) break; /* shrank while reading: what is there */
        got += (size_t)r;
    }
    close(fd);
    b[got] = '\0';
    *buf = b;
    *n = got;
    return TS_OK;
}

/* ---- writing: one set of rules for every output file ------------------------------------------------ */
/* fsyncs the directory holding path (best effort: some filesystems refuse it). */
static void sync_parent_dir(const char *path) {
    char copy[4096];
    if ((size_t)snprintf(copy, sizeof copy, "%s", path) >= sizeof copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* Splits path into its directory and file name (dir and base: 4096 bytes each; no heap, so the best-effort
 * parts of writing cannot fail for memory); false when path is too long. */
static bool split_path(const char *path, char *dir, char *base) {
    char a[4096], b[4096];
    if ((size_t)snprintf(a, sizeof a, "%s", path) >= sizeof a) return false;
    memcpy(b, a, sizeof b);
    snprintf(dir, 4096, "%s", dirname(a));
    snprintf(base, 4096, "%s", basename(b));
    return true;
}

/* Removes "<base>.tmp.<pid>" regular files next to path whose writer is gone (a save killed
 * with SIGKILL cannot clean up): pid is not ours and kill(pid, 0) says no such process. A pid
 * reused by a live process keeps its file (harmless: the next save after it dies removes it). */
static void remove_stale_temps(const char *path) {
    char dir[4096], base[4096], esc[TS__PATH_ESC];
    if (!split_path(path, dir, base)) return;
    size_t bl = strlen(base);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *n = e->d_name;
        if (strncmp(n, base, bl) != 0 || strncmp(n + bl, ".tmp.", 5) != 0) continue;
        const char *digits = n + bl + 5;
        char *end = NULL;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (digits[0] < '1' || digits[0] > '9' || *end || errno || pid <= 0 || pid > INT32_MAX) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        struct stat sb;
        if (fstatat(dirfd(d), n, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (unlinkat(dirfd(d), n, 0) == 0)
            ts_log(TS_LOG_INFO, "removed %s/%s, left by process %ld that died while writing it",
                   ts__printable(dir, esc, sizeof esc), n, pid);
    }
    if (d) closedir(d);
}

static ts_status temp_name(const char *path, char *tmp, size_t cap) {
    if ((size_t)snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid()) >= cap)
        return ts_error(TS_ERR_INVALID_ARG, "%.200s...: path is too long (%zu bytes)", path, strlen(path));
    return TS_OK;
}

/* Creates the temporary file exclusively (never through a symbolic link or into an existing file). */
static int create_temp(const char *tmp) {
    (void)unlink(tmp); /* ours from an earlier failed attempt, or a dead process's with our pid */
    return open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
}

ts_status ts__atomic_open(const char *path, const char *what, char *tmp, size_t cap, FILE **f) {
    TS_ARG(path && path[0] && tmp && f, "ts__atomic_open: NULL argument");
    *f = NULL;
    char esc[TS__PATH_ESC];
    TS_TRY(temp_name(path, tmp, cap));
    TS_TRY(ts__check_write_target(path, what));
    remove_stale_temps(path);
    errno = 0;
    int fd = create_temp(tmp);
    if (fd >= 0 && !(*f = fdopen(fd, "wb"))) {
        int e = errno;
        close(fd);
        unlink(tmp);
        errno = e;
    }
    if (!*f) {
        int e = errno;
        char esc2[TS__PATH_ESC];
        return ts_error(TS_ERR_IO, "%s: cannot create temporary file %s: %s", ts__printable(path, esc, sizeof esc),
                        ts__printable(tmp, esc2, sizeof esc2), strerror(e));
    }
    return TS_OK;
}

ts_status ts__atomic_close(const char *path, const char *tmp, FILE *f, ts_status st, int werr) {
    char esc[TS__PATH_ESC];
    if (st == TS_OK && !werr && fflush(f) != 0) werr = errno ? errno : EIO;
    if (st == TS_OK && !werr && fsync(fileno(f)) != 0) werr = errno;
    int cerr = fclose(f) != 0 ? errno : 0;
    if (!werr && cerr) werr = cerr;
    if (st == TS_OK && werr)
        st = ts_error(TS_ERR_IO, "%s: writing failed: %s", ts__printable(path, esc, sizeof esc), strerror(werr));
    if (st == TS_OK && rename(tmp, path) != 0)
        st = ts_error(TS_ERR_IO, "%s: cannot rename the temporary file into place: %s",
                      ts__printable(path, esc, sizeof esc), strerror(errno));
    if (st != TS_OK) {
        unlink(tmp);
        return st;
    }
    sync_parent_dir(path);
    return TS_OK;
}

ts_status ts__write_file_atomic(const char *path, const char *what, const void *data, size_t n) {
    TS_ARG(path && path[0] && (data || n == 0), "ts__write_file_atomic: NULL argument");
    char tmp[4096];
    FILE *f = NULL;
    TS_TRY(ts__atomic_open(path, what ? what : "a file", tmp, sizeof tmp, &f));
    int werr = n && fwrite(data, 1, n, f) != n ? (errno ? errno : EIO) : 0;
    return ts__atomic_close(path, tmp, f, TS_OK, werr);
}

ts_status ts__open_output_fd(const char *path, const char *what, bool append, int *out) {
    TS_ARG(path && path[0] && out, "ts__open_output_fd: NULL argument");
    *out = -1;
    char esc[TS__PATH_ESC];
    TS_TRY(ts__check_write_target(path, what));
    /* O_NONBLOCK: a FIFO put there since the check fails (ENXIO) instead of waiting for a reader */
    int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (append ? O_APPEND : 0), 0666);
    struct stat sb = {0};
    if (fd < 0) return ts_error(TS_ERR_IO, "%s: cannot write: %s", ts__printable(path, esc, sizeof esc), strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (!append && ftruncate(fd, 0) != 0)) {
        int e = errno;
        bool reg = S_ISREG(sb.st_mode);
        close(fd);
        return ts_error(TS_ERR_IO, "%s: %s%s; refusing to write %s there", ts__printable(path, esc, sizeof esc),
                        reg ? "" : "is a ", reg ? strerror(e) : ts__file_type_name((unsigned)sb.st_mode),
                        what ? what : "a file");
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *out = fd;
    return TS_OK;
}

ts_status ts__open_output_stream(const char *path, const char *what, bool append, FILE **out) {
    TS_ARG(out, "ts__open_output_stream: NULL argument");
    *out = NULL;
    int fd = -1;
    char esc[TS__PATH_ESC];
    TS_TRY(ts__open_output_fd(path, what, append, &fd));
    if (!(*out = fdopen(fd, append ? "a" : "w"))) {
        int e = errno;
        close(fd);
        return ts_error(TS_ERR_IO, "%s: cannot write: %s", ts__printable(path, esc, sizeof esc), strerror(e));
    }
    return TS_OK;
}

/* ---- the public face: tessera/core.h ---------------------------------------------------------------- */
struct ts_outfile {
    FILE *f;
    char path[4096], tmp[4096];
};

ts_status ts_outfile_check(const char *path, const char *what) {
    TS_ARG(path && path[0], "ts_outfile_check: empty path");
    if (!what) what = "a file";
    char tmp[4096], esc[TS__PATH_ESC], esc2[TS__PATH_ESC], dir[4096], base[4096];
    TS_TRY(temp_name(path, tmp, sizeof tmp));
    TS_TRY(ts__check_write_target(path, what));
    if (!split_path(path, dir, base)) return ts_error(TS_ERR_INVALID_ARG, "%.200s...: path is too long", path);
    struct stat sb;
    ts_status st = TS_OK;
    ts__printable(path, esc, sizeof esc);
    if (stat(dir, &sb) != 0)
        st = ts_error(TS_ERR_IO, "%s: cannot save %s there: directory %s: %s", esc, what,
                      ts__printable(dir, esc2, sizeof esc2), strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        st = ts_error(TS_ERR_IO, "%s: cannot save %s there: %s is a %s, not a directory", esc, what,
                      ts__printable(dir, esc2, sizeof esc2), ts__file_type_name((unsigned)sb.st_mode));
    if (st == TS_OK) {
        int fd = create_temp(tmp);
        if (fd < 0)
            st = ts_error(TS_ERR_IO, "%s: cannot save %s there: creating a file in %s failed: %s", esc, what,
                          ts__printable(dir, esc2, sizeof esc2), strerror(errno));
        else {
            close(fd);
            unlink(tmp);
        }
    }
    return st;
}

ts_status ts_outfile_open(const char *path, const char *what, ts_outfile **out) {
    TS_ARG(path && path[0] && out, "ts_outfile_open: NULL argument");
    *out = NULL;
    ts_outfile *o = ts__calloc(1, sizeof *o);
    if (!o) return TS_ERR_NOMEM;
    if ((size_t)snprintf(o->path, sizeof o->path, "%s", path) >= sizeof o->path) {
        free(o);
        return ts_error(TS_ERR_INVALID_ARG, "%.200s...: path is too long (%zu bytes)", path, strlen(path));
    }
    ts_status st = ts__atomic_open(path, what ? what : "a file", o->tmp, sizeof o->tmp, &o->f);
    if (st != TS_OK) {
        free(o);
        return st;
    }
    *out = o;
    return TS_OK;
}

FILE *ts_outfile_stream(ts_outfile *o) { return o ? o->f : NULL; }

ts_status ts_outfile_close(ts_outfile *o) {
    TS_ARG(o, "ts_outfile_close: NULL file");
    int werr = ferror(o->f) ? (errno ? errno : EIO) : 0;
    ts_status st = ts__atomic_close(o->path, o->tmp, o->f, TS_OK, werr);
    free(o);
    return st;
}

void ts_outfile_discard(ts_outfile *o) {
    if (!o) return;
    fclose(o->f);
    unlink(o->tmp);
    free(o);
}

ts_status ts_write_file(const char *path, const char *what, const void *data, size_t n) {
    return ts__write_file_atomic(path, what, data, n);
}
