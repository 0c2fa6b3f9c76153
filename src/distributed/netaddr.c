/*
 * distributed/netaddr.c — the job's interface (netaddr.h).
 */
#include "distributed/netaddr.h"
#include "core/env.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <unistd.h>

/* Does interface `name` match a TS_SOCKET_IFNAME list (NCCL_SOCKET_IFNAME's syntax: comma-separated
 * prefixes; "=" before the list: exact names; "^" before it: every interface but these)? */
static bool ifname_match(const char *spec, const char *name) {
    bool exclude = false, exact = false;
    if (*spec == '^') exclude = true, spec++;
    if (*spec == '=') exact = true, spec++;
    bool hit = false;
    for (const char *p = spec; *p && !hit;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n) hit = exact ? strlen(name) == n && strncmp(name, p, n) == 0 : strncmp(name, p, n) == 0;
        p += n + (comma ? 1 : 0);
    }
    return exclude ? !hit : hit;
}

/* The first address of an interface matching spec: IPv4 first, then global IPv6. */
ts_status ts__net_ifname_addr(const char *spec, struct sockaddr_storage *ss, socklen_t *sl) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return ts_error(TS_ERR_IO, "TS_SOCKET_IFNAME: getifaddrs: %s", strerror(errno));
    for (int pass = 0; pass < 2; pass++) {
        int fam = pass == 0 ? AF_INET : AF_INET6;
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != fam || !(i->ifa_flags & IFF_UP)) continue;
            if (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr)) continue;
            if (!ifname_match(spec, i->ifa_name)) continue;
            *sl = fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
            memset(ss, 0, sizeof *ss);
            memcpy(ss, i->ifa_addr, *sl);
            freeifaddrs(ifs);
            return TS_OK;
        }
    }
    char names[256] = "";
    size_t len = 0;
    for (struct ifaddrs *i = ifs; i && len < sizeof names - 40; i = i->ifa_next) {
        if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
        if (strstr(names, i->ifa_name)) continue; /* one mention per interface (good enough for a message) */
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", i->ifa_name);
    }
    freeifaddrs(ifs);
    return ts_error(TS_ERR_INVALID_ARG, "TS_SOCKET_IFNAME='%.100s' matches no interface that is up with an address "
                    "(interfaces: %s)", spec, names[0] ? names : "none");
}

/* A numeric address (or a host name) into ss; false if it does not resolve. */
bool ts__net_resolve(const char *host, struct sockaddr_storage *ss, socklen_t *sl) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) return false;
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sl = res->ai_addrlen;
    freeaddrinfo(res);
    return true;
}

/* The local address of the route to host (a UDP socket "connected" to it sends nothing). */
bool ts__net_route_to(const char *host, struct sockaddr_storage *ss, socklen_t *sl) {
    struct sockaddr_storage dst;
    socklen_t dl = 0;
    if (!ts__net_resolve(host, &dst, &dl)) return false;
    ((struct sockaddr_in *)&dst)->sin_port = htons(9); /* same offset in sockaddr_in6 */
    int u = socket(dst.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    bool ok = u >= 0 && connect(u, (struct sockaddr *)&dst, dl) == 0;
    *sl = sizeof *ss;
    ok = ok && getsockname(u, (struct sockaddr *)ss, sl) == 0;
    if (u >= 0) close(u);
    return ok;
}

void ts__net_set_port(struct sockaddr_storage *ss, int port) {
    if (ss->ss_family == AF_INET6) ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    else ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
}


static bool is_loopback(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET) return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    return ss->ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
}

bool ts__net_job_spans_hosts(void) {
    const char *w = getenv("WORLD_SIZE"), *lw = getenv("LOCAL_WORLD_SIZE");
    return w && lw && *w && *lw && atoi(lw) > 0 && atoi(lw) < atoi(w);
}

ts_status ts__net_local_addr(const char *hint, bool cross_host, struct sockaddr_storage *ss, socklen_t *sl,
                             const char **from, bool *published_only) {
    const char *ifname = ts_env_str(TS_ENV_SOCKET_IFNAME), *ifaddr = ts_env_str(TS_ENV_DIST_IFADDR);
    const char *master = getenv("MASTER_ADDR");
    *published_only = false;
    if (ifname && *ifname) {
        TS_TRY(ts__net_ifname_addr(ifname, ss, sl));
        *from = "TS_SOCKET_IFNAME";
    } else if (ifaddr && *ifaddr) {
        if (!ts__net_resolve(ifaddr, ss, sl))
            return ts_error(TS_ERR_INVALID_ARG, "TS_DIST_IFADDR='%.100s' is not an address", ifaddr);
        *from = "TS_DIST_IFADDR";
        *published_only = true;
    } else {
        if (hint && *hint && ts__net_resolve(hint, ss, sl)) {
            *from = "the interface that reaches the TCP store";
        } else if (master && *master && ts__net_route_to(master, ss, sl)) {
            *from = "the interface that routes to MASTER_ADDR";
        } else {
            ts__net_resolve("127.0.0.1", ss, sl);
            *from = "loopback (no MASTER_ADDR)";
        }
        /* Peers on other hosts cannot reach a loopback address: the store was reached through a host name
         * that resolves to 127.0.1.1 here (Debian's /etc/hosts). Take the first other interface that is up. */
        if (cross_host && is_loopback(ss) && ts__net_ifname_addr("^lo", ss, sl) == TS_OK)
            *from = "the first non-loopback interface (MASTER_ADDR is a loopback address here; set TS_SOCKET_IFNAME "
                    "to choose)";
    }
    ts__net_set_port(ss, 0);
    return TS_OK;
}
