package corpus

import (
	"bytes"
	"encoding/base64"
	"regexp"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
)

// n is how many objects the tests draw: enough for a p99.
const n = 5000

// shapeN is how many objects TestShape decodes, in about a second.
const shapeN = 2000

func TestSizes(t *testing.T) {
	tests := []struct {
		name string
		raw  [][]byte
		// The median and the tail the issue asks for, with the slack of
		// a realistic object: managedFields alone are 300–600 B of one.
		minMedian, maxMedian, minP99, maxLargest int
	}{
		{"assignments", AssignmentsJSON(1, n), 1024, 2048, 4096, 11 << 10},
		{"agents", AgentsJSON(1, n), 1024, 2560, 4096, 11 << 10},
		{"random", Random(1, n), 1024, 2048, 4096, 11 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sizes := make([]int, len(tt.raw))
			for i, r := range tt.raw {
				sizes[i] = len(r)
			}
			slices.Sort(sizes)
			median, p99, largest := sizes[len(sizes)/2], sizes[len(sizes)*99/100], sizes[len(sizes)-1]
			t.Logf("median %d B, p90 %d B, p99 %d B, largest %d B", median, sizes[len(sizes)*9/10], p99, largest)
			if median < tt.minMedian || median > tt.maxMedian {
				t.Errorf("median %d B, want %d–%d", median, tt.minMedian, tt.maxMedian)
			}
			if p99 < tt.minP99 {
				t.Errorf("p99 %d B, want a tail beyond %d", p99, tt.minP99)
			}
			if largest > tt.maxLargest {
				t.Errorf("largest %d B, want at most %d", largest, tt.maxLargest)
			}
		})
	}
}

func TestDeterministic(t *testing.T) {
	tests := []struct {
		name string
		make func(seed uint64) [][]byte
	}{
		{"agents", func(seed uint64) [][]byte { return AgentsJSON(seed, 200) }},
		{"assignments", func(seed uint64) [][]byte { return AssignmentsJSON(seed, 200) }},
		{"random", func(seed uint64) [][]byte { return Random(seed, 200) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b, other := tt.make(7), tt.make(7), tt.make(8)
			if !slices.EqualFunc(a, b, bytes.Equal) {
				t.Error("one seed made two corpora")
			}
			if slices.EqualFunc(a, other, bytes.Equal) {
				t.Error("two seeds made one corpus")
			}
		})
	}
}

// secretPattern finds a run of base64 long enough to be only a
// certificate or a token.
var secretPattern = regexp.MustCompile(`[A-Za-z0-9+/]{200,}={0,2}`)

func TestShape(t *testing.T) {
	tests := []struct {
		name string
		objs []runtime.Object
	}{
		{"agents", objects(Agents(1, shapeN))},
		{"assignments", objects(Assignments(1, shapeN))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var applied, secrets int
			uids := map[string]bool{}
			for _, obj := range tt.objs {
				m, err := meta.Accessor(obj)
				if err != nil {
					t.Fatal(err)
				}
				if l := len(m.GetLabels()); l < 3 || l > 6 {
					t.Fatalf("%s has %d labels, want 3–6", m.GetName(), l)
				}
				a := len(m.GetAnnotations())
				if _, ok := m.GetAnnotations()[lastAppliedKey]; ok {
					applied++
					a--
				}
				if _, ok := m.GetAnnotations()["fleet.example.com/client-certificate"]; ok {
					a--
				}
				if a < 1 || a > 3 {
					t.Fatalf("%s has %d annotations beside kubectl's and a certificate, want 1–3", m.GetName(), a)
				}
				if f := len(m.GetManagedFields()); f < 1 || f > 3 {
					t.Fatalf("%s has %d managers, want 1–3", m.GetName(), f)
				}
				uid := string(m.GetUID())
				if uids[uid] || m.GetResourceVersion() == "" || m.GetCreationTimestamp().Time.IsZero() {
					t.Fatalf("%s: uid %q (seen: %v), resourceVersion %q, created %v", m.GetName(), uid, uids[uid], m.GetResourceVersion(), m.GetCreationTimestamp())
				}
				uids[uid] = true
				raw := JSON(obj)
				if s := secretPattern.Find(raw); s != nil {
					if _, err := base64.StdEncoding.DecodeString(string(s)); err != nil {
						t.Fatalf("%s: %q is not base64: %v", m.GetName(), s, err)
					}
					secrets++
				}
				// What the server would decode and store again is these bytes.
				back, err := runtime.Decode(storageCodec(), raw)
				if err != nil {
					t.Fatalf("%s does not decode: %v", m.GetName(), err)
				}
				if !bytes.Equal(JSON(back), raw) {
					t.Fatalf("%s does not encode back to its JSON", m.GetName())
				}
			}
			if f := float64(secrets) / float64(len(tt.objs)); f < 0.08 || f > 0.12 {
				t.Errorf("%.3f of objects hold a certificate or token, want about 0.1", f)
			}
			if f := float64(applied) / float64(len(tt.objs)); f < 0.1 || f > 0.35 {
				t.Errorf("%.3f of objects were applied with kubectl, want 0.1–0.35", f)
			}
		})
	}
}

func TestStatus(t *testing.T) {
	for _, a := range Agents(1, 500) {
		if len(a.Status.Conditions) == 0 || a.Status.Conditions[0].Type != "Ready" || a.Status.Conditions[0].Message == "" {
			t.Fatalf("%s: conditions %v, want Ready first, with a message", a.Name, a.Status.Conditions)
		}
	}
	for _, a := range Assignments(1, 500) {
		if a.Status.Phase == "" || a.Status.Message == "" || a.Spec.AgentName == "" || a.Spec.Payload == "" {
			t.Fatalf("%s: status %+v, agent %q, payload %q", a.Name, a.Status, a.Spec.AgentName, a.Spec.Payload)
		}
	}
}

func objects[T runtime.Object](objs []T) []runtime.Object {
	out := make([]runtime.Object, len(objs))
	for i, o := range objs {
		out[i] = o
	}
	return out
}
