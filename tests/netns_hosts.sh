# tests/netns_hosts.sh — sourced by tests that need several hosts: each "host" is a network namespace
# (its own interfaces, addresses, routes, ports) with its own UTS namespace (its own host name, so
# Tessera sees distinct hosts), joined by veth pairs to a bridge in a "switch" namespace. Nothing of the
# caller's network changes. Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2 and unshare;
# hosts_check says why not (the caller skips with exit 77).
#
#   hosts_check || { echo "skip: $HOSTS_WHY"; exit 77; }
#   hosts_up 2                      # host0 = $HOSTS_SUB.1, host1 = $HOSTS_SUB.2, interface eth0 each
#   host_exec 1 cmd args...         # runs cmd on host1 (its namespaces), hostname "host1"
#   host_hosts_file 0 FILE          # host_exec 0 sees FILE as /etc/hosts (a private mount namespace)
#   host_link 1 down|up             # cuts / restores host1's cable (its port on the switch)
#   host_netem 1 "delay 20ms loss 1%" | host_netem 1 ""   # tc netem on host1's eth0 / removes it
#   host_tbf 1 20mbit | host_tbf 1 ""  # a rate limit on host1's eth0 / removes it
#   host_qdisc_ok 1 netem delay 1ms    # whether the kernel has that qdisc (some have no sch_netem)
#   host_pids 1                     # pids of every process in host1's network namespace
#   hosts_down                      # kills what runs on the hosts, deletes the namespaces

HOSTS_PRE=ts$$
HOSTS_N=0
HOSTS_SUB=
HOSTS_WHY=
declare -A HOSTS_ETC

hosts_check() {
  local need
  for need in ip unshare tc; do
    command -v "$need" >/dev/null 2>&1 || { HOSTS_WHY="no '$need' command (iproute2 / util-linux)"; return 1; }
  done
  if ! ip netns add "${HOSTS_PRE}chk" 2>/tmp/${HOSTS_PRE}.err; then
    HOSTS_WHY="cannot create network namespaces here: $(cat /tmp/${HOSTS_PRE}.err) (needs root or CAP_NET_ADMIN)"
    rm -f /tmp/${HOSTS_PRE}.err
    return 1
  fi
  rm -f /tmp/${HOSTS_PRE}.err
  if ! ip netns exec "${HOSTS_PRE}chk" unshare --uts --mount true 2>/dev/null; then
    ip netns del "${HOSTS_PRE}chk"
    HOSTS_WHY="cannot create UTS/mount namespaces (unshare --uts --mount) here"
    return 1
  fi
  ip netns del "${HOSTS_PRE}chk"
  return 0
}

hosts_up() {
  HOSTS_N=$1
  HOSTS_SUB=10.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1))
  ip netns add "${HOSTS_PRE}sw" || return 1
  ip -n "${HOSTS_PRE}sw" link add br0 type bridge || return 1
  ip -n "${HOSTS_PRE}sw" link set br0 up
  local i
  for ((i = 0; i < HOSTS_N; i++)); do
    ip netns add "${HOSTS_PRE}h$i" || return 1
    ip link add "${HOSTS_PRE}v$i" type veth peer name "${HOSTS_PRE}p$i" || return 1
    ip link set "${HOSTS_PRE}v$i" netns "${HOSTS_PRE}h$i"
    ip link set "${HOSTS_PRE}p$i" netns "${HOSTS_PRE}sw"
    ip -n "${HOSTS_PRE}h$i" link set "${HOSTS_PRE}v$i" name eth0
    ip -n "${HOSTS_PRE}h$i" addr add "$HOSTS_SUB.$((i + 1))/24" dev eth0
    ip -n "${HOSTS_PRE}h$i" link set eth0 up
    ip -n "${HOSTS_PRE}h$i" link set lo up
    ip -n "${HOSTS_PRE}sw" link set "${HOSTS_PRE}p$i" master br0
    ip -n "${HOSTS_PRE}sw" link set "${HOSTS_PRE}p$i" up
  done
}

host_addr() { echo "$HOSTS_SUB.$(($1 + 1))"; }

host_hosts_file() { HOSTS_ETC[$1]=$2; }

host_exec() {
  local i=$1; shift
  if [ -n "${HOSTS_ETC[$i]:-}" ]; then
    ip netns exec "${HOSTS_PRE}h$i" unshare --uts --mount sh -c \
      'hostname "host$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"' "$i" "${HOSTS_ETC[$i]}" "$@"
  else
    ip netns exec "${HOSTS_PRE}h$i" unshare --uts sh -c 'hostname "host$0" && exec "$@"' "$i" "$@"
  fi
}

host_link() { ip -n "${HOSTS_PRE}sw" link set "${HOSTS_PRE}p$1" "$2"; }

host_netem() {
  ip netns exec "${HOSTS_PRE}h$1" tc qdisc del dev eth0 root 2>/dev/null
  [ -z "$2" ] || ip netns exec "${HOSTS_PRE}h$1" tc qdisc add dev eth0 root netem $2
}

# host_qdisc_ok I KIND ARGS: whether this kernel has qdisc KIND (netem, tbf) on host I's eth0 (left without it)
host_qdisc_ok() {
  local i=$1; shift
  ip netns exec "${HOSTS_PRE}h$i" tc qdisc add dev eth0 root "$@" 2>/dev/null || return 1
  ip netns exec "${HOSTS_PRE}h$i" tc qdisc del dev eth0 root 2>/dev/null
  return 0
}
# host_tbf I RATE: a token-bucket rate limit on host I's eth0 ("" removes it)
host_tbf() {
  ip netns exec "${HOSTS_PRE}h$1" tc qdisc del dev eth0 root 2>/dev/null
  [ -z "$2" ] || ip netns exec "${HOSTS_PRE}h$1" tc qdisc add dev eth0 root tbf rate "$2" burst 64kb latency 200ms
}

host_pids() { ip netns pids "${HOSTS_PRE}h$1" 2>/dev/null; }

hosts_down() {
  local i p
  for ((i = 0; i < HOSTS_N; i++)); do
    for p in $(host_pids "$i"); do kill -KILL "$p" 2>/dev/null; done
  done
  for ((i = 0; i < HOSTS_N; i++)); do ip netns del "${HOSTS_PRE}h$i" 2>/dev/null; done
  ip netns del "${HOSTS_PRE}sw" 2>/dev/null
  HOSTS_N=0
}
