/*
 * tests/fuzz/fuzz_store.c — libFuzzer target: the TCP store's server
 * (src/distributed/store_tcp.c: frame splitting, request parsing, parked
 * GET/WAIT, ADD's counters) fed over a loopback connection, since its parser
 * is static and bound to the server's connections (store_tcp.c is left as is).
 * The server runs in this process (a thread), so ASan/UBSan see its faults.
 *
 * Input: byte 0 = flags, then frames of u16 big-endian body length + body:
 *   flags bit 0: the first frame's length is sent raw as the next 4 bytes of
 *                input (lengths 0 or over 1 GiB: the server must drop the
 *                connection), not derived;
 *   flags bit 1: before sending, SET the keys of well-formed GET/WAIT bodies
 *                through a second client, so they answer at once (else a GET of
 *                a missing key parks, and the target waits 5 ms for silence).
 * After the frames a CHECK request follows; the target reads replies until the
 * server answered all of them, closed the connection, or stayed silent 5 ms.
 * The server is replaced every 4096 inputs (its keys would grow without bound).
 */
#include "tessera.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static ts_store *server, *client;
static int port;
static long runs;

static void restart(void) {
    ts_store_release(client);
    ts_store_release(server);
    client = server = NULL;
    if (ts_store_tcp_new("127.0.0.1", 0, true, 5.0, &server) != TS_OK ||
        ts_store_tcp_new("127.0.0.1", (port = ts_store_tcp_port(server)), false, 5.0, &client) != TS_OK) {
        fprintf(stderr, "fuzz_store: cannot start a store: %s\n", ts_last_error());
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    ts_log_set_level(TS_LOG_OFF);
    restart();
    return 0;
}

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}
/* connect(), finished when a signal (libFuzzer's timers) interrupts it: the
 * connection then completes in the background, so wait for it and read its error. */
static int connect_loopback(int fd, const struct sockaddr_in *sa) {
    if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0) return 0;
    if (errno != EINTR) return -1;
    struct pollfd pf = {fd, POLLOUT, 0};
    int r;
    while ((r = poll(&pf, 1, 5000)) < 0 && errno == EINTR) {}
    if (r <= 0) return -1;
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -1;
    errno = err;
    return err ? -1 : 0;
}

static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

/* SETs the keys a GET (2) or WAIT (5) body asks for, when it is well formed. */
static void preset_keys(const uint8_t *b, size_t n) {
    if (n < 1 || (b[0] != 2 && b[0] != 5)) return;
    size_t pos = 1, nk = 1;
    if (b[0] == 5) {
        if (n < 5) return;
        nk = get32(b + 1);
        pos = 5;
    }
    for (size_t i = 0; i < nk && i < 64 && pos + 4 <= n; i++) {
        size_t kl = get32(b + pos);
        pos += 4;
        if (kl > n - pos || kl > 255) return;
        char key[256];
        memcpy(key, b + pos, kl);
        key[kl] = 0;
        if (strlen(key) == kl) ts_store_set(client, key, "v", 1);
        pos += kl;
    }
}

static bool send_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return false;
        p += w, n -= (size_t)w;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (++runs % 4096 == 0) restart();
    uint8_t flags = data[0];
    size_t pos = 1, out_n = 0, requests = 0;
    uint8_t *out = malloc(size * 2 + 64);
    if (!out) return 0;
    if ((flags & 1) && size >= 5) { /* a raw first length */
        memcpy(out, data + 1, 4);
        out_n = 4;
        pos = 5;
        requests++;
    }
    while (pos + 2 <= size) {
        size_t len = (size_t)data[pos] << 8 | data[pos + 1];
        pos += 2;
        if (len > size - pos) len = size - pos;
        if (flags & 2) preset_keys(data + pos, len);
        put32(out + out_n, (uint32_t)len);
        memcpy(out + out_n + 4, data + pos, len);
        out_n += 4 + len;
        pos += len;
        requests++;
    }
    if (pos < size) { /* a leftover byte: a partial frame */
        memcpy(out + out_n, data + pos, size - pos);
        out_n += size - pos;
    }
    static const uint8_t check[] = {0, 0, 0, 6, 4, 0, 0, 0, 1, 's'}; /* CHECK "s" */
    memcpy(out + out_n, check, sizeof check);
    out_n += sizeof check;
    requests++;

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect_loopback(fd, &sa) != 0) {
        perror("fuzz_store: connect");
        abort();
    }
    if (send_all(fd, out, out_n)) {
        /* replies: u32 length + body each; stop at all of them, at EOF, or after 5 ms of silence */
        static uint8_t buf[1 << 17];
        size_t have = 0, answered = 0;
        for (;;) {
            struct pollfd pf = {fd, POLLIN, 0};
            if (poll(&pf, 1, 5) <= 0) break;
            ssize_t r = recv(fd, buf + have, sizeof buf - have, 0);
            if (r <= 0) break;
            have += (size_t)r;
            size_t off = 0;
            while (have - off >= 4 && have - off - 4 >= get32(buf + off)) {
                off += 4 + get32(buf + off);
                answered++;
            }
            if (have - off >= 4 && get32(buf + off) > sizeof buf - 4) break; /* a reply larger than we keep */
            memmove(buf, buf + off, have - off);
            have -= off;
            if (answered >= requests) break;
        }
    }
    close(fd);
    free(out);
    return 0;
}
