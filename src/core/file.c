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
 * may be replaced. ts__write_file_atomic writes a whole file in memory through a
 * temporary file and a rename (the checkpoint writer streams, src/io/ckpt.c).
 */
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
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
    struct stat sb;
    if (stat(path, &sb) != 0) return ts_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return ts_error(TS_ERR_IO, "%s: is a %s, expected %s (only regular files are read)", path,
                        ts__file_type_name((unsigned)sb.st_mode), what);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return ts_error(TS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) { /* replaced between stat and open */
        int e = errno;
        close(fd);
        return ts_error(TS_ERR_IO, "%s: %s, expected %s", path,
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
    if (stat(path, &sb) != 0) return TS_OK; /* nothing there (or unreachable: creating it will say why) */
    if (!S_ISREG(sb.st_mode))
        return ts_error(TS_ERR_IO, "%s: is a %s; refusing to replace it with %s (give the path of a regular file)",
                        path, ts__file_type_name((unsigned)sb.st_mode), what ? what : "a file");
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

ts_status ts__write_file_atomic(const char *path, const char *what, const void *data, size_t n) {
    TS_ARG(path && path[0] && (data || n == 0), "ts__write_file_atomic: NULL argument");
    if (!what) what = "a file";
    TS_TRY(ts__check_write_target(path, what));
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return ts_error(TS_ERR_IO, "%s: path too long to write %s", path, what);
    (void)unlink(tmp); /* ours from an earlier failed attempt */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) return ts_error(TS_ERR_IO, "%s: cannot write %s: creating %s failed: %s", path, what, tmp, strerror(errno));
    const char *p = data;
    size_t left = n;
    int err = 0;
    while (left > 0 && !err) {
        ssize_t k = write(fd, p, left);
        if (k < 0) {
            if (errno != EINTR) err = errno;
        } else {
            p += k;
            left -= (size_t)k;
        }
    }
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        unlink(tmp);
        return ts_error(TS_ERR_IO, "%s: writing %s (through %s) failed: %s", path, what, tmp, strerror(err));
    }
    sync_parent_dir(path);
    return TS_OK;
}
