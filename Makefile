# The project's interface. `make test` runs every test; `make demo` runs the main job.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CARGO        ?= cargo
GO           ?= go
TESTENV_DIR  := $(CURDIR)/target/testenv
TESTENV      := $(TESTENV_DIR)/bin/testenv
KWOK         := $(TESTENV_DIR)/bin/kwok
KUBECONFIG_TESTENV := $(TESTENV_DIR)/kubeconfig
# The Kubernetes version the local control plane is built from: the one testenv/go.mod requires.
K8S_VERSION  := $(shell awk '$$1=="k8s.io/kubernetes"{print $$2; exit}' testenv/go.mod)
K8S_MINOR    := $(word 2,$(subst ., ,$(K8S_VERSION)))
GO_LDFLAGS   := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=$(K8S_MINOR) \
	-X k8s.io/component-base/version.gitTreeState=clean
# The helm CLI for chart lint and the chart test, built from the version tools/helm/go.mod pins.
HELM         := $(CURDIR)/target/tools/bin/helm
HELM_VERSION := $(shell awk '{sub(/^require /,"")} $$1=="helm.sh/helm/v3"{print $$2; exit}' tools/helm/go.mod)
# helm's default Kubernetes version (for kubeVersion checks) is that of its client-go, v0.N → 1.N.
HELM_K8S_MINOR := $(word 2,$(subst ., ,$(shell awk '$$1=="k8s.io/client-go"{print $$2; exit}' tools/helm/go.mod)))
HELM_LDFLAGS := -s -w -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	$(foreach p,chartutil lint/rules,-X helm.sh/helm/v3/pkg/$(p).k8sVersionMajor=1 \
	-X helm.sh/helm/v3/pkg/$(p).k8sVersionMinor=$(HELM_K8S_MINOR))

.PHONY: help build release release-path image release-check crane test lint fmt-check clippy unit integration testenv cluster-up \
	cluster-down cluster-status demo bench crd docs zigbuild clean kubectl helm chart deploy chart-lint chart-docs workflows-lint deny prereqs promtool \
	stakater-reloader bench-compare bench-curve bench-loadtest

help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-z-]+:.*## /{printf "  make %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## debug build of the operator
	$(CARGO) build --locked

# The one definition of the release build: `make image` (for every architecture of the image, as
# CI runs it) and the Dockerfile (for the platform buildx builds) both run it.
# Another architecture (TARGET=aarch64-unknown-linux-musl) links with zig (cargo-zigbuild): ring and
# mimalloc have C code, and zig carries every target's C toolchain and musl headers.
# The image's architectures: Docker's TARGETARCH and the musl triple built for it. The Dockerfile
# runs `make release TARGETARCH=$TARGETARCH`; `make image` builds every one of them.
IMAGE_ARCHS := amd64=x86_64-unknown-linux-musl arm64=aarch64-unknown-linux-musl
ifneq ($(TARGETARCH),)
TARGET := $(patsubst $(TARGETARCH)=%,%,$(filter $(TARGETARCH)=%,$(IMAGE_ARCHS)))
ifeq ($(TARGET),)
$(error TARGETARCH=$(TARGETARCH) is not an architecture of the image ($(IMAGE_ARCHS)))
endif
endif
HOST_ARCH := $(shell uname -m)
CROSS = $(if $(TARGET),$(if $(filter $(HOST_ARCH)-%,$(TARGET)),,yes))
release: ## release build of the operator (the binary the image ships); TARGET=triple or TARGETARCH=amd64|arm64
	$(if $(CROSS),$(MAKE) zigbuild,@true)
	$(if $(TARGET),rustup target list --installed | grep -qx $(TARGET) || rustup target add $(TARGET),@true)
	$(if $(CROSS),CARGO_ZIGBUILD_ZIG_PATH=$(ZIG) $(ZIGBUILD) zig,$(CARGO) )build --locked --release --bin reloader $(if $(TARGET),--target $(TARGET))

release-path: ## print the path of the binary `make release` builds (with the same TARGET or TARGETARCH)
	@echo target/$(if $(TARGET),$(TARGET)/)release/reloader

# zig (from PyPI's ziglang) and cargo-zigbuild (crates.io), pinned, into target/tools.
ZIG_VERSION       := 0.15.2
ZIGBUILD_VERSION  := 0.24.1
ZIG               := $(CURDIR)/target/tools/bin/zig
ZIGBUILD          := $(CURDIR)/target/tools/bin/cargo-zigbuild
zigbuild: $(ZIG) $(ZIGBUILD)
$(ZIG):
	@mkdir -p $(dir $@)
	python3 -m pip install --quiet --disable-pip-version-check --target $(CURDIR)/target/tools/ziglang ziglang==$(ZIG_VERSION)
	printf '#!/bin/sh\nPYTHONPATH=%s exec python3 -m ziglang "$$@"\n' "$(CURDIR)/target/tools/ziglang" > $@ && chmod +x $@
$(ZIGBUILD):
	$(CARGO) install --locked --quiet --root $(CURDIR)/target/tools cargo-zigbuild --version $(ZIGBUILD_VERSION)

test: prereqs lint deny chart-lint workflows-lint unit integration ## every test: fmt, clippy, cargo deny, chart and workflow lint, unit tests, integration tests on a real control plane
	@echo "make test: all checks passed"

lint: fmt-check clippy

fmt-check:
	$(CARGO) fmt --all -- --check
	@out=$$(gofmt -l testenv tools/helm tools/helm-docs tools/promtool tools/gitops-health tools/kwok tools/actionlint tools/image); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi

clippy:
	$(CARGO) clippy --locked --all-targets -- -D warnings

unit: ## fast tests of pure logic, no cluster
	$(CARGO) test --locked --lib --bins

# The integration tests (one binary, tests/it) and the soak test each start a control plane
# from $(TESTENV) unless RELOADER_TEST_KUBECONFIG points at a cluster.
# What `make test` needs beyond the Go and Rust toolchains, checked in seconds, before any build.
# (Everything else it builds itself: the control plane, helm, promtool, cargo-deny.)
prereqs: ## check the toolchains and system tools `make test` needs, naming what is missing
	@missing=""; \
	command -v $(GO) >/dev/null || missing="$$missing\n  go (a Go toolchain, for the control plane, helm and promtool)"; \
	command -v $(CARGO) >/dev/null || missing="$$missing\n  cargo (a Rust toolchain, via rustup)"; \
	command -v rustup >/dev/null && rustup target list --installed | grep -qx x86_64-unknown-linux-musl \
		|| missing="$$missing\n  the Rust target of the image: rustup target add x86_64-unknown-linux-musl"; \
	command -v musl-gcc >/dev/null || command -v x86_64-linux-musl-gcc >/dev/null \
		|| missing="$$missing\n  musl-gcc, for the image's static build (Debian/Ubuntu: apt-get install musl-tools)"; \
	if [ -n "$$missing" ]; then printf "make test needs:$$missing\n"; exit 1; fi

# actionlint checks .github/workflows, built from the version tools/actionlint pins.
ACTIONLINT := $(CURDIR)/target/tools/bin/actionlint
$(ACTIONLINT): tools/actionlint/go.mod tools/actionlint/go.sum
	@mkdir -p $(dir $@)
	cd tools/actionlint && $(GO) build -buildvcs=false -ldflags "-s -w" -o $@ github.com/rhysd/actionlint/cmd/actionlint

workflows-lint: $(ACTIONLINT) ## lint the GitHub Actions workflows (.github/workflows) with actionlint
	$(ACTIONLINT) -color=false .github/workflows/*.yml

# promtool checks the /metrics exposition (tests/it/operations.rs), built from the pinned module.
PROMTOOL := $(CURDIR)/target/tools/bin/promtool
promtool: $(PROMTOOL) ## build promtool pinned in tools/promtool (no-op when up to date)

$(PROMTOOL): tools/promtool/go.mod tools/promtool/go.sum
	@mkdir -p $(dir $@)
	cd tools/promtool && $(GO) build -buildvcs=false -ldflags "-s -w" -o $@ github.com/prometheus/prometheus/cmd/promtool

# Evaluates docs/gitops/ health checks as Flux and Argo CD do (tests/it/gitops_health.rs).
GITOPS_HEALTH := $(CURDIR)/target/tools/bin/gitops-health
$(GITOPS_HEALTH): tools/gitops-health/go.mod tools/gitops-health/go.sum tools/gitops-health/main.go
	@mkdir -p $(dir $@)
	cd tools/gitops-health && $(GO) build -buildvcs=false -ldflags "-s -w" -o $@ .

integration: testenv $(HELM) $(PROMTOOL) $(GITOPS_HEALTH) ## integration tests against a real kube-apiserver, etcd and kube-controller-manager
	@echo "integration tests: Kubernetes $(K8S_VERSION) control plane ($$($(TESTENV) version)) unless RELOADER_TEST_KUBECONFIG is set"
	@# Without backtraces a failure's panic message ends the output, where CI's excerpt shows it.
	RUST_BACKTRACE=$${RELOADER_TEST_BACKTRACE:-0} $(CARGO) test --locked --test '*'

# cargo-deny, built from crates.io at a pinned version into target/tools (like helm).
CARGO_DENY         := $(CURDIR)/target/tools/bin/cargo-deny
CARGO_DENY_VERSION := 0.20.2

$(CARGO_DENY):
	$(CARGO) install --locked --quiet --root $(CURDIR)/target/tools cargo-deny --version $(CARGO_DENY_VERSION)

# Advisories need RustSec's database from GitHub; where that cannot be fetched (this project's
# build machines reach only package registries) the run says so loudly and checks the rest.
deny: $(CARGO_DENY) ## supply chain (deny.toml): licences, bans, sources, and advisories when the RustSec database can be fetched
	$(CARGO_DENY) --log-level error check --hide-inclusion-graph bans licenses sources
	@if out=$$($(CARGO_DENY) check --hide-inclusion-graph advisories 2>&1); then echo "cargo deny: advisories ok"; \
	elif echo "$$out" | grep -q "failed to fetch advisory database"; then \
		echo "cargo deny: ADVISORIES NOT CHECKED: the RustSec database (github.com/rustsec/advisory-db) cannot be fetched from this machine"; \
	else echo "$$out"; exit 1; fi

docs: ## regenerate docs/flags.md from the clap definition (src/cli.rs)
	UPDATE_DOCS=1 $(CARGO) test --locked --lib the_flags_reference_is_current

crd: ## regenerate crd/reloadpolicy.yaml (and the chart's copy) from the Rust types
	$(CARGO) run --locked --quiet -- crd > crd/reloadpolicy.yaml
	cp crd/reloadpolicy.yaml helm/reloader/files/reloadpolicy.yaml

helm: $(HELM) ## build the helm CLI pinned in tools/helm (no-op when up to date)

$(HELM): tools/helm/go.mod tools/helm/go.sum
	@mkdir -p $(dir $@)
	cd tools/helm && $(GO) build -buildvcs=false -ldflags "$(HELM_LDFLAGS)" -o $@ helm.sh/helm/v3/cmd/helm

# helm-docs writes helm/reloader/README.md from README.md.gotmpl and the values comments.
HELM_DOCS := $(CURDIR)/target/tools/bin/helm-docs
$(HELM_DOCS): tools/helm-docs/go.mod tools/helm-docs/go.sum
	@mkdir -p $(dir $@)
	cd tools/helm-docs && $(GO) build -buildvcs=false -ldflags "-s -w" -o $@ github.com/norwoodj/helm-docs/cmd/helm-docs

chart-docs: $(HELM_DOCS) ## regenerate helm/reloader/README.md from the values comments
	$(HELM_DOCS) --chart-search-root helm --template-files README.md.gotmpl --sort-values-order file

# The chart as released: packaged with the versions of Cargo.toml (tests/support/chart.rs
# packages it the same way, and the chart tests render and install that package).
CRATE_VERSION := $(shell awk -F'"' '/^version *=/{print $$2; exit}' Cargo.toml)
chart: $(HELM) ## package the Helm chart (versions from Cargo.toml): target/chart/reloader-<version>.tgz
	@mkdir -p target/chart
	$(HELM) package helm/reloader --version $(CRATE_VERSION) --app-version $(CRATE_VERSION) --destination target/chart

# The OCI image, without a container engine: the musl release binary of every IMAGE_ARCHS entry
# at /reloader, with the CA bundle, user 65532:65532 and OCI labels, one image per platform under
# one index (tools/image, go-containerregistry). target/image/ gets the OCI layout (oci/), the
# same as an OCI archive (reloader-<version>.oci.tar), the index digest and a CycloneDX SBOM of
# Cargo.lock per platform (reloader-<version>-<arch>.cdx.json). Dated by the commit, so a clean
# tree gives the same digests again.
IMAGE_DIR       := target/image
IMAGE_BUILD     := $(CURDIR)/target/tools/bin/image-build
CRATE_LICENSE   := $(shell awk -F'"' '/^license *=/{print $$2; exit}' Cargo.toml)
CRATE_REPOSITORY := $(shell awk -F'"' '/^repository *=/{print $$2; exit}' Cargo.toml)
GIT_REVISION     = $(shell git rev-parse HEAD)$(if $(shell git status --porcelain --untracked-files=no),-dirty)
GIT_TIME         = $(shell git log -1 --format=%cI)
GIT_EPOCH        = $(shell git log -1 --format=%ct)
CYCLONEDX         := $(CURDIR)/target/tools/bin/cargo-cyclonedx
CYCLONEDX_VERSION := 0.5.9

$(IMAGE_BUILD): tools/image/go.mod tools/image/go.sum tools/image/main.go
	@mkdir -p $(dir $@)
	cd tools/image && $(GO) build -buildvcs=false -ldflags "-s -w" -o $@ .

# crane, from the same go-containerregistry: the release workflow pushes target/image/oci with it.
CRANE := $(CURDIR)/target/tools/bin/crane
crane: $(CRANE) ## build crane (go-containerregistry, pinned in tools/image)
$(CRANE): tools/image/go.mod tools/image/go.sum
	@mkdir -p $(dir $@)
	cd tools/image && $(GO) build -buildvcs=false -ldflags "-s -w" -o $@ github.com/google/go-containerregistry/cmd/crane

$(CYCLONEDX):
	$(CARGO) install --locked --quiet --root $(CURDIR)/target/tools cargo-cyclonedx --version $(CYCLONEDX_VERSION)

image: $(IMAGE_BUILD) $(CYCLONEDX) ## OCI image (linux/amd64 + linux/arm64 index, layout and archive) and SBOMs: target/image/
	@for a in $(IMAGE_ARCHS); do echo "$(MAKE) release TARGETARCH=$${a%%=*}"; $(MAKE) release TARGETARCH=$${a%%=*}; done
	@rm -rf $(IMAGE_DIR) && mkdir -p $(IMAGE_DIR)
	@for a in $(IMAGE_ARCHS); do \
		SOURCE_DATE_EPOCH=$(GIT_EPOCH) $(CYCLONEDX) cyclonedx --quiet --format json --spec-version 1.5 \
			--target $${a#*=} --override-filename reloader-sbom-$${a%%=*} && \
		mv reloader-sbom-$${a%%=*}.json $(IMAGE_DIR)/reloader-$(CRATE_VERSION)-$${a%%=*}.cdx.json || exit 1; done
	$(IMAGE_BUILD) --out $(IMAGE_DIR) --name reloader --created $(GIT_TIME) \
		--label org.opencontainers.image.title=reloader \
		--label org.opencontainers.image.source=$(CRATE_REPOSITORY) \
		--label org.opencontainers.image.revision=$(GIT_REVISION) \
		--label org.opencontainers.image.version=$(CRATE_VERSION) \
		--label org.opencontainers.image.licenses=$(CRATE_LICENSE) \
		$(foreach a,$(IMAGE_ARCHS),--platform linux/$(word 1,$(subst =, ,$(a)))=target/$(word 2,$(subst =, ,$(a)))/release/reloader)
	@ls -l $(IMAGE_DIR)

# What `make image` made, checked (tests/it/image.rs): the index's platforms, each config, the
# amd64 binary run from its layer, the arm64 ELF. `.ci/run` runs it after `make image`.
release-check: ## check target/image/ (make image first): platforms, config, labels, the binaries in the layers
	RELOADER_IMAGE_ARCHIVE=$(IMAGE_DIR)/reloader-$(CRATE_VERSION).oci.tar $(CARGO) test --locked --test it -- image::

# Plain manifests rendered from that package with the chart's defaults (release and namespace
# `reloader`); deploy/ is also a Kustomize base. tests/it/helm_chart.rs keeps them current and
# runs the operator from them.
DEPLOY_HEADER := \# Generated by `make deploy` from the packaged chart (helm/reloader, default values, release and namespace reloader); do not edit.
deploy: chart ## render deploy/reloader.yaml (plain manifests, also a Kustomize base) from the packaged chart
	{ echo '$(DEPLOY_HEADER)'; $(HELM) template reloader target/chart/reloader-$(CRATE_VERSION).tgz \
		--namespace reloader --include-crds; } > deploy/reloader.yaml

chart-lint: $(HELM) $(HELM_DOCS) ## lint the Helm chart with its default, CI and example values (both RBAC modes)
	$(HELM) lint --strict helm/reloader
	@# The chart README is generated: it must be what helm-docs makes of the values now.
	@$(HELM_DOCS) --chart-search-root helm --template-files README.md.gotmpl --sort-values-order file \
		--output-file README.md.check >/dev/null 2>&1; \
	if ! cmp -s helm/reloader/README.md helm/reloader/README.md.check; then \
		rm -f helm/reloader/README.md.check; echo "helm/reloader/README.md is not current: run make chart-docs"; exit 1; fi; \
	rm -f helm/reloader/README.md.check
	@for f in helm/reloader/ci/*-values.yaml examples/helm/*-values.yaml; do \
		echo "$(HELM) lint --strict helm/reloader -f $$f"; $(HELM) lint --strict helm/reloader -f $$f; done
	@# stakater/Reloader's values files (its defaults, then each override on top) are read too.
	@for f in tests/fixtures/stakater-values/*.yaml; do \
		echo "$(HELM) lint --strict helm/reloader -f tests/fixtures/stakater-values/defaults.yaml -f $$f"; \
		$(HELM) lint --strict helm/reloader -f tests/fixtures/stakater-values/defaults.yaml -f $$f; done

testenv: $(TESTENV) $(KWOK) ## build the local control plane (no-op when up to date)

# kwok, the node simulator testenv runs pods with, in its own module (it pins its own k8s.io release).
$(KWOK): tools/kwok/go.mod tools/kwok/go.sum
	@mkdir -p $(dir $@)
	cd tools/kwok && $(GO) build -buildvcs=false -ldflags "-s -w" -o $@ sigs.k8s.io/kwok/cmd/kwok

$(TESTENV): testenv/go.mod testenv/go.sum $(wildcard testenv/*.go) testenv/kwok-stages.yaml
	@echo "testenv: building etcd, kube-apiserver, kube-controller-manager and kube-scheduler $(K8S_VERSION) from the official Go modules."
	@echo "testenv: the first build downloads the modules and compiles Kubernetes; that takes a while (minutes), later builds are cached."
	@mkdir -p $(dir $@)
	cd testenv && $(GO) build -buildvcs=false -ldflags "$(GO_LDFLAGS)" -o $@ .
	@ln -sfn testenv $(dir $@)kubectl
	@echo "testenv: built $@ ($$($@ version)), with kubectl at $(dir $@)kubectl"

# testenv dispatches on its name, so the symlink is the real kubectl of the same version.
kubectl: $(TESTENV) ## kubectl of the same Kubernetes version, for the local control plane: target/testenv/bin/kubectl
	@[ -L $(TESTENV_DIR)/bin/kubectl ] || ln -sfn testenv $(TESTENV_DIR)/bin/kubectl

cluster-up: testenv ## start the local control plane in the background; kubeconfig at target/testenv/kubeconfig
	$(TESTENV) up --dir $(TESTENV_DIR) --detach

cluster-down: ## stop the local control plane and remove its data
	@if [ -x $(TESTENV) ]; then $(TESTENV) down --dir $(TESTENV_DIR); \
	else rm -rf $(TESTENV_DIR)/data $(KUBECONFIG_TESTENV) $(TESTENV_DIR)/state.json $(TESTENV_DIR)/testenv.pid; fi

cluster-status: ## is the local control plane running?
	@$(TESTENV) status --dir $(TESTENV_DIR)

demo: ## the main job end to end on a private control plane in target/demo (DEMO_OPERATOR=path to use another binary)
	@scripts/demo.sh

# Five scenarios (latency, fan-out, memory at scale, API cost, burst) on a fresh local control
# plane, or on BENCH_KUBECONFIG's cluster. BENCH_SCALE=0.1 for a quick run; BENCH_OPERATOR="path
# args…" measures another binary (BENCH_OPERATOR_FLAGS=none: no flags added, e.g. stakater's).
# The shipped (musl, static) binary and the glibc build, one after the other on the same control
# plane setup; target/bench/report.md has both side by side.
MUSL := x86_64-unknown-linux-musl
bench: testenv release $(HELM) ## benchmarks of the glibc and the shipped musl build: target/bench/report.md
	$(MAKE) release TARGET=$(MUSL)
	BENCH_LABEL=glibc BENCH_OUT=target/bench/glibc $(CARGO) bench --locked --bench cluster
	BENCH_LABEL=musl BENCH_OUT=target/bench/musl BENCH_OPERATOR=target/$(MUSL)/release/reloader \
		BENCH_COMPARE=target/bench/glibc/report.json $(CARGO) bench --locked --bench cluster

# stakater/Reloader built from its Go module (tools/stakater-reloader pins it), to be measured
# beside this operator. Only v1.4.22 of it is served by the module proxy here.
STAKATER := $(CURDIR)/target/tools/bin/stakater-reloader
stakater-reloader: $(STAKATER) ## build stakater/Reloader pinned in tools/stakater-reloader
$(STAKATER): tools/stakater-reloader/go.mod tools/stakater-reloader/go.sum
	@mkdir -p $(dir $@)
	cd tools/stakater-reloader && $(GO) build -buildvcs=false -ldflags "-s -w" -o $@ github.com/stakater/Reloader

# One control plane per run, the same scenarios, one after the other: stakater/Reloader as
# its own ClusterRole's ServiceAccount, this operator (the shipped musl build) as the chart's,
# the glibc build of it, and the shipped build with Reloader's debounce (none). Side by side:
# target/bench/compare.md.
COMPARE_RUNS := stakater reloader reloader-glibc reloader-debounce0
# The memory scenario of the shipped build at several scales (BENCH_SCALE: 1 is 10,000 Secrets,
# 5,000 ConfigMaps, 2,000 Deployments), one control plane per scale, merged with the slope:
# target/bench/curve.md. CURVE_SCALES="0.1 0.2" for a quick look.
CURVE_SCALES ?= 1 2 5
bench-curve: testenv $(HELM) ## memory at scale 1, 2 and 5, with RSS per additional source: target/bench/curve.md
	$(MAKE) release TARGET=$(MUSL)
	@for s in $(CURVE_SCALES); do \
		echo "bench-curve: scale $$s"; \
		BENCH_LABEL="reloader (musl)" BENCH_OUT=target/bench/curve-$$s BENCH_SCALE=$$s BENCH_SCENARIOS=scale \
			BENCH_OPERATOR=target/$(MUSL)/release/reloader $(CARGO) bench --locked --bench cluster || exit 1; \
	done
	BENCH_CURVE=$(subst $(eval) ,$(comma),$(foreach s,$(CURVE_SCALES),target/bench/curve-$(s)/report.json)) \
		$(CARGO) bench --locked --bench cluster

bench-compare: testenv $(HELM) $(STAKATER) ## this operator and stakater/Reloader through the same scenarios: target/bench/compare.md
	$(MAKE) release
	$(MAKE) release TARGET=$(MUSL)
	BENCH_LABEL=stakater/Reloader BENCH_OUT=target/bench/compare-stakater BENCH_OPERATOR=$(STAKATER) \
		BENCH_OPERATOR_FLAGS=none BENCH_READY_URL=http://127.0.0.1:9090/metrics BENCH_IDENTITY=stakater \
		$(CARGO) bench --locked --bench cluster
	BENCH_LABEL="reloader (musl, shipped)" BENCH_OUT=target/bench/compare-reloader \
		BENCH_OPERATOR=target/$(MUSL)/release/reloader $(CARGO) bench --locked --bench cluster
	BENCH_LABEL="reloader (glibc)" BENCH_OUT=target/bench/compare-reloader-glibc \
		BENCH_OPERATOR=target/release/reloader $(CARGO) bench --locked --bench cluster
	BENCH_LABEL="reloader --debounce 0s" BENCH_OUT=target/bench/compare-reloader-debounce0 \
		BENCH_OPERATOR="target/$(MUSL)/release/reloader --debounce 0s" $(CARGO) bench --locked --bench cluster
	BENCH_MERGE=$(subst $(eval) ,$(comma),$(foreach r,$(COMPARE_RUNS),target/bench/compare-$(r)/report.json)) \
		$(CARGO) bench --locked --bench cluster

# stakater/Reloader's own load-test scenarios (S1–S13 of its test/loadtest framework, written
# anew in benches/loadtest.rs: the module proxy does not serve that nested module) on one local
# control plane with kwok nodes, for stakater/Reloader (its ClusterRole's ServiceAccount), the
# shipped musl build (the chart's) and the same with --debounce 0s; the framework's pass/fail
# rules, side by side: target/bench/loadtest.md. LOADTEST_SCALE=0.1 for a quick run (17 minutes
# after the builds; the full run an estimated 1.5 hours), LOADTEST_SCENARIOS=S1,S2 and
# LOADTEST_RUNS=stakater,reloader to run fewer.
bench-loadtest: testenv $(HELM) $(STAKATER) ## stakater/Reloader's load-test scenarios S1-S13, it and this operator side by side: target/bench/loadtest.md
	$(MAKE) release TARGET=$(MUSL)
	$(CARGO) bench --locked --bench loadtest

comma := ,

clean: cluster-down
	$(CARGO) clean
