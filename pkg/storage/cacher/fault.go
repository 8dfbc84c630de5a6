package cacher

import "k8s.io/apimachinery/pkg/watch"

// testFault, when set, wraps every watch the cache serves so that it
// breaks one of the cache's promises. Only builds with the faultinject tag
// set it (fault_inject.go), so that the fault harness in test/faults can
// prove it catches a broken cache. Shipped builds leave it nil.
var testFault func(c *Cacher, w watch.Interface) watch.Interface
