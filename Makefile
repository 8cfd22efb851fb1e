# BYOH — build, test and generate. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
CONFIG_DIR := controller/config

.PHONY: all build test test-unit test-integration bench lint fmt verify manifests clean

all: build

## build: compile every crate (debug)
build:
	$(CARGO) build --workspace --all-targets

## test: everything CI runs — unit tests, then integration and system tests on the real test bed
test: verify test-unit test-integration

## test-unit: fast tests of pure logic (no API server, no hosts)
test-unit:
	$(CARGO) test --workspace --exclude byoh-tests

## test-integration: starts the test bed (control plane, host image), runs tests/, stops it
test-integration:
	tests/run

## bench: speed and memory figures on the real test bed (release builds); prints one line each
bench:
	$(CARGO) build --release -p byoh-agent
	tests/run $(CARGO) bench -p byoh-tests

## lint: rustfmt and clippy with warnings as errors
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## manifests: regenerate the CRDs and clusterctl artifacts from the Rust code
manifests:
	$(CARGO) run --quiet -p byoh-controller -- manifests --dir $(CONFIG_DIR)

## verify: lint, and fail if generated files differ from what the code generates
verify: lint
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(CARGO) run --quiet -p byoh-controller -- manifests --dir "$$tmp" >/dev/null; \
	if ! diff -r "$$tmp" $(CONFIG_DIR); then \
	  echo "verify: $(CONFIG_DIR) differs from what the code generates; run 'make manifests' and commit" >&2; exit 1; \
	fi; \
	echo "verify: generated manifests are up to date"

clean:
	$(CARGO) clean
