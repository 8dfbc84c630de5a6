// Package fuzzer fills fleet objects for round-trip tests with values that
// survive defaulting, so that a decode after an encode gives the same object.
package fuzzer

import (
	runtimeserializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/randfill"

	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet"
)

// Funcs returns the fuzzer functions for the fleet group.
var Funcs = func(codecs runtimeserializer.CodecFactory) []interface{} {
	return []interface{}{
		func(s *fleet.AssignmentStatus, c randfill.Continue) {
			c.FillNoCustom(s)
			// Decoding defaults an empty phase to Pending.
			phases := []fleet.AssignmentPhase{fleet.AssignmentPending, fleet.AssignmentRunning,
				fleet.AssignmentSucceeded, fleet.AssignmentFailed}
			s.Phase = phases[c.Intn(len(phases))]
		},
	}
}
