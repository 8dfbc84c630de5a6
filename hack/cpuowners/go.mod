// Splits a CPU profile by who pays for it, with pprof's own parser: a
// module of its own, so that pprof is never a dependency of the server's.
module github.com/cached-apiserver/cached-apiserver/hack/cpuowners

go 1.26.7

require github.com/google/pprof v0.0.0-20260402051712-545e8a4df936
