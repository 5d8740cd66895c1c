# dbservice-operator developer entry points. The local control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok) is described in tests/cluster/README.md.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
CLUSTER_DIR := $(CURDIR)/.cluster
KUBECONFIG_LOCAL := $(CLUSTER_DIR)/kubeconfig
CRD_FILE := charts/dbservice-operator/files/crd-spec.yaml
BACKUP_CRD_FILE := charts/dbservice-operator/files/backup-crd-spec.yaml
API_REFERENCE := docs/manual/src/reference/api.md
BACKUP_API_REFERENCE := docs/manual/src/reference/backup-api.md

.PHONY: help build image test test-oldest-kubernetes manual lint lint-scripts lint-chart lint-docker cluster-build cluster-up cluster-down cluster-status demo crd bench-scale

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## cargo build
	$(CARGO) build

cluster-build: ## build the control-plane and node binaries into ~/.cache/dbservice-operator (once; cold ~16 min here)
	tests/cluster/build.sh all

cluster-up: cluster-build ## start the local control plane with kwok nodes and one real node (DBSERVICE_REAL_NODE=0: kwok only)
	tests/cluster/up.sh

cluster-down: ## stop the local control plane and the real node, and check that nothing is left on the machine
	tests/cluster/down.sh

cluster-status: ## the real node's processes and memory
	tests/cluster/real-node.sh status

image: ## build the operator image from the Dockerfile with buildah and load it into the real node
	tests/cluster/images.sh operator

test: cluster-up image ## unit, HTTP, replication, kwok end-to-end and real-node tests; then the kwok suite and the demo on the oldest Kubernetes supported
	scripts/demo.sh --stop
	KUBECONFIG=$(KUBECONFIG_LOCAL) DBSERVICE_E2E=1 PATH="$(CLUSTER_DIR)/bin:$$PATH" $(CARGO) test --no-fail-fast --lib --bins --tests -- --test-threads 16
	tests/cluster/oldest.sh

test-oldest-kubernetes: ## the kwok end-to-end suite and the demo on the oldest Kubernetes supported (own control plane, stopped after)
	tests/cluster/oldest.sh

demo: cluster-up image ## the chart with the operator image on the real node, a DatabaseService with real PostgreSQL, psql at the end
	KUBECONFIG=$(KUBECONFIG_LOCAL) PATH="$(CLUSTER_DIR)/bin:$$PATH" scripts/demo.sh

lint: ## cargo fmt --check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

lint-scripts: ## shellcheck the control-plane and CI scripts
	shellcheck -x tests/cluster/*.sh .ci/run scripts/*.sh charts/check.sh

manual: ## build the manual (docs/manual, mdBook) into target/manual
	scripts/manual.sh

lint-chart: ## helm lint and render the chart with the default values and every certificate mode
	charts/check.sh

lint-docker: ## hadolint the Dockerfile
	hadolint Dockerfile

crd: ## regenerate the chart's CRD specs and the manual's API reference from the Rust types (tests/crd_sync.rs checks them)
	$(CARGO) run -q -- crd --spec-only > $(CRD_FILE).tmp
	mv $(CRD_FILE).tmp $(CRD_FILE)
	$(CARGO) run -q -- crd --spec-only --kind backup > $(BACKUP_CRD_FILE).tmp
	mv $(BACKUP_CRD_FILE).tmp $(BACKUP_CRD_FILE)
	$(CARGO) run -q -- crd --reference > $(API_REFERENCE).tmp
	mv $(API_REFERENCE).tmp $(API_REFERENCE)
	$(CARGO) run -q -- crd --reference --kind backup > $(BACKUP_API_REFERENCE).tmp
	mv $(BACKUP_API_REFERENCE).tmp $(BACKUP_API_REFERENCE)

bench-scale: cluster-build ## N DatabaseServices (N=1000) on a separate local control plane (.cluster-bench): time to Running, RSS, CPU, requests
	N=$${N:-1000} scripts/bench-scale.sh
