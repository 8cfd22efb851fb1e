# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared by tests/control-plane/{build,up,down}; source it, do not run it.
# Versions come from the pinned Go modules (see `pin`; BYOH_TEST_K8S below picks which); binaries are cached per version under
# $BYOH_TEST_CACHE (default ~/.cache/byoh-test): k8s-vX.Y.Z/bin/ and etcd-vX.Y.Z/bin/.

cp_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${BYOH_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/byoh-test}"

# module_version DIR MODULE: the version of MODULE required by DIR/go.mod.
module_version() {
  awk -v m="$2" '($1 == m || ($1 == "require" && $2 == m)) { print ($1 == m ? $2 : $3); exit }' "$cp_dir/$1/go.mod"
}

# tools DIR: the programs (package paths) recorded as `tool` in DIR/go.mod.
tools() {
  awk '/^tool \(/ { in_block = 1; next } in_block && /^\)/ { in_block = 0 }
       in_block { print $1 } /^tool [^(]/ { print $2 }' "$cp_dir/$1/go.mod"
}

# Which Kubernetes a script works on (issue 36): the bed's own (kube/ and etcd/, the version
# clusters are made at), or with BYOH_TEST_K8S=upgrade the next minor, that clusters are upgraded
# to (kube-upgrade/ and etcd-upgrade/, pinned by `BYOH_TEST_K8S=upgrade pin VERSION`).
case "${BYOH_TEST_K8S:-}" in
  "") kube_mod=kube etcd_mod=etcd ;;
  upgrade) kube_mod=kube-upgrade etcd_mod=etcd-upgrade ;;
  *) echo "control-plane: BYOH_TEST_K8S must be empty or 'upgrade', got '$BYOH_TEST_K8S'" >&2; exit 2 ;;
esac
k8s_version="$(module_version "$kube_mod" k8s.io/kubernetes)"
etcd_version="$(module_version "$etcd_mod" go.etcd.io/etcd/server/v3)"
k8s_bin="$cache_root/k8s-$k8s_version/bin"
etcd_bin="$cache_root/etcd-$etcd_version/bin"

# go_build DIR ARGS...: `go build ARGS` in DIR, as every program of the test bed is built: static
# (CGO_ENABLED=0), -trimpath, and without debug information — the callers' -ldflags start with
# "-s -w" (the linker writes none) and -gcflags=all=-dwarf=false keeps the compiler from making
# it for every package: ~10 % of the CPU of a bare machine's ~2,200 CPU-s of Go builds (issue 35;
# kube-scheduler v1.37.2 from an empty build cache: 406 CPU-s with it, 363 without).
go_build() {
  local d="$1"
  shift
  (cd "$d" && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false "$@")
}

log() { echo "control-plane: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Ports: random free ports on 127.0.0.1 (nothing accepts a connection there now), below the
# kernel's ephemeral range: a port there may be the local end of some outgoing connection,
# which no connect test sees but which makes the server's bind fail. free_port runs in a
# command substitution, so the caller records each port it got: p=$(free_port); used_ports+="$p "
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range
((ephemeral_low > 21000)) || ephemeral_low=32768
used_ports=" "
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % (ephemeral_low - 20000)))
    [[ "$used_ports" == *" $p "* ]] && continue
    port_taken "$p" && continue
    echo "$p"
    return 0
  done
  die "no free TCP port found on 127.0.0.1"
}

# Cluster API: the version clusterctl and the managers are built from (tests/capi/go.mod), and
# capi_source printing the module's source directory (downloaded from the Go module proxy
# into the module cache if needed; verified against tests/capi/go.sum).
capi_version="$(awk '$1 == "sigs.k8s.io/cluster-api" { print $2; exit }' "$cp_dir/../capi/go.mod")"
capi_source() {
  local src
  src="$(cd "$cp_dir/../capi" && go mod download -json "sigs.k8s.io/cluster-api@$capi_version" \
    | awk -F'"' '$2 == "Dir" { print $4 }')"
  [[ -d "$src" ]] || die "cannot download sigs.k8s.io/cluster-api@$capi_version (see above)"
  echo "$src"
}
# Where each provider's config lives in the module (kustomize bases, CRDs, RBAC, webhooks).
capi_providers=(core bootstrap/kubeadm controlplane/kubeadm)
