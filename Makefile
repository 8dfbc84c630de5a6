# cached-apiserver developer entry points. `make run` and `make test` are the
# README's two commands.
SHELL := /usr/bin/env bash
GO ?= go
BIN := bin
# Tests start real etcd and servers; two cores want few packages at once.
TEST_FLAGS ?= -count=1 -p 2 -timeout 45m

.PHONY: all build image runc run kubectl kube-apiserver test test-unit test-race test-inject test-integration test-faults test-examples test-bench fuzz chaos chaos-load soak robustness generate verify bench bench-store bench-http bench-agents bench-scale bench-lists bench-memory bench-million bench-watchlist-writes bench-read-after-write bench-serve bench-serve-aggregated bench-gates clean

all: build

# VERSION is what --version prints.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Static (no cgo), so that it runs in the image's empty filesystem.
build:
	CGO_ENABLED=0 $(GO) build -ldflags "-X github.com/cached-apiserver/cached-apiserver/pkg/version.Version=$(VERSION)" \
	  -o $(BIN)/cached-apiserver ./cmd/cached-apiserver

## image: the image users deploy, as the Dockerfile describes it, built without a container engine
## (hack/build-image.sh, hack/image): written to bin/image.tar, which docker load and podman load read,
## after a push to and pull by digest from an in-process registry. IMAGE names it; it prints the
## reference hack/render-manifests.sh -image takes, and the image's files.
IMAGE ?= cached-apiserver:$(VERSION)
image:
	VERSION=$(VERSION) IMAGE=$(IMAGE) hack/build-image.sh

## runc: install runc from Debian's packages when missing, for the image test.
runc:
	hack/install-runc.sh

## run: serve with embedded etcd. RUN_ARGS passes flags, e.g. sharded list and
## watch (alpha, off by default as upstream):
##   make run RUN_ARGS=--feature-gates=ShardedListAndWatch=true
RUN_ARGS ?=
run: build
	$(BIN)/cached-apiserver $(RUN_ARGS)

## kubectl: build upstream kubectl (k8s.io/kubectl, pinned in go.mod) into bin/.
kubectl:
	hack/build-kubectl.sh

## kube-apiserver: build upstream's kube-apiserver (k8s.io/kubernetes, pinned in the separate
## module hack/kube-apiserver) into bin/, for the control-plane tests. Cached like kubectl.
kube-apiserver:
	hack/build-kube-apiserver.sh

## test: every unit and integration test, with -race on the watch cache and
## a bounded run of its randomized robustness profiles, the bugs of issue 56
## put back and caught, and the fault suite: every scenario against our
## server, leader loss, replica killed and the rolling restart against the
## upstream-wired one too, two injected bugs the harness must catch, and
## a member killed under load (2,110 streams, 100 writes/s; make chaos-load);
## last, bench-million's smoke run.
test: test-unit test-race test-inject test-integration test-faults test-examples test-bench

test-unit:
	$(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v -e /test/integration -e /test/faults -e /pkg/storage/cacher)

# One seed of each robustness profile under -race; make robustness runs 20.
test-race:
	ROBUSTNESS_SEEDS=1 $(GO) test $(TEST_FLAGS) -race ./pkg/storage/cacher/...

# The faultinject build puts each bug back; the robustness runs must catch it.
# Two runs with failpoints armed at random inside the cache's transitions
# (make robustness runs ROBUSTNESS_FAILPOINT_SEEDS, 200); the failpoints' own tests.
test-inject:
	$(GO) test $(TEST_FLAGS) -tags faultinject ./internal/inject/
	ROBUSTNESS_FAILPOINT_SEEDS=2 $(GO) test $(TEST_FLAGS) -tags faultinject \
	  -run '^(TestRobustnessCatchesInjectedBugs|TestRobustnessFailpoints)$$' ./pkg/storage/cacher/

# The control-plane tests run bin/kube-apiserver, and the image test the
# image under runc: build and install them first, outside the tests'
# timeout (a few minutes cold, little when cached).
test-integration: kube-apiserver image runc
	$(GO) test $(TEST_FLAGS) ./test/integration/...

test-faults:
	$(GO) test $(TEST_FLAGS) ./test/faults/...

# examples/, hack/promql, hack/image and hack/cpuowners are modules of their
# own (their dependencies are never the server's); the example's test runs
# through our cache.
test-examples:
	cd examples/sample-apiserver && $(GO) test $(TEST_FLAGS) ./...
	cd hack/promql && $(GO) test $(TEST_FLAGS) ./...
	cd hack/image && $(GO) test $(TEST_FLAGS) ./...
	cd hack/cpuowners && $(GO) test $(TEST_FLAGS) ./...

# The smoke run of bench-million: 20,000 objects, both servers, one round, every
# phase cut short. It checks that the harness works (the load, what the server
# stores, each server's turn, every figure), not a figure (about 45 s).
test-bench:
	cd test/bench && MILLION_OBJECTS=20000 MILLION_IMPLS=ours,upstream MILLION_ALT= MILLION_ROUNDS=1 \
	  MILLION_STEADY_SECONDS=2 MILLION_LIST_REPEATS=1 MILLION_WATCHLISTS=2 MILLION_WRITES_ALONE=100 \
	  $(GO) test -count=1 -run '^$$' -bench '^BenchmarkMillion$$' -benchtime=1x -timeout 10m .

## fuzz: hostile reads (test/fuzz) against an in-process server, and hostile compressed records
## against the cache's decompression (issue 67), FUZZTIME per target (10m); the seed corpora run in
## make test. A crasher lands in the package's testdata/fuzz: commit it.
FUZZTIME ?= 10m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzReads$$' -fuzztime $(FUZZTIME) ./test/fuzz
	$(GO) test -run '^$$' -fuzz '^FuzzContinue$$' -fuzztime $(FUZZTIME) ./test/fuzz
	$(GO) test -run '^$$' -fuzz '^FuzzDecompress$$' -fuzztime $(FUZZTIME) ./pkg/storage/cacher/internal/compress

## chaos: every fault scenario against our server and the upstream-wired one,
## and every injected cache bug, CHAOS_COUNT times (about 12 minutes a time);
## the table (sums, and median and range of the times) goes to bin/chaos.md
## and into docs/reliability.md by hand.
CHAOS_COUNT ?= 1
chaos:
	mkdir -p $(BIN)
	rm -f $(BIN)/chaos.md
	$(GO) test -count=$(CHAOS_COUNT) -timeout 120m -v ./test/faults/ -args -chaos -report $(CURDIR)/$(BIN)/chaos.md

## chaos-load: faults under load (kill-9 of the member, leader loss, blackhole 15 s, server restart, and
## the random moment at 5,000 streams at most, all it fits on 2 cores), against our server and the
## upstream-wired one, CHAOS_LOAD_COUNT times (about 20 minutes a time): CHAOS_LOAD_STREAMS (20,000)
## single-object watches by name, 100 namespace watches and 10 on everything (3 slow), 100 object
## writes/s with transactions among the watched objects straight to etcd. Violations, client re-lists,
## recovery p50/p99 and the server's RSS after recovery against before; the tables go to
## bin/chaos-load.md. SEED=n replays a run's traffic.
CHAOS_LOAD_COUNT ?= 1
CHAOS_LOAD_STREAMS ?= 20000
chaos-load:
	mkdir -p $(BIN)
	rm -f $(BIN)/chaos-load.md
	$(GO) test -count=$(CHAOS_LOAD_COUNT) -timeout 240m -v -run '^TestUnderLoad$$' ./test/faults/ \
	  -args -chaos-load -load.streams $(CHAOS_LOAD_STREAMS) -seed $(SEED) -report $(CURDIR)/$(BIN)/chaos-load.md

## robustness: every watch guarantee over randomized traffic, ROBUSTNESS_SEEDS (20) seeds of each
## profile: the cache-level runs (ours and upstream's Cacher over one etcd: transactions and leases
## beside the etcd3 store, an idle resource, compactions, restarts), then ROBUSTNESS_FAILPOINT_SEEDS
## (200) runs with the cache's failpoints armed at random inside its transitions (the faultinject
## build; safety and liveness), the bugs that leave a cache stuck put back and caught (make test
## catches the others), then the HTTP scenarios that carry the same shapes, against both
## servers. Each run prints its seed; the tables go to bin/robustness-cache.txt,
## bin/robustness-failpoints.txt and bin/robustness.md.
ROBUSTNESS_SEEDS ?= 20
ROBUSTNESS_FAILPOINT_SEEDS ?= 200
ROBUSTNESS_SCENARIOS ?= baseline|server_restart_over_a_compacted_etcd|replica_restart,_writes_through_another|leader_loss
robustness:
	mkdir -p $(BIN)
	rm -f $(BIN)/robustness.md
	set -o pipefail; ROBUSTNESS_SEEDS=$(ROBUSTNESS_SEEDS) $(GO) test -count=1 -timeout 180m -v -run '^TestRobustness$$' \
	  ./pkg/storage/cacher/ | tee $(BIN)/robustness-cache.txt | grep -E '^(---|ok|FAIL)|\|'
	set -o pipefail; ROBUSTNESS_FAILPOINT_SEEDS=$(ROBUSTNESS_FAILPOINT_SEEDS) $(GO) test -tags faultinject -count=1 -timeout 240m -v \
	  -run '^TestRobustnessFailpoints$$' ./pkg/storage/cacher/ | tee $(BIN)/robustness-failpoints.txt | grep -E '^(---|ok|FAIL)|\|'
	$(GO) test -tags faultinject -count=1 -timeout 30m -run '^TestRobustnessCatchesStuckCaches$$' ./pkg/storage/cacher/
	$(GO) test -count=$(ROBUSTNESS_SEEDS) -timeout 240m -v -run 'TestFaults/($(ROBUSTNESS_SCENARIOS))/' ./test/faults/ \
	  -args -chaos -report $(CURDIR)/$(BIN)/robustness.md

## soak: the chaos soak, SOAK long (30m) against each server in turn: etcd and network faults
## drawn at random times from SEED (0: from the clock; the log prints it, and the same seed
## draws the same faults), invariants checked over the whole run, and a leak check at the end.
SOAK ?= 30m
SEED ?= 0
soak:
	$(GO) test -count=1 -timeout 150m -v -run '^TestFaults$$' ./test/faults/ -args -chaos -soak $(SOAK) -seed $(SEED)

## bench: the short comparison with upstream's Cacher and raw etcd3 (about a minute): prints
## the table (median and range of BENCH_COUNT repeats, ratio to upstream), keeps the raw output
## in bin/bench.txt and draws bin/bench-fanout.png. docs/benchmarks.md has the full set.
BENCH_FILTER ?= BenchmarkFanOut$$/watchers=1000$$|BenchmarkFanOutFixedRate/watchers=1000$$|BenchmarkSlowWatchers|BenchmarkSelectiveWatchers/watchers=1000$$|BenchmarkIdleWatcherMemory|BenchmarkNonMatchingWatchers/by=name|BenchmarkShardedWatchers
BENCH_COUNT ?= 1
bench:
	mkdir -p $(BIN)
	set -o pipefail; $(GO) test -run '^$$' -bench '$(BENCH_FILTER)' -benchtime=1x -count=$(BENCH_COUNT) -timeout 60m \
	  ./pkg/storage/cacher/ -args -chart=$(CURDIR)/$(BIN)/bench-fanout.png \
	  | tee $(BIN)/bench.txt | $(GO) run ./hack/tools/benchtable

## bench-store: upstream's RunBenchmarkWriteThroughput and RunBenchmarkStoreList against
## both caches (about 10 s a repeat); raw output in bin/bench-store.txt.
bench-store:
	mkdir -p $(BIN)
	set -o pipefail; $(GO) test -run '^$$' -bench BenchmarkUpstreamStore -benchtime=200x -count=$(BENCH_COUNT) \
	  -timeout 60m ./pkg/storage/cacher/ 2>/dev/null | tee $(BIN)/bench-store.txt | $(GO) run ./hack/tools/benchtable

## bench-http: real HTTP watch streams against our server and the same server over
## upstream's Cacher, each with etcd and the load client in their own processes: the
## fan-out scenarios (~2 min a repeat) and the agents workload (~12 min a repeat).
bench-http:
	mkdir -p $(BIN)
	set -o pipefail; cd test/bench && $(GO) test -run '^$$' -bench 'BenchmarkHTTPWatch|BenchmarkAgents' -benchtime=1x \
	  -count=$(BENCH_COUNT) -timeout 180m . | tee $(CURDIR)/$(BIN)/bench-http.txt | $(GO) run ../../hack/tools/benchtable

## bench-agents: the agents workload alone: 20,000 single-object HTTP/2 watch streams, 20
## controllers on everything and 4 sharded ones, 100 creates/s; checks the watch-latency
## objective (docs/operations.md). AGENTS_STREAMS, AGENTS_WRITES, AGENTS_RATE and
## AGENTS_IDLE_SECONDS change the scale.
bench-agents:
	mkdir -p $(BIN)
	set -o pipefail; cd test/bench && $(GO) test -run '^$$' -bench BenchmarkAgents -benchtime=1x \
	  -count=$(BENCH_COUNT) -timeout 180m . | tee $(CURDIR)/$(BIN)/bench-agents.txt | $(GO) run ../../hack/tools/benchtable

## bench-scale: data at scale (10,000 and 100,000 objects of 1 KiB, 10,000 of 10 KiB) through our
## server and the upstream-wired one, each with its own etcd in its own process: memory, list
## latencies, concurrent lists, watch-lists beside writes, restarts (about 20 min a repeat). The
## table goes to stdout, the raw output to bin/bench-scale.txt, a chart of the ratios to bin/bench-scale.png.
SCALE_FILTER ?= BenchmarkScale
bench-scale:
	mkdir -p $(BIN)
	set -o pipefail; cd test/bench && $(GO) test -run '^$$' -bench '$(value SCALE_FILTER)' -benchtime=1x \
	  -count=$(BENCH_COUNT) -timeout 180m . | tee $(CURDIR)/$(BIN)/bench-scale.txt \
	  | $(GO) run ../../hack/tools/benchtable -chart $(CURDIR)/$(BIN)/bench-scale.png -title "make bench-scale: ours ÷ upstream"

# turns-bench runs benchmark $(1), whose servers take turns over one etcd loaded once, for $(2)_ROUNDS
# rounds within timeout $(3); its raw output goes to bin/<target>.txt, its table to stdout.
define turns-bench
	mkdir -p $(BIN)
	set -o pipefail; cd test/bench && $(2)_ROUNDS=$($(2)_ROUNDS) $(GO) test -run '^$$' \
	  -bench $(1) -benchtime=1x -timeout $(3) . | tee $(CURDIR)/$(BIN)/$@.txt \
	  | $(GO) run ../../hack/tools/benchtable
endef

## bench-read-after-write: a consistent read right after a write, and the write's delivery to 50
## watchers, p50 and p99, the servers taking turns over one etcd for FRESH_ROUNDS rounds (~1 min a
## round); FRESH_ALT=path,… adds other server binaries (issue 56's A/B, docs/benchmarks.md).
FRESH_ROUNDS ?= 3
bench-read-after-write:
	$(call turns-bench,BenchmarkReadAfterWrite,FRESH,60m)

## bench-lists: a Table in pages of 500 and a v1alpha1 list, the two that decode every object, one at a time;
## then 8 and 32 full lists of 100,000 objects at once, and 8 at v1alpha1: the RSS they add and the time to
## the last; the servers taking turns over one etcd loaded once, for LISTS_ROUNDS rounds.
## LISTS_ALT=path,… adds other server binaries.
LISTS_ROUNDS ?= 3
bench-lists:
	$(call turns-bench,BenchmarkConcurrentLists,LISTS,120m)

## bench-memory: the heap an object of 1 KiB takes once the cache holds 100,000, with and without
## history, and the time to ready after a restart, the servers taking turns over one etcd loaded once,
## for MEMORY_ROUNDS rounds (a few minutes). MEMORY_ALT=path,… adds other server binaries;
## MEMORY_UPDATED=50 then updates half the objects and measures what the cache still holds.
MEMORY_ROUNDS ?= 3
bench-memory:
	$(call turns-bench,BenchmarkObjectMemory,MEMORY,60m)

## bench-million: issue 66's measure at a million objects (docs/benchmarks.md, A million objects):
## MILLION_OBJECTS (1,000,000) Assignments of MILLION_BYTES (1024) bytes of JSON written straight into one
## etcd, MILLION_PER_REVISION (128; 1 writes one a revision) to a transaction, then each server in turn over
## it, put back as loaded: cold start and warm restart (/readyz, first list at 0, peak RSS and heap), the
## steady RSS and heap MILLION_STEADY_SECONDS (120) after ready beside 100 writes/s, full lists (one request,
## gzip or not, at 0, pages of 500 as Tables and JSON: time and CPU), selectors, MILLION_WATCHLISTS (10)
## watch-lists and 8 full lists at once (RSS added, writes' p99 beside), for MILLION_ROUNDS rounds (1; 3 at
## 300,000). MILLION_IMPLS, MILLION_ALT=path,… pick the servers; MILLION_STARTS_ONLY=1 ends each turn after
## its starts, for rounds of them. Never both servers at once: memory.
MILLION_ROUNDS ?= 1
bench-million:
	$(call turns-bench,BenchmarkMillion,MILLION,300m)

## bench-watchlist-writes: the writes' p99 beside 100 concurrent watch-lists of 10,000 objects, against
## the same writes alone, our server and upstream's taking turns over one etcd loaded once, for
## WATCHLIST_ROUNDS rounds (about 3 min a round). WATCHLIST_ALT=path,… adds other server binaries.
WATCHLIST_ROUNDS ?= 3
bench-watchlist-writes:
	$(call turns-bench,BenchmarkWatchListWrites,WATCHLIST,120m)

## bench-serve: what a single-object watch stream costs the serving path: SERVE_STREAMS (20,000) streams,
## SERVE_PER_CONN (100, the generic server's limit) to an HTTP/2 connection, then SERVE_WRITES creates at
## 100/s, each reaching one stream, and the same creates alone before any stream: RSS and heap per stream,
## CPU to open them, CPU per delivered event, latency, idle CPU over 3 minutes, CPU while streams
## re-open at K/450 a second for a minute (SERVE_CHURN_RATE, SERVE_CHURN_SECONDS); our server and
## upstream's wiring taking turns for SERVE_ROUNDS rounds (~6 min a round at 20,000). SERVE_ALT=path,… adds
## other server binaries; BENCH_PROFILE_DIR=dir keeps heap and CPU profiles (issue 57, docs/benchmarks.md).
SERVE_ROUNDS ?= 3
bench-serve:
	$(call turns-bench,BenchmarkServe,SERVE,180m)

## bench-gates: the cache's gate (--watch-cache-initial-events-concurrency) against no gate, where the server
## runs in a cluster: in aggregated mode behind bin/kube-apiserver with priority and fairness on, the load
## from users under a FlowSchema of their own. GATES_WATCHLISTS (100) watch-lists and GATES_LISTS (4) lists
## of GATES_OBJECTS (10,000) beside writes; a control plane a variant, GATES_ROUNDS (3) rounds (~11 min);
## GATES_VARIANTS=gates,none picks variants, GATES_ALT=path,… adds server binaries, upstream's wiring
## among them (issue 58, docs/benchmarks.md).
bench-gates: kube-apiserver
	mkdir -p $(BIN)
	set -o pipefail; $(GO) test -run '^$$' -bench BenchmarkGatesBehindAggregator -benchtime=1x -timeout 120m \
	  ./test/integration/ | grep -v 'logger.go' | tee $(CURDIR)/$(BIN)/$@.txt

## bench-serve-aggregated: bench-serve where clients meet the server, through bin/kube-apiserver's aggregator:
## SERVE_STREAMS (10,000) single-object streams, SERVE_PER_CONN (100) to a client connection, then SERVE_WRITES
## (1,000) creates at 50/s; RSS and CPU per stream of the backend and of kube-apiserver, idle, latency; ours and
## upstream's wiring, a control plane each, SERVE_ROUNDS (3) rounds (~15 min); SERVE_VARIANTS=ours,upstream,sample-apiserver
## adds upstream's sample-apiserver v0.37.2 (hack/build-sample-apiserver.sh) (issue 57, docs/benchmarks.md).
bench-serve-aggregated: kube-apiserver
	mkdir -p $(BIN)
	set -o pipefail; $(GO) test -run '^$$' -bench BenchmarkServeBehindAggregator -benchtime=1x -timeout 120m \
	  ./test/integration/ | grep -v 'logger.go' | tee $(CURDIR)/$(BIN)/$@.txt

generate:
	hack/update-codegen.sh

verify:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^pkg/generated/')); \
	  if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags faultinject ./pkg/storage/cacher/ ./internal/inject/ ./test/faults/
	cd examples/sample-apiserver && $(GO) vet ./...
	cd hack/promql && $(GO) vet ./...
	cd hack/image && $(GO) vet ./...
	cd hack/cpuowners && $(GO) vet ./...
	hack/verify-codegen.sh

clean:
	rm -rf $(BIN) .cached-apiserver
