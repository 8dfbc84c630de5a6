package install

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting/roundtrip"

	fleetfuzzer "github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/fuzzer"
)

// TestRoundTripTypes encodes fuzzed objects in every served version and
// checks that decoding gives them back unchanged.
func TestRoundTripTypes(t *testing.T) {
	roundtrip.RoundTripTestForAPIGroup(t, Install, fleetfuzzer.Funcs)
}
