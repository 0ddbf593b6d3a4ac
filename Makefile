# The project's interface. `make test` runs every test; `make demo` runs the main job.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CARGO        ?= cargo
GO           ?= go
TESTENV_DIR  := $(CURDIR)/target/testenv
TESTENV      := $(TESTENV_DIR)/bin/testenv
KUBECONFIG_TESTENV := $(TESTENV_DIR)/kubeconfig
# The Kubernetes version the local control plane is built from: the one testenv/go.mod requires.
K8S_VERSION  := $(shell awk '$$1=="k8s.io/kubernetes"{print $$2; exit}' testenv/go.mod)
K8S_MINOR    := $(word 2,$(subst ., ,$(K8S_VERSION)))
GO_LDFLAGS   := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=$(K8S_MINOR) \
	-X k8s.io/component-base/version.gitTreeState=clean

.PHONY: help build release test lint fmt-check clippy unit integration testenv cluster-up \
	cluster-down cluster-status demo bench crd clean

help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-z-]+:.*## /{printf "  make %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## debug build of the operator
	$(CARGO) build --locked

release: ## release build of the operator (the binary the Dockerfile ships)
	$(CARGO) build --locked --release --bin reloader

test: lint unit integration ## every test: fmt, clippy, unit tests, integration tests on a real control plane
	@echo "make test: all checks passed"

lint: fmt-check clippy

fmt-check:
	$(CARGO) fmt --all -- --check
	@out=$$(cd testenv && gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi

clippy:
	$(CARGO) clippy --locked --all-targets -- -D warnings

unit: ## fast tests of pure logic, no cluster
	$(CARGO) test --locked --lib --bins

# Each integration test binary starts its own control plane from $(TESTENV) unless
# RELOADER_TEST_KUBECONFIG points at a cluster.
integration: testenv ## integration tests against a real kube-apiserver, etcd and kube-controller-manager
	@echo "integration tests: Kubernetes $(K8S_VERSION) control plane ($$($(TESTENV) version)) unless RELOADER_TEST_KUBECONFIG is set"
	$(CARGO) test --locked --test '*'

crd: ## regenerate crd/reloadpolicy.yaml from the Rust types
	$(CARGO) run --locked --quiet -- crd > crd/reloadpolicy.yaml

testenv: $(TESTENV) ## build the local control plane (no-op when up to date)

$(TESTENV): testenv/go.mod testenv/go.sum $(wildcard testenv/*.go)
	@echo "testenv: building etcd, kube-apiserver and kube-controller-manager $(K8S_VERSION) from the official Go modules."
	@echo "testenv: the first build downloads the modules and compiles Kubernetes; that takes a while (minutes), later builds are cached."
	@mkdir -p $(dir $@)
	cd testenv && $(GO) build -buildvcs=false -ldflags "$(GO_LDFLAGS)" -o $@ .
	@echo "testenv: built $@ ($$($@ version))"

cluster-up: testenv ## start the local control plane in the background; kubeconfig at target/testenv/kubeconfig
	$(TESTENV) up --dir $(TESTENV_DIR) --detach

cluster-down: ## stop the local control plane and remove its data
	@if [ -x $(TESTENV) ]; then $(TESTENV) down --dir $(TESTENV_DIR); \
	else rm -rf $(TESTENV_DIR)/data $(KUBECONFIG_TESTENV) $(TESTENV_DIR)/state.json $(TESTENV_DIR)/testenv.pid; fi

cluster-status: ## is the local control plane running?
	@$(TESTENV) status --dir $(TESTENV_DIR)

demo: ## run the main job on a local control plane (not built yet)
	@echo "make demo: not built yet; it arrives with the 'Ship it' issue (#6)." >&2
	@exit 1

bench: ## benchmarks (not built yet)
	@echo "make bench: not built yet; it arrives with the performance issue (#7)." >&2
	@exit 1

clean: cluster-down
	$(CARGO) clean
