# BYOH — build, test and generate. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
CONFIG_DIR := controller/config

.PHONY: e2e demo demo-down
.PHONY: all build test test-unit test-integration bench bench-scale lint fmt verify manifests clean packages image lint-packages release check-links

all: build

## build: compile every crate (debug)
build:
	$(CARGO) build --workspace --all-targets

## test: everything CI runs — unit tests, packages (built and linted) and the controller image,
## then integration and system tests on the real test bed (tests/tests/packages.rs installs the
## .deb on a booted host from dist/)
test: verify test-unit packages lint-packages image test-integration

## test-unit: fast tests of pure logic (no API server, no hosts)
test-unit:
	$(CARGO) test --workspace --exclude byoh-tests

## test-integration: starts the test bed (control plane, host image), runs tests/, stops it
test-integration:
	tests/run

## e2e: only the end-to-end test (docs/e2e.md): a real `kubeadm join` of a host running the
## packaged agent, driven by a Machine, and its release; `make test` runs it with the rest
e2e: packages
	tests/run $(CARGO) test -p byoh-tests --test e2e -- --nocapture

## demo: Cluster API's managers and BYOH make a cluster (control plane + worker) on two hosts,
## narrated; runs until Ctrl-C or demo-down from another terminal (docs/e2e.md).
demo:
	tests/demo/up

demo-down:
	tests/demo/down

## bench: speed and memory figures on the real test bed (the agent from its amd64 .deb,
## installed and started as an operator does); prints one line each
bench:
	packaging/build-packages --arch amd64
	tests/run $(CARGO) bench -p byoh-tests

## bench-scale: only the live-agents load benchmark (issue 19): N simulated agents, each with its
## own certificate, against the test control plane (N from BYOH_BENCH_AGENTS, default 100,500)
bench-scale:
	tests/run $(CARGO) bench -p byoh-tests --bench live_agents

## lint: rustfmt, clippy and rustdoc (doc links) with warnings as errors
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --document-private-items --quiet

fmt:
	$(CARGO) fmt --all

## manifests: regenerate the CRDs and clusterctl artifacts, and docs/agent.md, from the Rust code
manifests:
	$(CARGO) run --quiet -p byoh-controller -- manifests --dir $(CONFIG_DIR)
	$(CARGO) run --quiet -p byoh-agent -- gen-docs agent > docs/agent.md

## check-links: relative links and #anchors in every *.md (lychee, offline; build-support/check-links)
check-links:
	build-support/check-links

## verify: lint, links, and fail if generated files differ from what the code generates
verify: lint check-links
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(CARGO) run --quiet -p byoh-controller -- manifests --dir "$$tmp" >/dev/null; \
	if ! diff -r "$$tmp" $(CONFIG_DIR); then \
	  echo "verify: $(CONFIG_DIR) differs from what the code generates; run 'make manifests' and commit" >&2; exit 1; \
	fi; \
	echo "verify: generated manifests are up to date"
	@if ! $(CARGO) run --quiet -p byoh-agent -- gen-docs agent | diff - docs/agent.md; then \
	  echo "verify: docs/agent.md differs from what the code generates; run 'make manifests' and commit" >&2; exit 1; \
	fi; \
	echo "verify: docs/agent.md is up to date"

## packages: the four byoh-agent packages (deb/rpm × amd64/arm64) in dist/ (docs/packaging.md)
packages:
	packaging/build-packages

## lint-packages: lintian (0 errors, 0 warnings) on both .debs, rpmlint (0 errors) on both .rpms.
## Not part of verify: building packages takes minutes; `make test` runs it after `packages`.
lint-packages: packages
	packaging/lint-packages

## image: the controller image as an OCI archive, dist/byoh-controller-<ver>.oci.tar (no Docker)
image:
	packaging/build-image

## release: a release in dist/ for VERSION (= the workspace version in Cargo.toml): packages,
## image, clusterctl manifests and templates, SHA256SUMS, and the clusterctl repository
## dist/repository/infrastructure-byoh/v$(VERSION)/ (docs/release.md)
release:
	@[[ -n "$(VERSION)" ]] || { echo "usage: make release VERSION=x.y.z" >&2; exit 2; }
	packaging/release $(VERSION)

clean:
	$(CARGO) clean
