# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared by tests/control-plane/{build,up,down}; source it, do not run it.
# Versions come from the pinned Go modules (see `pin`); binaries are cached per version under
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

k8s_version="$(module_version kube k8s.io/kubernetes)"
etcd_version="$(module_version etcd go.etcd.io/etcd/server/v3)"
k8s_bin="$cache_root/k8s-$k8s_version/bin"
etcd_bin="$cache_root/etcd-$etcd_version/bin"

log() { echo "control-plane: $*" >&2; }
die() { log "error: $*"; exit 1; }
