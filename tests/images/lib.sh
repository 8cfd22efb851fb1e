# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# Shared by tests/images/{build,serve,stop,check-host}; source it, do not run it.
# Builds on tests/control-plane/lib.sh (cache root, pinned Kubernetes and etcd versions).
#
# Cache layout under $BYOH_TEST_CACHE (default ~/.cache/byoh-test):
#   coredns-<v>-kubeadm-plugins/bin/coredns (coredns/main.go: the plugins kubeadm's Corefile
#   uses), registry-<v>-filesystem/bin/registry (registry/main.go), cri-tools-<v>/bin/crictl,
#   pause-<tag>/bin/pause                    programs built here (static)
#   images-<k8s version>/NAME_TAG.oci.tar    one OCI image archive per image kubeadm asks for
#   images-<k8s version>/images.txt          kubeadm's image list they were built for
#   registry/                                the served registry: CA, server cert, storage, PID

images_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../control-plane/lib.sh
source "$images_dir/../control-plane/lib.sh"

# gomod_version DIR MODULE [MODFILE]: the version of MODULE required by $images_dir/DIR/go.mod
# (or DIR/MODFILE).
gomod_version() {
  awk -v m="$2" '($1 == m || ($1 == "require" && $2 == m)) { print ($1 == m ? $2 : $3); exit }' "$images_dir/$1/${3:-go.mod}"
}

# CoreDNS: the version kubeadm asks for, of the bed's Kubernetes (coredns/go.mod) or of the
# version clusters are upgraded to (coredns/go.upgrade.mod; same main.go).
if [[ "$kube_mod" == kube ]]; then coredns_modfile=go.mod; else coredns_modfile=go.upgrade.mod; fi
coredns_version="$(gomod_version coredns github.com/coredns/coredns "$coredns_modfile")"
registry_version="$(gomod_version registry github.com/distribution/distribution/v3)"
critools_version="$(gomod_version cri-tools sigs.k8s.io/cri-tools)"
coredns_bin="$cache_root/coredns-$coredns_version-kubeadm-plugins/bin"
registry_bin="$cache_root/registry-$registry_version-filesystem/bin"
critools_bin="$cache_root/cri-tools-$critools_version/bin"
images_out="$cache_root/images-$k8s_version"

# The served registry's state (tests/images/serve): one per cache, whatever its address.
registry_state="$cache_root/registry"
# The repository path under the registry that holds the images: a cluster sets
# `imageRepository: ADDR:PORT/$image_path`.
image_path=k8s
registry_port="${BYOH_TEST_REGISTRY_PORT:-5443}"

log() { echo "images: $*" >&2; }
die() { log "error: $*"; exit 1; }

# kubeadm_images [REPOSITORY]: the images kubeadm asks for (one reference a line), under
# REPOSITORY when given (kubeadm's own imageRepository rules, e.g. CoreDNS's path changes).
kubeadm_images() {
  local args=(config images list --kubernetes-version "$k8s_version")
  [[ -z "${1:-}" ]] || args+=(--image-repository "$1")
  "$k8s_bin/kubeadm" "${args[@]}"
}

# archive_of REFERENCE: the OCI archive for an image reference (its last path element, ':' -> '_').
archive_of() {
  local base="${1##*/}"
  echo "$images_out/${base%%:*}_${base#*:}.oci.tar"
}

# start_time_of PID: field 22 of /proc/PID/stat (clock ticks since boot), empty if PID is gone.
start_time_of() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  stat="${stat##*) }"
  awk '{print $20}' <<<"$stat"
}

# registry_alive: true if the PID serve recorded still runs and is the same registry process
# (same start time, same program).
registry_alive() {
  local pid
  [[ -s "$registry_state/registry.pid" ]] || return 1
  pid="$(<"$registry_state/registry.pid")"
  [[ -d "/proc/$pid" && "$(start_time_of "$pid")" == "$(cat "$registry_state/registry.start" 2>/dev/null)" ]] || return 1
  [[ "$(readlink "/proc/$pid/exe")" == "$registry_bin/registry" ]]
}
