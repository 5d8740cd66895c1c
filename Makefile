# dbservice-operator developer entry points. The local control plane (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok) is described in tests/cluster/README.md.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
CLUSTER_DIR := $(CURDIR)/.cluster
KUBECONFIG_LOCAL := $(CLUSTER_DIR)/kubeconfig
CRD_FILE := charts/dbservice-operator/files/crd-spec.yaml

.PHONY: help build test lint lint-scripts lint-chart lint-docker cluster-build cluster-up cluster-down demo crd

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## cargo build
	$(CARGO) build

cluster-build: ## build the control-plane binaries into ~/.cache/dbservice-operator (once; cold Kubernetes build ~12 min here)
	tests/cluster/build.sh all

cluster-up: cluster-build ## start the local control plane (no-op when already running); kubeconfig at .cluster/kubeconfig
	tests/cluster/up.sh

cluster-down: ## stop the local control plane (and a demo operator) and remove its data
	tests/cluster/down.sh

test: cluster-up ## unit, HTTP, replication and end-to-end tests against the local control plane
	scripts/demo.sh --stop
	KUBECONFIG=$(KUBECONFIG_LOCAL) DBSERVICE_E2E=1 PATH="$(CLUSTER_DIR)/bin:$$PATH" $(CARGO) test --lib --bins --tests -- --test-threads 16

demo: cluster-build ## start the local control plane and run scripts/demo.sh
	tests/cluster/up.sh
	KUBECONFIG=$(KUBECONFIG_LOCAL) PATH="$(CLUSTER_DIR)/bin:$$PATH" scripts/demo.sh

lint: ## cargo fmt --check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

lint-scripts: ## shellcheck the control-plane and CI scripts
	shellcheck -x tests/cluster/*.sh .ci/run scripts/*.sh charts/check.sh

lint-chart: ## helm lint and render the chart with the default values and every certificate mode
	charts/check.sh

lint-docker: ## hadolint the Dockerfile
	hadolint Dockerfile

crd: ## regenerate the chart's CRD spec (files/crd-spec.yaml) from the Rust types (tests/crd_sync.rs checks it)
	$(CARGO) run -q -- crd --spec-only > $(CRD_FILE).tmp
	mv $(CRD_FILE).tmp $(CRD_FILE)
