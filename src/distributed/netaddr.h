/*
 * distributed/netaddr.h — which local address a rank's listeners publish (the TCP transport's listener,
 * the heartbeat socket): the job's interface. One choice for both, in this order:
 *   TS_SOCKET_IFNAME  an interface list in NCCL_SOCKET_IFNAME's syntax ("eth", "=eth0", "^docker,lo"):
 *                     the first matching interface that is up, IPv4 first, then global IPv6;
 *   TS_DIST_IFADDR    an address to publish (it may not be ours: behind NAT the listener binds every
 *                     interface of its family);
 *   hint              the local end of the store's connection to rank 0 (the interface that reaches it);
 *   MASTER_ADDR       the local end of the route to it (so a host whose name resolves to 127.0.1.1, as
 *                     Debian's /etc/hosts has it, still publishes its real interface);
 *   127.0.0.1         no MASTER_ADDR: a job on one host.
 * When the job spans hosts and the rule chose a loopback address (MASTER_ADDR is this host's name and
 * resolves to 127.0.1.1 here), the first interface that is up and not loopback replaces it.
 */
#ifndef TS_DISTRIBUTED_NETADDR_H
#define TS_DISTRIBUTED_NETADDR_H

#include "core/internal.h"

#include <sys/socket.h>

/* The job's interface address into *ss (port 0); cross_host: some peer is on another host; *from names
 * the rule that chose it (for messages);
 * *published_only is true for TS_DIST_IFADDR. Errors: a TS_SOCKET_IFNAME that matches no interface
 * (listing the interfaces), a TS_DIST_IFADDR that is not an address. */
ts_status ts__net_local_addr(const char *hint, bool cross_host, struct sockaddr_storage *ss, socklen_t *sl,
                             const char **from, bool *published_only);
/* Whether the launcher says the job spans hosts (LOCAL_WORLD_SIZE < WORLD_SIZE). */
bool ts__net_job_spans_hosts(void);
/* The address of the first interface matching a TS_SOCKET_IFNAME list. */
ts_status ts__net_ifname_addr(const char *spec, struct sockaddr_storage *ss, socklen_t *sl);
/* A numeric address or a host name into ss; false if it does not resolve. */
bool ts__net_resolve(const char *host, struct sockaddr_storage *ss, socklen_t *sl);
/* The local address of the route to host. */
bool ts__net_route_to(const char *host, struct sockaddr_storage *ss, socklen_t *sl);
void ts__net_set_port(struct sockaddr_storage *ss, int port);

#endif
