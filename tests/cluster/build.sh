#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Builds (once) the local control plane binaries from the Go module proxy and caches them
# under $CACHE_ROOT keyed by version. Later runs return in well under a second.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.sh
. "$here/versions.sh"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { printf '[build] %s\n' "$*" >&2; }

# Kubernetes: a wrapper module that replaces every ./staging/... module with its published v0.X.Y.
build_kubernetes() {
  local out="$CACHE_ROOT/kubernetes-$KUBERNETES_VERSION"
  local binary complete=true
  for binary in "${KUBERNETES_BINARIES[@]}"; do [ -x "$out/$binary" ] || complete=false; done
  [ "$complete" = true ] && return
  log "building kubernetes $KUBERNETES_VERSION (cold: about 15 minutes on 2 cores)"
  local work minor staging_version gomod
  work="$(mktemp -d)"
  minor="$(echo "$KUBERNETES_VERSION" | cut -d. -f2)"
  staging_version="v0.${KUBERNETES_VERSION#v1.}"
  gomod="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module dbservice.dev/controlplane"
    grep -E '^go [0-9]' "$gomod"
    grep -E '^godebug' "$gomod" || true
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    grep -E '^\s*k8s.io/[^ ]+ => ./staging/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > "$work/go.mod"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
  (cd "$work" && { go mod tidy -e >/dev/null 2>&1 || true; } && go mod download k8s.io/kubernetes)
  (cd "$work" && go get "k8s.io/kubernetes@$KUBERNETES_VERSION" >/dev/null)
  local ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags="$ldflags -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  mkdir -p "$out.tmp"
  # One `go build` for all of them: the shared packages compile once.
  local packages=()
  for binary in "${KUBERNETES_BINARIES[@]}"; do packages+=("k8s.io/kubernetes/cmd/$binary"); done
  (cd "$work" && go build -tags tools -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp/" "${packages[@]}")
  rm -rf "$out" && mv "$out.tmp" "$out"
  rm -rf "$work"
}

# etcd: the server module has relative replaces too, so it also goes through a wrapper module.
build_etcd() {
  local out="$CACHE_ROOT/etcd-$ETCD_VERSION"
  [ -x "$out/etcd" ] && return
  log "building etcd $ETCD_VERSION"
  local work gomod
  work="$(mktemp -d)"
  gomod="$(cd "$work" && go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module dbservice.dev/etcd"
    grep -E '^go [0-9]' "$gomod"
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    grep -E '^\s*go.etcd.io/etcd/[^ ]+ => \.\./' "$gomod" | awk -v v="$ETCD_VERSION" '{print "replace " $1 " => " $1 " " v}' || true
  } > "$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$work/tools.go"
  (cd "$work" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1; go mod tidy -e >/dev/null 2>&1 || true)
  mkdir -p "$out.tmp"
  (cd "$work" && go build -tags tools -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "$out" && mv "$out.tmp" "$out"
  rm -rf "$work"
}

# CoreDNS with only the plugins a test cluster needs (the full plugin set drags in every cloud SDK).
build_coredns() {
  local out="$CACHE_ROOT/coredns-$COREDNS_VERSION"
  [ -x "$out/coredns" ] && return
  log "building CoreDNS $COREDNS_VERSION (minimal plugin set; about 3 minutes cold)"
  local work
  work="$(mktemp -d)"
  cat > "$work/main.go" <<'GO'
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
GO
  printf 'module dbservice.dev/coredns\ngo 1.26.0\nrequire github.com/coredns/coredns %s\n' "$COREDNS_VERSION" > "$work/go.mod"
  (cd "$work" && go mod tidy >/dev/null && go build -trimpath -ldflags "-s -w" -o "$out.tmp/coredns" .)
  rm -rf "$out" && mv "$out.tmp" "$out"
  rm -rf "$work"
}

build_kwok() {
  local out="$CACHE_ROOT/kwok-$KWOK_VERSION"
  [ -x "$out/kwok" ] && return
  log "building kwok $KWOK_VERSION"
  GOBIN="$out.tmp" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

build_helm() {
  local out="$CACHE_ROOT/helm-$HELM_VERSION"
  [ -x "$out/helm" ] && return
  log "building helm $HELM_VERSION"
  GOBIN="$out.tmp" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# Prometheus and promtool with Kubernetes service discovery only (every other discoverer drags in a
# cloud SDK); the web UI is not built in (nothing here opens it).
build_prometheus() {
  local out="$CACHE_ROOT/prometheus-$PROMETHEUS_VERSION"
  [ -x "$out/prometheus" ] && [ -x "$out/promtool" ] && return
  log "building prometheus $PROMETHEUS_VERSION (about 5 minutes cold)"
  local work module=github.com/prometheus/prometheus
  work="$(mktemp -d)"
  printf 'module dbservice.dev/prometheus\n\ngo 1.25\n' > "$work/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/prometheus"\n\t_ "%s/cmd/promtool"\n)\n' "$module" "$module" > "$work/tools.go"
  (cd "$work" && go get "$module/cmd/prometheus@$PROMETHEUS_VERSION" "$module/cmd/promtool@$PROMETHEUS_VERSION" >/dev/null 2>&1; go mod tidy -e >/dev/null 2>&1 || true)
  mkdir -p "$out.tmp"
  (cd "$work" && go build -tags tools,remove_all_sd,enable_kubernetes_sd -trimpath -ldflags "-s -w" -o "$out.tmp/" "$module/cmd/prometheus" "$module/cmd/promtool")
  rm -rf "$out" && mv "$out.tmp" "$out"
  rm -rf "$work"
}

mkdir -p "$CACHE_ROOT"
case "${1:-all}" in
  kubernetes) build_kubernetes ;;
  # The oldest minor supported (tests/cluster/oldest.sh), beside the current one.
  oldest) KUBERNETES_VERSION="$OLDEST_KUBERNETES_VERSION" build_kubernetes ;;
  etcd) build_etcd ;;
  kwok) build_kwok ;;
  helm) build_helm ;;
  coredns) build_coredns ;;
  prometheus) build_prometheus ;;
  all) build_etcd; build_kwok; build_helm; build_coredns; build_kubernetes; build_prometheus ;;
  *) echo "usage: $0 [all|kubernetes|oldest|etcd|kwok|helm|coredns|prometheus]" >&2; exit 2 ;;
esac
