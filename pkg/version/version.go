// Package version is the version of cached-apiserver, set when it is built:
//
//	go build -ldflags "-X github.com/cached-apiserver/cached-apiserver/pkg/version.Version=v1.2.3"
//
// make build sets it from git describe.
package version

// Version is the build's version; "dev" when the build did not set one.
var Version = "dev"
