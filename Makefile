# cached-apiserver developer entry points. `make run` and `make test` are the
# README's two commands.
SHELL := /usr/bin/env bash
GO ?= go
BIN := bin
# Tests start real etcd and servers; two cores want few packages at once.
TEST_FLAGS ?= -count=1 -p 2 -timeout 45m

.PHONY: all build run kubectl test test-unit test-race test-integration generate verify bench bench-http clean

all: build

build:
	$(GO) build -o $(BIN)/cached-apiserver ./cmd/cached-apiserver

run: build
	$(BIN)/cached-apiserver

## kubectl: build upstream kubectl (k8s.io/kubectl, pinned in go.mod) into bin/.
kubectl:
	hack/build-kubectl.sh

## test: every unit and integration test, with -race on the watch cache.
test: test-unit test-race test-integration

test-unit:
	$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v -e /test/integration -e /pkg/storage/cacher)

test-race:
	$(GO) test $(TEST_FLAGS) -race ./pkg/storage/cacher/...

test-integration:
	$(GO) test $(TEST_FLAGS) ./test/integration/...

## bench: the short comparison with upstream's Cacher and raw etcd3 (under a minute), with
## a chart in bin/bench-fanout.png. docs/benchmarks.md has the full set and how to reproduce it.
BENCH_FILTER ?= BenchmarkFanOut$$/watchers=1000$$|BenchmarkFanOutFixedRate/watchers=1000$$|BenchmarkSlowWatchers|BenchmarkSelectiveWatchers/watchers=1000$$|BenchmarkIdleWatcherMemory
bench:
	mkdir -p $(BIN)
	$(GO) test -run '^$$' -bench '$(BENCH_FILTER)' -benchtime=1x -timeout 30m ./pkg/storage/cacher/ \
	  -args -chart=$(CURDIR)/$(BIN)/bench-fanout.png | grep -E '^(Benchmark|ok|FAIL)'

## bench-http: real HTTP watch streams against our server and the same server over
## upstream's Cacher, each with etcd and the load client in their own processes (~3 min).
bench-http:
	cd test/bench && $(GO) test -run '^$$' -bench BenchmarkHTTPWatch -benchtime=1x -timeout 30m . | grep -E '^(Benchmark|ok|FAIL)'

generate:
	hack/update-codegen.sh

verify:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^pkg/generated/')); \
	  if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	hack/verify-codegen.sh

clean:
	rm -rf $(BIN) .cached-apiserver
