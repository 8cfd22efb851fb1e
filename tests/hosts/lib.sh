# shellcheck shell=bash disable=SC2034 # variables used by the scripts that source this
# Shared helpers of the test host scripts (tests/hosts/*); sourced, not run.
# Layout of one host's state (BYOH_TEST_HOSTS_DIR, default /var/tmp/byoh-test-hosts):
#   NAME/upper, NAME/work   overlayfs upper and work dirs (the host's writes)
#   NAME/root               the overlay mount (lower: the pristine image) that nspawn boots
#   NAME/containerd         bound to /var/lib/containerd (overlayfs cannot be an upper dir)
#   NAME/console.log        the container's console (and nspawn's messages)
#   NAME/nspawn.pid         PID of systemd-nspawn (host PID namespace)
#   NAME/leader.pid         PID of the container's PID 1, systemd (host PID namespace)
#   NAME/*.start            start time (field 22 of /proc/PID/stat) of that PID, against PID reuse
#   NAME/image              path of the image the overlay is over
#   NAME/address            its address on the test network (boot --network; see `network`)
#   NAME/options            the boot options that --resume applies again (--network, --containers)

HOSTS_DIR=${BYOH_TEST_HOSTS_DIR:-/var/tmp/byoh-test-hosts}
HOSTS_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HOSTS_SCRIPTS/../.." && pwd)
# PATH for commands run inside a host (`exec`), and for the host's own tools here.
# The test network (tests/hosts/network): bridge, /24 prefix, the machine's address on it.
NET_BRIDGE=byoh-br0
NET_PREFIX=198.18.0
NET_GATEWAY=$NET_PREFIX.1
GUEST_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH="$PATH:/usr/sbin:/sbin"

die() {
  echo "${0##*/}: $*" >&2
  exit 1
}

need_root() {
  [[ $(id -u) == 0 ]] || die "must run as root (systemd-nspawn, overlayfs mounts and nsenter need it)"
}

# inotify limits of this machine, raised (never lowered) before a host boots: every host's
# systemd, journald, containerd and kubelet take inotify instances of the one root user, and the
# kernel's default of 128 instances runs out with about ten hosts up at once (systemd in the next
# one then fails with "Failed to create control group inotify object: Too many open files").
# kind documents the same limits for its nodes.
INOTIFY_MIN_INSTANCES=8192
INOTIFY_MIN_WATCHES=1048576
raise_inotify_limits() {
  local key want have
  for key in max_user_instances:$INOTIFY_MIN_INSTANCES max_user_watches:$INOTIFY_MIN_WATCHES; do
    want=${key#*:} key=/proc/sys/fs/inotify/${key%%:*}
    have=$(<"$key")
    ((have >= want)) || echo "$want" >"$key"
  done
}

# Host names become directory names, machine names and hostnames: keep them plain.
check_name() {
  [[ ${1:-} =~ ^[a-z0-9][a-z0-9-]{0,62}$ ]] ||
    die "bad host name '${1:-}': use 1-63 of [a-z0-9-], starting with a letter or digit"
}

# start_time PID: field 22 of /proc/PID/stat (clock ticks since boot), empty if PID is gone.
start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  # The comm field (2) may hold spaces; cut after its closing parenthesis.
  stat=${stat##*) }
  # Now field 3 of the original line is field 1 here: start time is field 22 - 2 = 20.
  awk '{print $20}' <<<"$stat"
}

# alive DIR WHAT: true if the PID recorded in DIR/WHAT.pid still runs and is the same process
# (same start time as recorded).
alive() {
  local dir=$1 what=$2 pid rec
  [[ -s $dir/$what.pid ]] || return 1
  pid=$(<"$dir/$what.pid")
  rec=$(cat "$dir/$what.start" 2>/dev/null || true)
  [[ -d /proc/$pid ]] || return 1
  [[ -z $rec || $(start_time "$pid") == "$rec" ]]
}

record_pid() {
  local dir=$1 what=$2 pid=$3
  start_time "$pid" >"$dir/$what.start"
  echo "$pid" >"$dir/$what.pid"
}

# find_leader NSPAWN_PID: the container's PID 1 (the child of nspawn that is PID 1 of its own
# PID namespace), or nothing while there is none yet.
find_leader() {
  local child
  # shellcheck disable=SC2013 # the file is one line of space-separated PIDs
  for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    if grep -qE '^NSpid:\s+[0-9]+\s+1$' "/proc/$child/status" 2>/dev/null; then
      echo "$child"
      return
    fi
  done
}

# leader_of DIR: the recorded leader PID of a running host, or fail with a message.
leader_of() {
  local dir=$1
  alive "$dir" leader || die "host '$(basename "$dir")' is not running (no live leader in $dir; boot it with tests/hosts/boot)"
  cat "$dir/leader.pid"
}

# mounts_under DIR: mount points at or below DIR, deepest first (from /proc/mounts, whose
# mount points escape spaces as \040; our paths have none).
mounts_under() {
  awk -v d="$1" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/mounts | sort -r
}

# host_cgroups NAME create|remove: the cgroups of a --containers host, one per cgroup hierarchy
# of this machine (/sys/fs/cgroup/*: the v1 controllers, name=systemd, the unified one), each
# byoh-host-NAME below the caller's own cgroup there. create: makes them (cpuset's CPUs and
# memory nodes copied from its parent, which an empty cpuset refuses tasks without), records them
# in HOSTS_DIR/NAME/cgroups and prints them, one a line. remove: removes those recorded, deepest
# first (what the host's systemd, kubelet and runc left in them), once no process is in them;
# a cgroup still in use is left.
host_cgroups() {
  local name=$1 action=$2 list=$HOSTS_DIR/$1/cgroups h key own cg
  case $action in
    create)
      : >"$list"
      for h in /sys/fs/cgroup/*/; do
        h=${h%/}
        [[ -e $h/cgroup.procs ]] || continue
        case ${h##*/} in
          unified) key= ;;
          systemd) key=name=systemd ;;
          *) key=${h##*/} ;;
        esac
        own=$(awk -F: -v k="$key" '{ n = split($2, c, ","); for (i = 1; i <= n; i++) if (c[i] == k) { print $3; exit } ; if ($2 == k) { print $3; exit } }' /proc/self/cgroup)
        cg=$h${own%/}/byoh-host-$name
        mkdir -p "$cg"
        if [[ -e $cg/cpuset.cpus && -z $(<"$cg/cpuset.cpus") ]]; then
          cat "${cg%/*}/cpuset.cpus" >"$cg/cpuset.cpus"
          cat "${cg%/*}/cpuset.mems" >"$cg/cpuset.mems"
        fi
        echo "$cg" | tee -a "$list"
      done
      ;;
    remove)
      [[ -f $list ]] || return 0
      while IFS= read -r cg; do
        [[ -d $cg ]] || continue
        find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
      done <"$list"
      ;;
  esac
}

# allocate_address DIR: the lowest address of NET_PREFIX.10-199 that no other host's STATE/address
# holds, recorded in DIR/address (under a lock: concurrent boots get different addresses).
allocate_address() {
  local dir=$1 i taken
  exec 8>"$HOSTS_DIR/.address.lock"
  flock 8
  taken=" $(cat "$HOSTS_DIR"/*/address 2>/dev/null | tr '\n' ' ') "
  for i in $(seq 10 199); do
    [[ $taken == *" $NET_PREFIX.$i "* ]] && continue
    echo "$NET_PREFIX.$i" >"$dir/address"
    exec 8>&-
    echo "$NET_PREFIX.$i"
    return 0
  done
  exec 8>&-
  return 1
}
