/* The job token: SHA-256 and HMAC-SHA256 (libcrypto) against FIPS 180-4 and RFC 4231, the
 * TCP store's handshake (wrong, missing and stranger tokens refused with clear
 * errors and logged addresses), the server's limits (oversized values and
 * floods of bytes dropped without growing its memory, connection floods that
 * neither lock genuine clients out nor spin the CPU, EMFILE backing off,
 * unauthenticated connections reaped), the TCP transport's handshake (strangers
 * at a data listener refused, a rank never talking to a listener that cannot
 * prove the token), its listening address (never 0.0.0.0, TS_SOCKET_IFNAME),
 * and whole jobs over TCP with strangers knocking, as threads and processes; without a token,
 * peers of other hosts refused (the handshake's rule; tests/cli_hosts.sh runs it across hosts).
 * 127.0.0.1 only. CPU and memory bounds are generous: they catch a busy loop or
 * unbounded buffering, they are not benchmarks. */
#include "test_util.h"

#include "core/crypto.h"
#include "distributed/auth.h"
#include "distributed/builtin/transport.h"
#include "distributed/store.h"
#include "tessera/dist.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOKEN_A "0f4c6a1d2e3b59687a9b0c1d2e3f405162738495a6b7c8d9eafb0c1d2e3f4051"
#define TOKEN_B "not-the-job-token-at-all"

/* ---- helpers -------------------------------------------------------------------------------------- */

static void unhex(const char *h, uint8_t *out, size_t *n) {
    *n = strlen(h) / 2;
    for (size_t i = 0; i < *n; i++) {
        unsigned v = 0;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
}

static bool digest_is(const uint8_t *d, size_t n, const char *want_hex) {
    char got[2 * TS__SHA256_BYTES + 1];
    ts__hex(d, n, got);
    if (strcmp(got, want_hex) == 0) return true;
    fprintf(stderr, "digest %s, expected %s\n", got, want_hex);
    return false;
}

/* Log lines captured from any thread (the store's server logs from its own). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[32768];
static size_t log_len;

static void log_sink(ts_log_level level, const char *msg, void *user) {
    TS_UNUSED(user);
    pthread_mutex_lock(&log_mu);
    if (level >= TS_LOG_WARN && log_len < sizeof log_buf - 1)
        log_len += (size_t)snprintf(log_buf + log_len, sizeof log_buf - log_len, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static void log_capture(void) {
    pthread_mutex_lock(&log_mu);
    log_len = 0;
    log_buf[0] = 0;
    pthread_mutex_unlock(&log_mu);
    ts_log_set_sink(log_sink, NULL);
}

/* Whether one logged line holds n1 and n2; `report` prints the log when none does. */
static bool logged_line(const char *n1, const char *n2, bool report) {
    pthread_mutex_lock(&log_mu);
    bool hit = false;
    for (char *line = log_buf; *line && !hit;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        hit = strstr(line, n1) && (!n2 || strstr(line, n2));
        if (nl) *nl = '\n';
        line = nl ? nl + 1 : line + strlen(line);
    }
    pthread_mutex_unlock(&log_mu);
    if (!hit && report) fprintf(stderr, "no log line with '%s' and '%s' in:\n%s", n1, n2 ? n2 : "", log_buf);
    return hit;
}

static bool logged(const char *n1, const char *n2) { return logged_line(n1, n2, true); }

/* Waits until a line with n1 and n2 is logged (the server thread logs asynchronously). */
static bool logged_soon(const char *n1, const char *n2) {
    for (int i = 0; i < 500; i++) { /* one line with both: another line may hold one of them already */
        if (logged_line(n1, n2, false)) return true;
        usleep(10000);
    }
    return logged(n1, n2);
}

static ts_store_tcp_options opts_token(const char *token) {
    ts_store_tcp_options o = TS_STORE_TCP_OPTIONS_INIT;
    o.token = token;
    return o;
}

/* A blocking TCP connection to 127.0.0.1:port with 5 s receive/send timeouts. */
static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool read_full(int fd, void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = recv(fd, (char *)buf + done, n - done, 0);
        if (r <= 0) return false;
        done += (size_t)r;
    }
    return true;
}

static bool write_full(int fd, const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = send(fd, (const char *)buf + done, n - done, MSG_NOSIGNAL);
        if (r <= 0) return false;
        done += (size_t)r;
    }
    return true;
}

/* The client side of a handshake done by hand (token NULL: none). Returns the verdict as the
 * client sees it (TS__AUTH_OK only with a valid server proof), or -1 when the connection closed
 * or timed out first. */
static int raw_handshake(int fd, const char *token, int kind, uint32_t f1, uint32_t f2) {
    ts__auth a;
    if (ts__auth_init(&a, token ? token : "", "test") != TS_OK) return -2;
    uint8_t ch[TS__AUTH_CHALLENGE_BYTES], resp[TS__AUTH_RESPONSE_BYTES], v[TS__AUTH_VERDICT_BYTES];
    uint32_t s1, s2;
    if (!read_full(fd, ch, sizeof ch)) return -1;
    if (ts__auth_respond(&a, kind, ch, f1, f2, &s1, &s2, resp) != TS__AUTH_OK) return -3;
    if (!write_full(fd, resp, sizeof resp) || !read_full(fd, v, sizeof v)) return -1;
    return ts__auth_accepted(&a, ch, resp, v);
}

/* Whether the peer closes fd within a few seconds (EOF or reset; nothing else arrives). */
static bool closed_by_peer(int fd) {
    char b[64];
    ssize_t r = recv(fd, b, sizeof b, 0);
    return r == 0 || (r < 0 && errno == ECONNRESET);
}

/* A frame as the store's clients send it: u32 length | op | str key (| str value). */
static size_t frame(uint8_t *p, uint8_t op, const char *key, uint32_t body_len_override) {
    size_t kl = strlen(key), n = 1 + 4 + kl;
    uint32_t bl = body_len_override ? body_len_override : (uint32_t)n;
    p[0] = (uint8_t)(bl >> 24), p[1] = (uint8_t)(bl >> 16), p[2] = (uint8_t)(bl >> 8), p[3] = (uint8_t)bl;
    p[4] = op;
    p[5] = 0, p[6] = 0, p[7] = (uint8_t)(kl >> 8), p[8] = (uint8_t)kl;
    memcpy(p + 9, key, kl);
    return 4 + n;
}

/* ---- a store server in a child process (its CPU time and memory can be read from /proc) ---------- */

typedef struct child_srv {
    pid_t pid;
    int port;
    int stop_w; /* closing it stops the child */
} child_srv;

static bool start_child(const ts_store_tcp_options *o, rlim_t nofile, child_srv *c) {
    int pp[2], sp[2];
    if (pipe(pp) != 0 || pipe(sp) != 0) return false;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(pp[0]);
        close(sp[1]);
        ts_log_set_level(getenv("TEST_CHILD_LOG") ? TS_LOG_DEBUG : TS_LOG_ERROR); /* refusals are expected here */
        if (nofile) {
            struct rlimit rl;
            getrlimit(RLIMIT_NOFILE, &rl);
            rl.rlim_cur = nofile;
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(3);
        }
        ts_store *s = NULL;
        if (ts_store_tcp_new_ex("127.0.0.1", 0, true, 30, o, &s) != TS_OK) {
            fprintf(stderr, "child server: %s\n", ts_last_error());
            _exit(2);
        }
        int port = ts_store_tcp_port(s);
        if (write(pp[1], &port, sizeof port) != (ssize_t)sizeof port) _exit(4);
        char b;
        while (read(sp[0], &b, 1) < 0 && errno == EINTR) {
        }
        ts_store_release(s);
        _exit(0);
    }
    close(pp[1]);
    close(sp[0]);
    c->pid = pid;
    c->stop_w = sp[1];
    bool ok = read(pp[0], &c->port, sizeof c->port) == (ssize_t)sizeof c->port;
    close(pp[0]);
    return ok;
}

static int stop_child(child_srv *c) {
    close(c->stop_w);
    int status = 0;
    for (int i = 0; i < 1000; i++) {
        if (waitpid(c->pid, &status, WNOHANG) == c->pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        usleep(10000);
    }
    kill(c->pid, SIGKILL);
    waitpid(c->pid, &status, 0);
    return -1;
}

/* The child's CPU time (user + system) in seconds. */
static double cpu_s(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* fields after the command name: state is field 3 */
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* A field of /proc/pid/status in MiB (VmRSS, VmHWM). */
static double status_mib(pid_t pid, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    double v = -1;
    size_t fl = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, fl) == 0 && line[fl] == ':') v = atof(line + fl + 1) / 1024.0;
    fclose(f);
    return v;
}

/* ---- the primitives ----------------------------------------------------------------------------- */

static void test_sha256_fips180(void) {
    uint8_t d[32];
    CHECK_OK(ts__sha256_hash("abc", 3, d));
    CHECK(digest_is(d, 32, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    CHECK_OK(ts__sha256_hash(two, strlen(two), d));
    CHECK(digest_is(d, 32, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    CHECK_OK(ts__sha256_hash("", 0, d));
    CHECK(digest_is(d, 32, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    /* one million 'a', fed in uneven pieces (exercises the partial-block path) */
    ts__sha256 c;
    CHECK_OK(ts__sha256_init(&c));
    char as[1000];
    memset(as, 'a', sizeof as);
    size_t left = 1000000, step = 1;
    while (left) {
        size_t k = TS_MIN(left, step);
        ts__sha256_update(&c, as, k);
        left -= k;
        step = step % 987 + 13; /* 13 .. 999 bytes */
    }
    CHECK_OK(ts__sha256_final(&c, d));
    CHECK(digest_is(d, 32, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
    /* padding edge cases: 55, 56 and 64 bytes of 'a' (digests from Python's hashlib) */
    static const char *const want[3] = {"9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318",
                                        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a",
                                        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"};
    const size_t lens[3] = {55, 56, 64};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(ts__sha256_hash(as, lens[i], d));
        CHECK(digest_is(d, 32, want[i]));
    }
}

static void test_hmac_rfc4231(void) {
    static const struct {
        const char *key_hex, *data, *data_hex, *mac;
        size_t trunc;
    } cases[] = {
        {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "Hi There", NULL,
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", 32},
        {"4a656665", "what do ya want for nothing?", NULL,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 32},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", NULL,
         "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe", 32},
        {"0102030405060708090a0b0c0d0e0f10111213141516171819", NULL,
         "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd",
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b", 32},
        {"0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c", "Test With Truncation", NULL, "a3b6167473100ee06e0c796c2955552b",
         16},
        {NULL, "Test Using Larger Than Block-Size Key - Hash Key First", NULL,
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", 32},
        {NULL,
         "This is a test using a larger than block-size key and a larger than block-size data. The key needs to "
         "be hashed before being used by the HMAC algorithm.",
         NULL, "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", 32},
    };
    for (size_t i = 0; i < TS_ARRAY_LEN(cases); i++) {
        uint8_t key[200], data[200], mac[32];
        size_t kl, dl;
        if (cases[i].key_hex) {
            unhex(cases[i].key_hex, key, &kl);
        } else { /* cases 6 and 7: 131 bytes of 0xaa */
            kl = 131;
            memset(key, 0xaa, kl);
        }
        if (cases[i].data) {
            dl = strlen(cases[i].data);
            memcpy(data, cases[i].data, dl);
        } else {
            unhex(cases[i].data_hex, data, &dl);
        }
        const void *parts[1] = {data};
        CHECK_OK(ts__hmac_sha256(key, kl, 1, parts, &dl, mac));
        fprintf(stderr, "  RFC 4231 case %zu\n", i + 1);
        CHECK(digest_is(mac, cases[i].trunc, cases[i].mac));
        /* the same message in three parts */
        const void *p3[3] = {data, data + dl / 3, data + 2 * dl / 3};
        size_t l3[3] = {dl / 3, 2 * dl / 3 - dl / 3, dl - 2 * dl / 3};
        uint8_t mac3[32];
        CHECK_OK(ts__hmac_sha256(key, kl, 3, p3, l3, mac3));
        CHECK(memcmp(mac, mac3, 32) == 0);
    }
    uint8_t a[32] = {1, 2, 3}, b[32] = {1, 2, 3};
    CHECK(ts__ct_equal(a, b, 32) == 1);
    b[31] ^= 0x80;
    CHECK(ts__ct_equal(a, b, 32) == 0);
    /* an empty key and an empty message (HMAC through libcrypto takes both) */
    uint8_t e[32];
    const void *none[1] = {""};
    const size_t zero[1] = {0};
    CHECK_OK(ts__hmac_sha256("", 0, 1, none, zero, e));
    CHECK(digest_is(e, 32, "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"));
    char t1[TS_JOB_TOKEN_CHARS + 1], t2[TS_JOB_TOKEN_CHARS + 1];
    CHECK_OK(ts_job_token_new(t1));
    CHECK_OK(ts_job_token_new(t2));
    CHECK(strlen(t1) == 64 && strspn(t1, "0123456789abcdef") == 64 && strcmp(t1, t2) != 0);
}

/* ---- the TCP store ---------------------------------------------------------------------------------- */

static void test_store_tokens(void) {
    log_capture();
    ts_store *srv = NULL, *cli = NULL;
    ts_store_tcp_options o = opts_token(TOKEN_A);
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", 0, true, 10, &o, &srv));
    if (!srv) return;
    int port = ts_store_tcp_port(srv);
    char hp[32];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", port);
    CHECK_OK(ts_store_set(srv, "secret", "s3", 2));

    /* the right token: everything works */
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", port, false, 10, &o, &cli));
    if (cli) {
        int64_t v = 0;
        CHECK_OK(ts_store_add(cli, "n", 5, &v));
        CHECK(v == 5);
        void *val = NULL;
        size_t len = 0;
        CHECK_OK(ts_store_get(cli, "secret", &val, &len));
        CHECK(len == 2 && memcmp(val, "s3", 2) == 0);
        free(val);
        ts_store_release(cli);
        cli = NULL;
    }
    /* from the environment */
    setenv("TS_JOB_TOKEN", TOKEN_A, 1);
    CHECK_OK(ts_store_tcp_new("127.0.0.1", port, false, 10, &cli));
    ts_store_release(cli);
    cli = NULL;
    unsetenv("TS_JOB_TOKEN");

    /* a wrong token: refused at once (no waiting for the timeout), the error says why and where */
    ts_store_tcp_options bad = opts_token(TOKEN_B);
    double t0 = ts_time_now();
    CHECK_STATUS(ts_store_tcp_new_ex("127.0.0.1", port, false, 10, &bad, &cli), TS_ERR_REMOTE);
    CHECK(ts_time_now() - t0 < 5);
    CHECK_ERR_MENTIONS(hp);
    CHECK_ERR_MENTIONS("wrong job token");
    CHECK(cli == NULL);
    CHECK(logged_soon("refused a connection from 127.0.0.1:", "wrong job token"));
    CHECK(logged(hp, NULL));
    /* no token at all */
    ts_store_tcp_options none = opts_token("");
    CHECK_STATUS(ts_store_tcp_new_ex("127.0.0.1", port, false, 10, &none, &cli), TS_ERR_REMOTE);
    CHECK_ERR_MENTIONS("requires a job token");
    CHECK_ERR_MENTIONS("TS_JOB_TOKEN");
    CHECK(logged_soon("refused a connection from 127.0.0.1:", "no job token"));

    /* a stranger speaking the old protocol straight away: SET and GET frames instead of an answer */
    int fd = raw_connect(port);
    CHECK(fd >= 0);
    uint8_t buf[256];
    size_t n = frame(buf, 1 /* SET */, "secret", 0);
    buf[n++] = 0, buf[n++] = 0, buf[n++] = 0, buf[n++] = 2, buf[n++] = 'x', buf[n++] = 'x';
    buf[3] += 6; /* the value's bytes */
    for (int i = 0; i < 4; i++) n += frame(buf + n, 2 /* GET */, "secret", 0); /* 81 bytes in all */
    CHECK(n > TS__AUTH_RESPONSE_BYTES && write_full(fd, buf, n));
    uint8_t ch[TS__AUTH_CHALLENGE_BYTES + TS__AUTH_VERDICT_BYTES];
    CHECK(read_full(fd, ch, TS__AUTH_CHALLENGE_BYTES) && memcmp(ch, "TSA1", 4) == 0);
    /* whatever comes back is a refusal, never a value */
    ssize_t r = recv(fd, ch, sizeof ch, 0);
    CHECK(r <= 0 || (r == TS__AUTH_VERDICT_BYTES && ch[0] != TS__AUTH_OK));
    close(fd);
    /* a stranger with the protocol right and the token wrong gets a refusal verdict */
    fd = raw_connect(port);
    CHECK(raw_handshake(fd, TOKEN_B, TS__AUTH_STORE, 0, 0) == TS__AUTH_BAD_TOKEN);
    CHECK(closed_by_peer(fd));
    close(fd);
    /* and the right token works by hand too */
    fd = raw_connect(port);
    CHECK(raw_handshake(fd, TOKEN_A, TS__AUTH_STORE, 0, 0) == TS__AUTH_OK);
    close(fd);
    CHECK(logged_soon("refused a connection from 127.0.0.1:", "more than a handshake answer"));
    /* nothing the strangers sent arrived */
    void *val = NULL;
    size_t len = 0;
    CHECK_OK(ts_store_get(srv, "secret", &val, &len));
    CHECK(len == 2 && memcmp(val, "s3", 2) == 0);
    free(val);
    ts_store_release(srv);

    /* a server without a token and a client with one: the client will not trust it */
    ts_store *open_srv = NULL;
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", 0, true, 10, &none, &open_srv));
    if (open_srv) {
        CHECK_STATUS(ts_store_tcp_new_ex("127.0.0.1", ts_store_tcp_port(open_srv), false, 10, &o, &cli),
                     TS_ERR_REMOTE);
        CHECK_ERR_MENTIONS("without a job token");
        ts_store_release(open_srv);
    }
    ts_log_set_sink(NULL, NULL);
}

/* A client impersonating nobody: a stranger's server that accepts any answer and sends a forged
 * verdict. The client must refuse it and send it no request. */
typedef struct fake_server {
    int lfd, port;
    int kind;          /* the handshake kind it speaks */
    uint32_t f1, f2;   /* its challenge's fields */
    size_t received;   /* bytes it got after the challenge */
} fake_server;

static void *fake_server_main(void *arg) {
    fake_server *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ts__auth a;
    ts__auth_init(&a, TOKEN_B, "fake");
    uint8_t ch[TS__AUTH_CHALLENGE_BYTES], v[TS__AUTH_VERDICT_BYTES] = {0}, buf[4096];
    ts__auth_challenge(&a, f->kind, f->f1, f->f2, ch);
    write_full(fd, ch, sizeof ch);
    /* read the answer, then claim success with a made-up proof */
    size_t got = 0;
    while (got < TS__AUTH_RESPONSE_BYTES) {
        ssize_t r = recv(fd, buf, TS__AUTH_RESPONSE_BYTES - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
    }
    memset(v + 4, 0x5a, 32);
    write_full(fd, v, sizeof v);
    for (;;) { /* count anything else the client sends before closing */
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) break;
        f->received += (size_t)r;
    }
    close(fd);
    return NULL;
}

static bool fake_start(fake_server *f, pthread_t *th) {
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    if (bind(f->lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(f->lfd, 4) != 0 ||
        getsockname(f->lfd, (struct sockaddr *)&a, &l) != 0)
        return false;
    f->port = ntohs(a.sin_port);
    return pthread_create(th, NULL, fake_server_main, f) == 0;
}

/* Under Open MPI's mpirun without TS_JOB_TOKEN: a token derived from the random per-job key mpirun gives
 * every process; another job's key, or no token, is refused; TS_JOB_TOKEN wins; job ids are not keys. */
static void test_mpirun_token(void) {
    const char *key_var = "OMPI_MCA_orte_precondition_transports";
    unsetenv("TS_JOB_TOKEN");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv(key_var, "7b0d3b66322b721b-732eb6421471e8a9", 1);
    ts__auth a;
    CHECK_OK(ts__auth_init(&a, NULL, "test"));
    /* HMAC-SHA256(key, label) in hex (Python's hmac module) */
    const char *want = "314e85eab6c53f67ce34df8f931349172a0ddbcf1d26e786d149bcdbb146cda3";
    CHECK(a.has_token && a.keylen == 64 && memcmp(a.key, want, 64) == 0);
    ts__auth_wipe(&a);
    ts_store *srv = NULL, *cli = NULL;
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", 0, true, 10, NULL, &srv));
    if (srv) {
        int port = ts_store_tcp_port(srv);
        CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", port, false, 10, NULL, &cli)); /* the same job */
        ts_store_release(cli);
        cli = NULL;
        ts_store_tcp_options none = opts_token("");
        CHECK_STATUS(ts_store_tcp_new_ex("127.0.0.1", port, false, 5, &none, &cli), TS_ERR_REMOTE);
        CHECK_ERR_MENTIONS("requires a job token");
        setenv(key_var, "0123456789abcdef-0123456789abcdef", 1); /* another mpirun's job */
        CHECK_STATUS(ts_store_tcp_new_ex("127.0.0.1", port, false, 5, NULL, &cli), TS_ERR_REMOTE);
        CHECK_ERR_MENTIONS("wrong job token");
        ts_store_release(srv);
    }
    setenv("TS_JOB_TOKEN", TOKEN_A, 1); /* an explicit token wins */
    CHECK_OK(ts__auth_init(&a, NULL, "test"));
    CHECK(a.keylen == strlen(TOKEN_A) && memcmp(a.key, TOKEN_A, a.keylen) == 0);
    unsetenv("TS_JOB_TOKEN");
    unsetenv("OMPI_COMM_WORLD_SIZE"); /* not an mpirun rank: the key alone is not used */
    CHECK_OK(ts__auth_init(&a, NULL, "test"));
    CHECK(!a.has_token);
    unsetenv(key_var);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("SLURM_JOB_ID", "4242", 1); /* job ids are not secrets: no token from them */
    setenv("TORCHELASTIC_RUN_ID", "run-1", 1);
    CHECK_OK(ts__auth_init(&a, NULL, "test"));
    CHECK(!a.has_token);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("SLURM_JOB_ID");
    unsetenv("TORCHELASTIC_RUN_ID");
}

/* Without a token a server takes peers of its own host only: loopback, or the address the peer
 * reached it on (a local connection's source); another host's peer gets TS__AUTH_REMOTE_NO_TOKEN,
 * which the client reads as that refusal (not as a malformed answer) — unless
 * TS_ALLOW_UNAUTHENTICATED is set. A token makes the host irrelevant. */
static struct sockaddr_in v4(const char *ip) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(4242)};
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

static struct sockaddr_in6 v6(const char *ip) {
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(4242)};
    inet_pton(AF_INET6, ip, &a.sin6_addr);
    return a;
}

static int handshake_verdict(const char *token, bool peer_local, int *client_sees) {
    ts__auth srv, cli;
    if (ts__auth_init(&srv, token, "test server") != TS_OK || ts__auth_init(&cli, token, "test client") != TS_OK)
        return -2;
    uint8_t ch[TS__AUTH_CHALLENGE_BYTES], resp[TS__AUTH_RESPONSE_BYTES], v[TS__AUTH_VERDICT_BYTES];
    uint32_t a, b;
    if (ts__auth_challenge(&srv, TS__AUTH_STORE, 1, 2, ch) != TS_OK) return -2;
    if (ts__auth_respond(&cli, TS__AUTH_STORE, ch, 1, 2, &a, &b, resp) != TS__AUTH_OK) return -3;
    int code = ts__auth_verdict(&srv, ts__auth_check(&srv, TS__AUTH_STORE, ch, resp, peer_local, &a, &b), ch, resp, v);
    *client_sees = ts__auth_accepted(&cli, ch, resp, v);
    return code;
}

static void test_remote_needs_token(void) {
    struct sockaddr_in lo = v4("127.0.0.1"), lo2 = v4("127.3.4.5"), me = v4("10.1.2.3"), other = v4("10.1.2.4");
    struct sockaddr_in6 lo6 = v6("::1"), mapped = v6("::ffff:127.0.0.9"), me6 = v6("fd00::1"), other6 = v6("fd00::2");
    const struct sockaddr *L = (const struct sockaddr *)&lo, *M = (const struct sockaddr *)&me;
    CHECK(ts__addr_is_local((const struct sockaddr *)&lo2, M));    /* any of 127/8 */
    CHECK(ts__addr_is_local(L, M));
    CHECK(ts__addr_is_local((const struct sockaddr *)&lo6, M));
    CHECK(ts__addr_is_local((const struct sockaddr *)&mapped, (const struct sockaddr *)&me6));
    CHECK(ts__addr_is_local(M, M));                                /* a local connection to 10.1.2.3 */
    CHECK(!ts__addr_is_local((const struct sockaddr *)&other, M)); /* another host */
    CHECK(!ts__addr_is_local((const struct sockaddr *)&other, L));
    CHECK(ts__addr_is_local((const struct sockaddr *)&me6, (const struct sockaddr *)&me6));
    CHECK(!ts__addr_is_local((const struct sockaddr *)&other6, (const struct sockaddr *)&me6));
    CHECK(!ts__addr_is_local((const struct sockaddr *)&me6, M)); /* families differ, neither loopback */

    int seen = -9;
    unsetenv("TS_ALLOW_UNAUTHENTICATED");
    CHECK(handshake_verdict("", true, &seen) == TS__AUTH_OK);
    CHECK(seen == TS__AUTH_OK);
    CHECK(handshake_verdict("", false, &seen) == TS__AUTH_REMOTE_NO_TOKEN);
    CHECK(seen == TS__AUTH_REMOTE_NO_TOKEN);
    CHECK(strstr(ts__auth_client_reason(seen), "accepts no other host") != NULL);
    CHECK(strstr(ts__auth_server_reason(TS__AUTH_REMOTE_NO_TOKEN), "another host") != NULL);
    CHECK(handshake_verdict(TOKEN_A, false, &seen) == TS__AUTH_OK); /* a token: any host */
    CHECK(seen == TS__AUTH_OK);
    setenv("TS_ALLOW_UNAUTHENTICATED", "1", 1);
    CHECK(handshake_verdict("", false, &seen) == TS__AUTH_OK);
    CHECK(seen == TS__AUTH_OK);
    unsetenv("TS_ALLOW_UNAUTHENTICATED");
}

static void test_store_stranger_server(void) {
    fake_server f = {.kind = TS__AUTH_STORE, .f1 = 1 << 16, .f2 = 1 << 20};
    pthread_t th;
    if (!fake_start(&f, &th)) {
        CHECK(false);
        return;
    }
    ts_store *cli = NULL;
    ts_store_tcp_options o = opts_token(TOKEN_A);
    CHECK_STATUS(ts_store_tcp_new_ex("127.0.0.1", f.port, false, 5, &o, &cli), TS_ERR_REMOTE);
    CHECK_ERR_MENTIONS("could not prove it knows the job token");
    pthread_join(th, NULL);
    close(f.lfd);
    CHECK(f.received == 0); /* not one byte of a request */
}

/* Oversized values and floods of bytes: dropped, the server's memory stays near the limit. */
static void test_store_size_limits(void) {
    ts_store_tcp_options o = opts_token(TOKEN_A);
    o.max_value_bytes = 1 << 20;
    o.max_key_bytes = 1024;
    child_srv c;
    if (!start_child(&o, 0, &c)) {
        CHECK(false);
        return;
    }
    double base = status_mib(c.pid, "VmHWM");
    size_t chunk_n = 1 << 20;
    char *chunk = calloc(1, chunk_n);

    /* (a) a frame announced at 1.5 GiB: dropped on its header */
    int fd = raw_connect(c.port);
    CHECK(raw_handshake(fd, TOKEN_A, TS__AUTH_STORE, 0, 0) == TS__AUTH_OK);
    uint8_t hdr[64];
    size_t hn = frame(hdr, 1, "big", 1536u << 20);
    size_t sent = 0;
    bool ok = write_full(fd, hdr, hn);
    while (ok && sent < ((size_t)256 << 20)) {
        ok = write_full(fd, chunk, chunk_n);
        if (ok) sent += chunk_n;
    }
    fprintf(stderr, "  1.5 GiB frame: the server dropped the client after %zu MiB were sent\n", sent >> 20);
    CHECK(!ok && sent < ((size_t)64 << 20));
    close(fd);

    /* (b) a parked GET followed by a flood (the report's 1.5 GiB attack, 256 MiB here) */
    fd = raw_connect(c.port);
    CHECK(raw_handshake(fd, TOKEN_A, TS__AUTH_STORE, 0, 0) == TS__AUTH_OK);
    hn = frame(hdr, 2, "never-set", 0);
    ok = write_full(fd, hdr, hn);
    sent = 0;
    while (ok && sent < ((size_t)256 << 20)) {
        ok = write_full(fd, chunk, chunk_n);
        if (ok) sent += chunk_n;
    }
    fprintf(stderr, "  parked GET + flood: dropped after %zu MiB were sent\n", sent >> 20);
    CHECK(!ok && sent < ((size_t)64 << 20));
    close(fd);

    /* (c) through the API: the client knows the server's limits and refuses before sending */
    ts_store *cli = NULL;
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", c.port, false, 10, &o, &cli));
    if (cli) {
        char *big = calloc(1, (2u << 20));
        CHECK_STATUS(ts_store_set(cli, "v", big, 2u << 20), TS_ERR_INVALID_ARG);
        CHECK_ERR_MENTIONS("over the server's limit of 1048576 bytes");
        CHECK_OK(ts_store_set(cli, "v", big, 1u << 19)); /* half the limit is fine */
        char key[2000];
        memset(key, 'k', sizeof key - 1);
        key[sizeof key - 1] = 0;
        CHECK_STATUS(ts_store_set(cli, key, "x", 1), TS_ERR_INVALID_ARG);
        CHECK_ERR_MENTIONS("server's limit of 1024");
        void *v = NULL;
        size_t vl = 0;
        CHECK_OK(ts_store_get(cli, "v", &v, &vl));
        CHECK(vl == (1u << 19));
        free(v);
        free(big);
        ts_store_release(cli);
    }
    double peak = status_mib(c.pid, "VmHWM");
    fprintf(stderr, "  server peak memory: %.1f MiB before, %.1f MiB after 2 x 256 MiB offered (limit 1 MiB)\n",
            base, peak);
    CHECK(base > 0 && peak - base < 48);
    CHECK(stop_child(&c) == 0);
    free(chunk);
}

/* Holds `n` connections that never answer the challenge. */
static int hold_idle(int port, int n, int *fds) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        fds[i] = raw_connect(port);
        k += fds[i] >= 0;
    }
    return k;
}

static void *genuine_client(void *arg) {
    int port = *(int *)arg;
    ts_store_tcp_options o = opts_token(TOKEN_A);
    ts_store *s = NULL;
    ts_status st = ts_store_tcp_new_ex("127.0.0.1", port, false, 20, &o, &s);
    int64_t v = 0;
    if (st == TS_OK) st = ts_store_add(s, "joined", 1, &v);
    if (st != TS_OK) fprintf(stderr, "genuine client: %s\n", ts_last_error());
    ts_store_release(s);
    return (void *)(intptr_t)(st == TS_OK);
}

/* A flood of idle connections at the connection cap: genuine clients still get in, and the
 * server does not spin. */
static void test_store_connection_flood(void) {
    ts_store_tcp_options o = opts_token(TOKEN_A);
    o.max_connections = 8;
    o.auth_timeout_s = 60; /* the flood is not reaped during the test: eviction must do it */
    child_srv c;
    if (!start_child(&o, 0, &c)) {
        CHECK(false);
        return;
    }
    int fds[200];
    int held = hold_idle(c.port, 200, fds);
    CHECK(held == 200);
    usleep(300 * 1000); /* the server works through the backlog */
    double c0 = cpu_s(c.pid), t0 = ts_time_now();
    usleep(1000 * 1000);
    double cpu = cpu_s(c.pid) - c0, wall = ts_time_now() - t0;
    fprintf(stderr, "  200 idle connections at a cap of 8: server CPU %.3f s over %.2f s\n", cpu, wall);
    CHECK(cpu >= 0 && cpu < 0.25 * wall);
    /* three genuine ranks join while the flood holds its connections */
    pthread_t th[3];
    int port = c.port;
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, genuine_client, &port);
    int joined = 0;
    for (int i = 0; i < 3; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        joined += (int)(intptr_t)r;
    }
    CHECK(joined == 3);
    /* the flood's connections were closed by the server, not left to pile up */
    int closed = 0;
    for (int i = 0; i < 200; i++) {
        struct pollfd p = {fds[i], POLLIN, 0};
        if (poll(&p, 1, 0) == 1) {
            char b[64];
            ssize_t r = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
            if (r == 48) r = recv(fds[i], b, sizeof b, MSG_DONTWAIT); /* a challenge, then EOF */
            closed += r == 0 || (r < 0 && errno == ECONNRESET);
        }
        close(fds[i]);
    }
    fprintf(stderr, "  %d of 200 idle connections evicted\n", closed);
    CHECK(closed >= 200 - 8);
    CHECK(stop_child(&c) == 0);
}

/* An insider (it has the token) storing value after value: refused past the per-connection and
 * total limits with an error naming them; the client stays connected and the server keeps serving. */
static void test_store_byte_caps(void) {
    ts_store_tcp_options o = opts_token(TOKEN_A);
    o.max_value_bytes = 1 << 20;
    o.max_conn_bytes = 2u << 20;
    o.max_total_bytes = 3u << 20;
    child_srv c;
    if (!start_child(&o, 0, &c)) {
        CHECK(false);
        return;
    }
    double base = status_mib(c.pid, "VmHWM");
    size_t vn = 900u << 10;
    char *v = calloc(1, vn);
    ts_store *a = NULL, *b = NULL;
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", c.port, false, 10, &o, &a));
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", c.port, false, 10, &o, &b));
    if (a && b) {
        CHECK_OK(ts_store_set(a, "a0", v, vn));
        CHECK_OK(ts_store_set(a, "a1", v, vn));
        CHECK_STATUS(ts_store_set(a, "a2", v, vn), TS_ERR_INVALID_ARG);
        CHECK_ERR_MENTIONS("past its limit of 2097152 stored bytes (ts_store_tcp_options.max_conn_bytes");
        CHECK_OK(ts_store_set(a, "a0", v, vn / 2)); /* replacing what it stored is fine */
        CHECK_OK(ts_store_set(b, "b0", v, vn));
        int refused = 0;
        for (int i = 0; i < 8; i++) { /* the tester's 8 large SETs, from another connection */
            char key[16];
            snprintf(key, sizeof key, "b%d", i + 1);
            if (ts_store_set(b, key, v, vn) == TS_ERR_INVALID_ARG &&
                strstr(ts_last_error(), "limit of 3145728 bytes in total (ts_store_tcp_options.max_total_bytes"))
                refused++;
        }
        CHECK(refused == 8);
        /* both clients still work over their connections */
        void *got = NULL;
        size_t gl = 0;
        CHECK_OK(ts_store_get(b, "a1", &got, &gl));
        CHECK(gl == vn);
        free(got);
        int64_t x = 0;
        CHECK_OK(ts_store_add(a, "counter", 1, &x));
    }
    double peak = status_mib(c.pid, "VmHWM");
    fprintf(stderr, "  9 x 900 KiB offered past a 3 MiB total: server peak %.1f MiB (from %.1f)\n", peak, base);
    CHECK(peak - base < 24);
    ts_store_release(a);
    ts_store_release(b);
    CHECK(stop_child(&c) == 0);
    free(v);
}

typedef struct rank_client {
    int port, rank, world;
    double took;
} rank_client;

static void *rank_client_main(void *arg) {
    rank_client *rc = arg;
    ts_store_tcp_options o = opts_token(TOKEN_A);
    o.rank = rc->rank;
    o.world_size = rc->world;
    ts_store *s = NULL;
    double t0 = ts_time_now();
    ts_status st = ts_store_tcp_new_ex("127.0.0.1", rc->port, false, 20, &o, &s);
    int64_t v = 0;
    if (st == TS_OK) st = ts_store_add(s, "joined", 1, &v);
    rc->took = ts_time_now() - t0;
    if (st != TS_OK) fprintf(stderr, "rank %d: %s\n", rc->rank, ts_last_error());
    ts_store_release(s);
    return (void *)(intptr_t)(st == TS_OK);
}

/* Insiders holding every slot with authenticated idle connections (as strangers to the job's ranks, or
 * claiming to be rank 0 over and over): a real rank still gets in at once. */
static void test_store_insider_flood(void) {
    ts_store_tcp_options o = opts_token(TOKEN_A);
    o.max_connections = 16;
    o.world_size = 2;
    child_srv c;
    if (!start_child(&o, 0, &c)) {
        CHECK(false);
        return;
    }
    for (int claim = 0; claim < 2; claim++) {
        int fds[40], authed = 0;
        for (int i = 0; i < 40; i++) {
            fds[i] = raw_connect(c.port);
            struct timeval tv = {1, 0}; /* a full server closes newcomers it cannot seat */
            setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            authed += raw_handshake(fds[i], TOKEN_A, TS__AUTH_STORE, claim ? 1 : 0, claim ? 2 : 0) == TS__AUTH_OK;
        }
        fprintf(stderr, "  %s: %d of 40 authenticated idle connections seated at a cap of 16\n",
                claim ? "claiming rank 0" : "not a rank", authed);
        CHECK(authed >= 16);
        rank_client rc = {c.port, 1, 2, 0};
        pthread_t th;
        pthread_create(&th, NULL, rank_client_main, &rc);
        void *r = NULL;
        pthread_join(th, &r);
        fprintf(stderr, "  rank 1 got in after %.2f s\n", rc.took);
        CHECK(r == (void *)1 && rc.took < 10);
        for (int i = 0; i < 40; i++) close(fds[i]);
        usleep(200 * 1000);
    }
    CHECK(stop_child(&c) == 0);
}

/* Out of file descriptors with every connection authenticated: the listener backs off (no busy
 * loop) and accepts again once descriptors free up. */
static void test_store_emfile(void) {
    ts_store_tcp_options o = opts_token(TOKEN_A);
    o.max_connections = 10000; /* far above what 48 descriptors allow: accept() hits EMFILE first */
    child_srv c;
    if (!start_child(&o, 48, &c)) {
        CHECK(false);
        return;
    }
    int fds[80], n = 0;
    /* authenticate connection after connection until the server stops accepting */
    for (; n < 80; n++) {
        fds[n] = raw_connect(c.port);
        struct timeval tv = {2, 0}; /* no challenge within 2 s: the server is out of descriptors */
        setsockopt(fds[n], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (raw_handshake(fds[n], TOKEN_A, TS__AUTH_STORE, 0, 0) != TS__AUTH_OK) break;
    }
    fprintf(stderr, "  %d authenticated connections before EMFILE\n", n);
    CHECK(n > 10 && n < 80);
    int waiting = n; /* fds[n] waits in the backlog; a few more join it */
    for (int i = n + 1; i < n + 6 && i < 80; i++) fds[i] = raw_connect(c.port);
    int total = TS_MIN(n + 6, 80);
    double c0 = cpu_s(c.pid), t0 = ts_time_now();
    usleep(1000 * 1000);
    double cpu = cpu_s(c.pid) - c0, wall = ts_time_now() - t0;
    fprintf(stderr, "  accept() failing with EMFILE: server CPU %.3f s over %.2f s\n", cpu, wall);
    CHECK(cpu >= 0 && cpu < 0.25 * wall);
    /* free some descriptors: the waiting connection gets its challenge */
    for (int i = 0; i < 8; i++) close(fds[i]);
    struct timeval tv = {5, 0};
    setsockopt(fds[waiting], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    CHECK(raw_handshake(fds[waiting], TOKEN_A, TS__AUTH_STORE, 0, 0) == TS__AUTH_OK);
    for (int i = 8; i < total; i++) close(fds[i]);
    CHECK(stop_child(&c) == 0);
}

static void test_store_reaps_silent(void) {
    log_capture();
    ts_store_tcp_options o = opts_token(TOKEN_A);
    o.auth_timeout_s = 0.3;
    ts_store *srv = NULL;
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", 0, true, 10, &o, &srv));
    if (!srv) return;
    int fd = raw_connect(ts_store_tcp_port(srv));
    uint8_t ch[TS__AUTH_CHALLENGE_BYTES];
    CHECK(read_full(fd, ch, sizeof ch));
    double t0 = ts_time_now();
    CHECK(closed_by_peer(fd));
    double dt = ts_time_now() - t0;
    CHECK(dt < 4);
    close(fd);
    CHECK(logged_soon("no handshake within 0.3 s", "refused a connection from 127.0.0.1:"));
    /* the server still serves */
    int64_t v = 0;
    CHECK_OK(ts_store_add(srv, "k", 2, &v));
    CHECK(v == 2);
    ts_store_release(srv);
    ts_log_set_sink(NULL, NULL);
    /* bad options */
    ts_store *s = NULL;
    ts_store_tcp_options bad = TS_STORE_TCP_OPTIONS_INIT;
    bad.max_connections = 1;
    CHECK_STATUS(ts_store_tcp_new_ex("127.0.0.1", 0, true, 1, &bad, &s), TS_ERR_INVALID_ARG);
    bad = TS_STORE_TCP_OPTIONS_INIT;
    bad.max_value_bytes = (size_t)2 << 30;
    CHECK_STATUS(ts_store_tcp_new_ex("127.0.0.1", 0, true, 1, &bad, &s), TS_ERR_INVALID_ARG);
    bad = TS_STORE_TCP_OPTIONS_INIT;
    bad.size = 8;
    CHECK_STATUS(ts_store_tcp_new_ex("127.0.0.1", 0, true, 1, &bad, &s), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("TS_STORE_TCP_OPTIONS_INIT");
}

/* ---- the TCP transport ------------------------------------------------------------------------------ */

typedef struct acceptor_run {
    ts__auth auth;
    int lfd;
    ts__link *links[2];
    ts_status st;
    char err[512];
} acceptor_run;

static void *acceptor_main(void *arg) {
    acceptor_run *a = arg;
    bool expect[2] = {false, true};
    a->st = ts__tcp_accept_peers(&a->auth, a->lfd, 0, 2, expect, ts_time_now() + 20, a->links);
    snprintf(a->err, sizeof a->err, "%s", ts_last_error());
    return NULL;
}

static void test_link_strangers(void) {
    log_capture();
    unsetenv("TS_SOCKET_IFNAME");
    unsetenv("TS_DIST_IFADDR");
    unsetenv("MASTER_ADDR");
    acceptor_run a = {0};
    CHECK_OK(ts__auth_init(&a.auth, TOKEN_A, "test"));
    char addr[80];
    CHECK_OK(ts__tcp_listen("127.0.0.1", false, &a.lfd, addr, sizeof addr));
    /* bound to the job's address, not 0.0.0.0 */
    struct sockaddr_in me;
    socklen_t ml = sizeof me;
    CHECK(getsockname(a.lfd, (struct sockaddr *)&me, &ml) == 0 && me.sin_addr.s_addr == htonl(INADDR_LOOPBACK));
    CHECK(strncmp(addr, "127.0.0.1:", 10) == 0);
    int port = atoi(addr + 10);
    /* strangers first: silent, garbage, a wrong token, a wrong token claiming to be rank 1 */
    int silent = raw_connect(port), garbage = raw_connect(port), wrong = raw_connect(port);
    CHECK(write_full(garbage, "GET / HTTP/1.0\r\n\r\n" "0123456789012345678901234567890123456789012345678901234567890123",
                     82));
    pthread_t th;
    pthread_create(&th, NULL, acceptor_main, &a);
    CHECK(raw_handshake(wrong, TOKEN_B, TS__AUTH_LINK, 1, 2) == TS__AUTH_BAD_TOKEN);
    /* then the genuine rank 1 */
    ts__auth mine;
    CHECK_OK(ts__auth_init(&mine, TOKEN_A, "test"));
    ts__link *l1 = NULL;
    CHECK_OK(ts__tcp_connect(&mine, addr, 1, 0, 2, ts_time_now() + 20, &l1));
    pthread_join(th, NULL);
    if (a.st != TS_OK) fprintf(stderr, "accept_peers: %s\n", a.err);
    CHECK(a.st == TS_OK && a.links[1] && a.links[1]->peer == 1 && !a.links[0]);
    if (l1 && a.links[1]) { /* the link carries data */
        CHECK(l1->vt->try_send(l1, "hello", 5) == 5);
        char got[8] = {0};
        long r = 0;
        for (int i = 0; i < 500 && r == 0; i++, usleep(2000)) r = a.links[1]->vt->try_recv(a.links[1], got, 5, TS__ROP_COPY, 1);
        CHECK(r == 5 && memcmp(got, "hello", 5) == 0);
    }
    CHECK(logged_soon("rank 0: refused a connection from 127.0.0.1:", "wrong job token"));
    CHECK(logged("rank 0: refused a connection from 127.0.0.1:", "more than a handshake answer") ||
          logged("rank 0: refused a connection from 127.0.0.1:", "malformed handshake"));
    CHECK(logged(addr, NULL)); /* the listener's address is named */
    close(silent);
    close(garbage);
    close(wrong);
    if (l1) l1->vt->destroy(l1);
    if (a.links[1]) a.links[1]->vt->destroy(a.links[1]);
    close(a.lfd);

    /* an authenticated rank claiming a rank the listener does not expect fails the setup */
    acceptor_run b = {0};
    CHECK_OK(ts__auth_init(&b.auth, TOKEN_A, "test"));
    CHECK_OK(ts__tcp_listen("127.0.0.1", false, &b.lfd, addr, sizeof addr));
    pthread_create(&th, NULL, acceptor_main, &b);
    int dup = raw_connect(atoi(addr + 10));
    CHECK(raw_handshake(dup, TOKEN_A, TS__AUTH_LINK, 0, 2) == TS__AUTH_BAD_PEER);
    pthread_join(th, NULL);
    CHECK(b.st == TS_ERR_REMOTE && strstr(b.err, "unexpected connection from rank 0"));
    close(dup);
    close(b.lfd);
    ts_log_set_sink(NULL, NULL);
}

/* A rank never sends data to a listener that cannot prove the token. */
static void test_link_stranger_listener(void) {
    ts__auth mine;
    CHECK_OK(ts__auth_init(&mine, TOKEN_A, "test"));
    fake_server f = {.kind = TS__AUTH_LINK, .f1 = 0, .f2 = 2};
    pthread_t th;
    if (!fake_start(&f, &th)) {
        CHECK(false);
        return;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", f.port);
    ts__link *l = NULL;
    CHECK_STATUS(ts__tcp_connect(&mine, addr, 1, 0, 2, ts_time_now() + 10, &l), TS_ERR_REMOTE);
    CHECK_ERR_MENTIONS("could not prove it knows the job token");
    CHECK_ERR_MENTIONS(addr);
    CHECK_ERR_MENTIONS("rank 0");
    pthread_join(th, NULL);
    close(f.lfd);
    CHECK(f.received == 0);
    /* a listener that says it is another rank is not trusted either */
    fake_server g = {.kind = TS__AUTH_LINK, .f1 = 3, .f2 = 4};
    if (!fake_start(&g, &th)) {
        CHECK(false);
        return;
    }
    snprintf(addr, sizeof addr, "127.0.0.1:%d", g.port);
    CHECK_STATUS(ts__tcp_connect(&mine, addr, 1, 0, 2, ts_time_now() + 10, &l), TS_ERR_REMOTE);
    CHECK_ERR_MENTIONS("says it is rank 3 of 4");
    pthread_join(th, NULL);
    close(g.lfd);
    CHECK(g.received == 0);
}

static void test_listen_address(void) {
    unsetenv("TS_DIST_IFADDR");
    unsetenv("MASTER_ADDR");
    int fd = -1;
    char addr[80];
    setenv("TS_SOCKET_IFNAME", "lo", 1);
    CHECK_OK(ts__tcp_listen(NULL, false, &fd, addr, sizeof addr));
    CHECK(strncmp(addr, "127.0.0.1:", 10) == 0);
    if (fd >= 0) close(fd);
    setenv("TS_SOCKET_IFNAME", "=no-such-if0,^x", 1);
    CHECK_STATUS(ts__tcp_listen(NULL, false, &fd, addr, sizeof addr), TS_ERR_INVALID_ARG);
    CHECK_ERR_MENTIONS("TS_SOCKET_IFNAME='=no-such-if0,^x' matches no interface");
    CHECK_ERR_MENTIONS("lo");
    setenv("TS_SOCKET_IFNAME", "^lo", 1); /* anything but loopback: whatever this machine has, never 0.0.0.0 */
    if (ts__tcp_listen(NULL, false, &fd, addr, sizeof addr) == TS_OK) {
        CHECK(strncmp(addr, "0.0.0.0", 7) != 0 && strncmp(addr, "127.", 4) != 0);
        close(fd);
    }
    unsetenv("TS_SOCKET_IFNAME");
    /* no hint, no MASTER_ADDR: loopback */
    CHECK_OK(ts__tcp_listen(NULL, false, &fd, addr, sizeof addr));
    CHECK(strncmp(addr, "127.0.0.1:", 10) == 0);
    if (fd >= 0) close(fd);
    /* an IPv6 hint (a store reached over IPv6): "[::1]:port" is published and dialled */
    if (ts__tcp_listen("::1", false, &fd, addr, sizeof addr) == TS_OK) {
        CHECK(strncmp(addr, "[::1]:", 6) == 0);
        acceptor_run a6 = {0};
        CHECK_OK(ts__auth_init(&a6.auth, TOKEN_A, "test"));
        a6.lfd = fd;
        pthread_t th;
        pthread_create(&th, NULL, acceptor_main, &a6);
        ts__link *l = NULL;
        CHECK_OK(ts__tcp_connect(&a6.auth, addr, 1, 0, 2, ts_time_now() + 10, &l));
        pthread_join(th, NULL);
        CHECK(a6.st == TS_OK && a6.links[1]);
        if (l) l->vt->destroy(l);
        if (a6.links[1]) a6.links[1]->vt->destroy(a6.links[1]);
        close(fd);
    } else {
        fprintf(stderr, "  no IPv6 loopback: %s\n", ts_last_error());
    }
    /* a TCP store's token and address reach the links, through a prefix store */
    ts_store_tcp_options o = opts_token(TOKEN_A);
    ts_store *srv = NULL, *pre = NULL;
    CHECK_OK(ts_store_tcp_new_ex("127.0.0.1", 0, true, 5, &o, &srv));
    CHECK_OK(ts_store_prefix_new(srv, "g", &pre));
    ts__auth a, want;
    char hint[64];
    CHECK_OK(ts__tcp_job_auth(pre, &a, hint, sizeof hint));
    CHECK_OK(ts__auth_init(&want, TOKEN_A, "test"));
    CHECK(a.has_token && a.keylen == want.keylen && memcmp(a.key, want.key, a.keylen) == 0);
    CHECK(strcmp(hint, "127.0.0.1") == 0);
    ts_store_release(pre);
    ts_store_release(srv);
}

/* ---- whole jobs -------------------------------------------------------------------------------------- */

typedef struct job_rank {
    ts_store *store;
    int rank, world;
    ts_status st;
    char err[512];
    float result;
} job_rank;

static void *job_rank_main(void *arg) {
    job_rank *j = arg;
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.store = j->store;
    o.rank = j->rank;
    o.world_size = j->world;
    o.timeout_s = 30;
    ts_process_group *pg = NULL;
    j->st = ts_pg_new(&o, &pg);
    float v = (float)(j->rank + 1);
    if (j->st == TS_OK) j->st = ts_all_reduce_buffer(pg, &v, 1, TS_F32, TS_REDUCE_SUM, NULL);
    j->result = v;
    if (j->st != TS_OK) snprintf(j->err, sizeof j->err, "%s", ts_last_error());
    ts_pg_free(pg);
    return NULL;
}

/* A store that makes rank 2 wait before it reads rank 0's address, until the stranger has
 * knocked: so the stranger certainly reaches listeners that are still accepting. */
typedef struct gated_store {
    ts_store base;
    ts_store *inner;
    bool gated;
    atomic_int *gate;
} gated_store;

static ts_status g_set(ts_store *s, const char *k, const void *v, size_t n, double t) {
    ts_store *in = ((gated_store *)s)->inner;
    return in->vt->set(in, k, v, n, t);
}
static ts_status g_get(ts_store *s, const char *k, double t, void **v, size_t *n) {
    gated_store *g = (gated_store *)s;
    size_t kl = strlen(k);
    if (g->gated && kl > 7 && strcmp(k + kl - 7, "/addr/0") == 0)
        for (int i = 0; i < 1000 && !atomic_load(g->gate); i++) usleep(10000);
    return g->inner->vt->get(g->inner, k, t, v, n);
}
static ts_status g_add(ts_store *s, const char *k, int64_t d, double t, int64_t *r) {
    ts_store *in = ((gated_store *)s)->inner;
    return in->vt->add(in, k, d, t, r);
}
static ts_status g_wait(ts_store *s, const char *const *k, int n, double t) {
    ts_store *in = ((gated_store *)s)->inner;
    return in->vt->wait(in, k, n, t);
}
static ts_status g_check(ts_store *s, const char *k, double t, bool *e) {
    ts_store *in = ((gated_store *)s)->inner;
    return in->vt->check(in, k, t, e);
}
static void g_destroy(ts_store *s) {
    ts_store_release(((gated_store *)s)->inner);
    free(s);
}
static const ts_store_vtable gated_vt = {"gated", g_set, g_get, g_add, g_wait, g_check, NULL, g_destroy};

static ts_store *gated_new(ts_store *inner, bool gated, atomic_int *gate) {
    gated_store *g = calloc(1, sizeof *g);
    ts__store_init(&g->base, &gated_vt, 30);
    g->inner = ts_store_retain(inner);
    g->gated = gated;
    g->gate = gate;
    return &g->base;
}

typedef struct stranger {
    ts_store *store;
    atomic_int *gate;
    int world;
    int knocked, accepted, silent[4], nsilent;
} stranger;

/* Reads the listeners' published addresses (the store is shared: as if it had leaked), knocks
 * on each with a wrong token, leaves a silent connection open on each, then opens the gate. */
static void *stranger_main(void *arg) {
    stranger *s = arg;
    for (int r = 0; r < s->world - 1; r++) {
        char key[64];
        snprintf(key, sizeof key, "default/builtin/1/addr/%d", r);
        void *v = NULL;
        size_t n = 0;
        if (ts__store_get_timeout(s->store, key, 20, &v, &n) != TS_OK) continue;
        const char *colon = strrchr(v, ':');
        int port = colon ? atoi(colon + 1) : 0;
        free(v);
        for (int k = 0; k < 3 && port; k++) {
            int fd = raw_connect(port);
            if (fd < 0) break;
            s->knocked++;
            s->accepted += raw_handshake(fd, TOKEN_B, TS__AUTH_LINK, (uint32_t)s->world - 1, (uint32_t)s->world) ==
                           TS__AUTH_OK;
            close(fd);
        }
        if (port && s->nsilent < 4) s->silent[s->nsilent++] = raw_connect(port);
    }
    atomic_store(s->gate, 1);
    return NULL;
}

static void test_job_threads_tcp(void) {
    log_capture();
    setenv("TS_JOB_TOKEN", TOKEN_A, 1);
    setenv("TS_DIST_TRANSPORT", "tcp", 1);
    unsetenv("TS_SOCKET_IFNAME");
    unsetenv("MASTER_ADDR");
    enum { W = 3 };
    ts_store *store = NULL;
    CHECK_OK(ts_store_memory_new(&store));
    atomic_int gate = 0;
    job_rank j[W];
    stranger s = {store, &gate, W, 0, 0, {0}, 0};
    pthread_t th[W], sth;
    pthread_create(&sth, NULL, stranger_main, &s);
    for (int r = 0; r < W; r++) {
        j[r] = (job_rank){gated_new(store, r == W - 1, &gate), r, W, TS_OK, "", 0};
        pthread_create(&th[r], NULL, job_rank_main, &j[r]);
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    pthread_join(sth, NULL);
    for (int r = 0; r < W; r++) {
        if (j[r].st != TS_OK) fprintf(stderr, "rank %d: %s\n", r, j[r].err);
        CHECK(j[r].st == TS_OK && j[r].result == 6.0f);
        ts_store_release(j[r].store);
    }
    for (int i = 0; i < s.nsilent; i++) close(s.silent[i]);
    fprintf(stderr, "  the stranger knocked %d times while the job connected\n", s.knocked);
    CHECK(s.knocked == 6 && s.accepted == 0);
    CHECK(logged_soon("rank 0: refused a connection from 127.0.0.1:", "wrong job token"));
    CHECK(logged_soon("rank 1: refused a connection from 127.0.0.1:", "wrong job token"));
    /* every listener was bound to loopback: the published addresses say so */
    void *v = NULL;
    size_t n = 0;
    CHECK_OK(ts_store_get(store, "default/builtin/1/addr/0", &v, &n));
    CHECK(v && strncmp(v, "127.0.0.1:", 10) == 0);
    free(v);
    ts_store_release(store);
    /* a bad TS_SOCKET_IFNAME is an error naming it */
    setenv("TS_SOCKET_IFNAME", "no-such-if", 1);
    CHECK_OK(ts_store_memory_new(&store));
    for (int r = 0; r < 2; r++) {
        j[r] = (job_rank){store, r, 2, TS_OK, "", 0};
        pthread_create(&th[r], NULL, job_rank_main, &j[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    CHECK(j[0].st != TS_OK && strstr(j[0].err, "TS_SOCKET_IFNAME"));
    ts_store_release(store);
    unsetenv("TS_SOCKET_IFNAME");
    unsetenv("TS_DIST_TRANSPORT");
    unsetenv("TS_JOB_TOKEN");
    ts_log_set_sink(NULL, NULL);
}

/* Two processes over env:// and TCP, as a launcher starts them: same token works; a rank with
 * another token fails fast with an error about the token. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &l) != 0) abort();
    close(fd);
    return ntohs(a.sin_port);
}

static pid_t spawn_rank(int rank, int port, const char *token, double timeout_s, int errfd) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return pid;
    char b[16];
    snprintf(b, sizeof b, "%d", rank);
    setenv("RANK", b, 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(b, sizeof b, "%d", port);
    setenv("MASTER_PORT", b, 1);
    setenv("TS_JOB_TOKEN", token, 1);
    setenv("TS_DIST_TRANSPORT", "tcp", 1);
    ts_log_set_level(TS_LOG_ERROR);
    ts_pg_options o = TS_PG_OPTIONS_INIT;
    o.timeout_s = timeout_s;
    ts_process_group *pg = NULL;
    ts_status st = ts_pg_new(&o, &pg);
    float v = 1;
    if (st == TS_OK) st = ts_all_reduce_buffer(pg, &v, 1, TS_F32, TS_REDUCE_SUM, NULL);
    if (st == TS_OK && v != 2.0f) st = TS_ERR_INTERNAL;
    if (st != TS_OK) dprintf(errfd, "rank %d: %s\n", rank, ts_last_error());
    ts_pg_free(pg);
    _exit(st == TS_OK ? 0 : 3);
}

static int wait_status(pid_t pid) {
    int status = 0;
    for (int i = 0; i < 3000; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static void test_job_processes(void) {
    char path[] = "/tmp/ts_job_token_XXXXXX";
    int errfd = mkstemp(path);
    CHECK(errfd >= 0);
    int port = free_port();
    pid_t a = spawn_rank(0, port, TOKEN_A, 30, errfd), b = spawn_rank(1, port, TOKEN_A, 30, errfd);
    CHECK(wait_status(a) == 0);
    CHECK(wait_status(b) == 0);
    port = free_port();
    double t0 = ts_time_now();
    a = spawn_rank(0, port, TOKEN_A, 4, errfd);
    b = spawn_rank(1, port, TOKEN_B, 30, errfd);
    CHECK(wait_status(b) == 3);
    double dt = ts_time_now() - t0;
    CHECK(dt < 10); /* refused at once, not after its 30 s timeout */
    CHECK(wait_status(a) == 3); /* rank 0 times out waiting for it */
    char buf[4096] = "";
    lseek(errfd, 0, SEEK_SET);
    ssize_t n = read(errfd, buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = 0;
    fprintf(stderr, "  mismatched tokens:\n%s", buf);
    CHECK(strstr(buf, "rank 1: tcp store 127.0.0.1:") && strstr(buf, "wrong job token"));
    close(errfd);
    unlink(path);
}

TU_MAIN(T(test_sha256_fips180), T(test_hmac_rfc4231), T(test_store_tokens), T(test_mpirun_token), T(test_remote_needs_token), T(test_store_stranger_server),
        T(test_store_size_limits), T(test_store_connection_flood), T(test_store_byte_caps), T(test_store_insider_flood), T(test_store_emfile), T(test_store_reaps_silent),
        T(test_link_strangers), T(test_link_stranger_listener), T(test_listen_address), T(test_job_threads_tcp),
        T(test_job_processes))
