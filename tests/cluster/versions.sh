# shellcheck shell=bash disable=SC2034 # sourced: the variables are used by the including script
# Versions of the local control plane, in one place. Sourced by the cluster scripts.
# Kubernetes must match the k8s-openapi feature in Cargo.toml (v1_37).
KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE_ROOT="${DBSERVICE_CACHE:-$HOME/.cache/dbservice-operator}"
