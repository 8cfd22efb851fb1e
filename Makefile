# BYOH — build, test and generate. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
CONFIG_DIR := controller/config

.PHONY: e2e demo demo-down
.PHONY: all build build-debug test test-unit test-integration bench bench-scale lint fmt verify manifests clean packages image lint-packages release check-links

all: build

## build: compile every crate (debug)
build:
	$(CARGO) build --workspace --all-targets

## test: everything CI runs, as one graph of timed phases, several at once (docs/local_dev.md,
## "How make test runs"): what the system tests need first (the test bed's programs and images,
## the debug builds, the amd64 .deb); the tests as soon as those are there, those of the other
## packages and the image (tests/tests/packages.rs, packages_rpm.rs, release.rs, docs.rs) among
## them once those exist; verify, the other packages (arm64, .rpm), the controller image and the
## package lints beside them at a lower CPU priority. `make -k`: a failed phase stops only what needs it, so one run shows every
## failure. Ends with each phase's wall time and the test count.
test:
	@if [[ -z "$${BYOH_PHASE_EPOCH:-}" ]]; then rm -f $(PHASE_LOG) $(TEST_COUNTS); BYOH_PHASE_EPOCH=$$(date +%s); fi; \
	export BYOH_PHASE_EPOCH; mkdir -p target; rm -f $(LATE_GATE); rc=0; \
	$(MAKE) --no-print-directory -k -j$(TEST_JOBS) test-phases || rc=$$?; \
	build-support/phase --table; \
	echo "make test: $$(( $$(date +%s) - BYOH_PHASE_EPOCH )) s in all (from the start of .ci/run under CI)"; \
	[[ ! -f $(TEST_COUNTS) ]] || awk '{ p += $$1; f += $$2; i += $$3 } END { printf "tests: %d passed, %d failed, %d ignored\n", p, f, i }' $(TEST_COUNTS); \
	exit $$rc

## The phases of `make test` (each one timed by build-support/phase; the names are those of the
## table it ends with). At most TEST_JOBS phases at once; cargo and go use both cores anyway.
TEST_JOBS ?= 4
PHASE := build-support/phase
PHASE_LOG := target/phases.txt
TEST_COUNTS := target/test-counts.txt
# Phases no test waits for: they get the CPU the tests leave (most test time waits on kubeadm,
# systemd and the API server).
BACKGROUND := nice -n 10
# The phases the tests wait for most (see phase-prepare and phase-packages-rest).
CRITICAL := nice -n -5
# Tests that need every package (arm64 and the .rpm too) and the image (a release laid out from
# dist/ by `packaging/release --no-build`): held back in the tests phase until LATE_GATE says "ok"
# (tests/schedule --after), written once the other packages and the image are built, or
# "failed" by the phase that failed.
LATE_TESTS := packages release docs packages_rpm ansible
LATE_GATE := target/late-tests-gate
export BYOH_TEST_COUNTS := $(abspath $(TEST_COUNTS))
.PHONY: test-phases phase-prepare phase-build phase-packaging-tools phase-packages-amd64 \
	phase-tests phase-verify phase-packages-rest phase-image phase-lint-packages phase-late-gate
test-phases: phase-tests phase-verify phase-lint-packages phase-late-gate
# The test bed's serial chain of Go builds and images is what a bare machine's tests wait for
# longest; the Rust builds beside it (needed as well, but parallel to the last crate) fill its
# gaps. On a warm machine it takes a second.
phase-prepare:
	@$(PHASE) prepare $(CRITICAL) tests/prepare
phase-build:
	@$(PHASE) build $(MAKE) --no-print-directory build-debug
phase-packaging-tools:
	@$(PHASE) packaging-tools packaging/build-packages --tools-only --format deb
phase-packages-amd64: phase-packaging-tools
	@$(PHASE) packages-amd64 packaging/build-packages --arch amd64 --format deb
phase-tests: phase-prepare phase-build phase-packages-amd64
	@BYOH_TEST_PREBUILT=1 $(PHASE) tests tests/run tests/schedule --not doc-tests $(foreach t,$(LATE_TESTS),--after $(LATE_GATE) $(t))
# The doc tests run here, after clippy and rustdoc: `cargo test --doc` needs cargo's lock on
# target/, which verify holds for minutes, and in the tests phase it held one of the scheduler's
# slots while it waited (866 s of a warm run).
phase-verify: phase-build
	@$(PHASE) verify $(BACKGROUND) sh -c '$(MAKE) --no-print-directory verify && BYOH_TEST_PREBUILT=1 tests/schedule doc-tests'
# The arm64 build's whole-program link is one thread of a few minutes that the late tests wait
# for: it goes before the tests' own work (which mostly waits on kubeadm, systemd and the API
# server). Without root, nice warns and runs it at the normal priority. It and the image start
# once the test bed is prepared: on a bare machine the bed's Go builds are what the tests wait
# for longest, and beside them these two (the arm64 build from nothing at that priority) held
# the tests back by minutes (issue 35); on a warm one `prepare` takes a second.
phase-packages-rest: phase-packages-amd64 phase-prepare
	@$(PHASE) packages-rest $(CRITICAL) packaging/build-packages || { echo "failed: packages-rest" >$(LATE_GATE); exit 1; }
phase-image: phase-packages-amd64 phase-prepare
	@$(PHASE) image packaging/build-image || { echo "failed: image" >$(LATE_GATE); exit 1; }
phase-late-gate: phase-packages-rest phase-image
	@echo ok >$(LATE_GATE)
phase-lint-packages: phase-packages-rest
	@$(PHASE) lint-packages $(BACKGROUND) packaging/lint-packages

## build-debug: the debug build tests run (every binary, every test target), in one feature
## resolution for the whole workspace, so no later command rebuilds a dependency
## (the test executables are listed in target/test-binaries.json, cargo's messages, which
## tests/schedule reads under `make test`: BYOH_TEST_PREBUILT=1)
build-debug:
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --no-run --message-format=json-render-diagnostics >target/test-binaries.json.new
	mv target/test-binaries.json.new target/test-binaries.json

## test-unit: fast tests of pure logic (no API server, no hosts)
test-unit:
	$(CARGO) test --workspace --exclude byoh-tests

## test-integration: starts the test bed (control plane, host image), runs every test binary of
## the workspace (tests/schedule: unit, integration and system tests, several at once), stops it
test-integration: build-debug
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
	$(CARGO) build --quiet --workspace --bins
	target/debug/byoh-controller manifests --dir $(CONFIG_DIR)
	target/debug/byoh-agent gen-docs agent > docs/agent.md

## check-links: relative links and #anchors in every *.md (lychee, offline; build-support/check-links)
check-links:
	build-support/check-links

## verify: lint, links, and fail if generated files differ from what the code generates (with
## the debug binaries of build-debug, so verify builds nothing the tests do not)
verify: lint check-links
	@$(CARGO) build --quiet --workspace --bins
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	target/debug/byoh-controller manifests --dir "$$tmp" >/dev/null; \
	if ! diff -r "$$tmp" $(CONFIG_DIR); then \
	  echo "verify: $(CONFIG_DIR) differs from what the code generates; run 'make manifests' and commit" >&2; exit 1; \
	fi; \
	echo "verify: generated manifests are up to date"
	@if ! target/debug/byoh-agent gen-docs agent | diff - docs/agent.md; then \
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
