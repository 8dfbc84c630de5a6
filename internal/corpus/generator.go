package corpus

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Generator makes objects from one seed: the same seed makes the same
// objects in the same order. It is not safe for concurrent use.
type Generator struct {
	// rng draws everything.
	rng *rand.Rand
	// now is the time of the latest write; it moves on a few seconds for
	// every object, as a cluster's clock does between writes.
	now time.Time
	// rv is the latest resourceVersion given out.
	rv uint64
}

// objectStream is the PCG stream of a Generator, apart from Random's.
const objectStream = 0x666c656574

// epoch is when every Generator's clock starts.
var epoch = time.Date(2026, time.March, 2, 9, 30, 0, 0, time.UTC)

// New returns a Generator drawing from seed.
func New(seed uint64) *Generator {
	g := &Generator{rng: rand.New(rand.NewPCG(seed, objectStream)), now: epoch}
	g.rv = 100_000 + g.rng.Uint64N(1_000_000)
	return g
}

// tick moves the clock and the resourceVersion on, as one write does.
func (g *Generator) tick() {
	g.now = g.now.Add(time.Duration(1+g.rng.IntN(5)) * time.Second)
	g.rv += 1 + g.rng.Uint64N(40)
}

// meta returns an object's metadata written now and created age ago.
func (g *Generator) meta(name, namespace string, age time.Duration) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:              name,
		Namespace:         namespace,
		UID:               g.uid(),
		ResourceVersion:   fmt.Sprint(g.rv),
		Generation:        1 + g.rng.Int64N(12),
		CreationTimestamp: metav1.NewTime(g.now.Add(-age)),
	}
}

// age returns how long ago an object was created: minutes to a year,
// most of them days, as the objects of a cluster that has run a while.
func (g *Generator) age() time.Duration {
	return time.Duration(math.Exp(g.rng.NormFloat64()*1.8+12)) * time.Second
}

// since returns a time between created and now.
func (g *Generator) since(created time.Time) metav1.Time {
	span := g.now.Sub(created)
	if span <= 0 {
		return metav1.NewTime(g.now)
	}
	return metav1.NewTime(g.now.Add(-time.Duration(g.rng.Int64N(int64(span)))).Truncate(time.Second))
}

// uid returns a random version 4 UUID.
func (g *Generator) uid() types.UID {
	var b [16]byte
	for i := range b {
		b[i] = byte(g.rng.Uint32())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return types.UID(fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:]))
}

func (g *Generator) pick(words []string) string { return words[g.rng.IntN(len(words))] }

// between returns an int in [lo, hi].
func (g *Generator) between(lo, hi int) int { return lo + g.rng.IntN(hi-lo+1) }

// few returns 1, 2 or 3, most often 1: how many annotations an object
// has beside kubectl's.
func (g *Generator) few() int {
	switch r := g.rng.Float64(); {
	case r < 0.6:
		return 1
	case r < 0.9:
		return 2
	default:
		return 3
	}
}

// chance returns true with probability p.
func (g *Generator) chance(p float64) bool { return g.rng.Float64() < p }

// hex returns n random hexadecimal digits.
func (g *Generator) hex(n int) string {
	const digits = "0123456789abcdef"
	b := make([]byte, n)
	for i := range b {
		b[i] = digits[g.rng.IntN(len(digits))]
	}
	return string(b)
}

// suffix returns n characters of the alphabet Kubernetes' generated names
// end in.
func (g *Generator) suffix(n int) string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[g.rng.IntN(len(alphabet))]
	}
	return string(b)
}

// secret returns random base64: a certificate's DER or a token's
// signature, which no compressor shrinks beyond its alphabet.
func (g *Generator) secret() string {
	n := g.between(200, 420) // a token's claims and signature
	if g.chance(0.5) {
		n = g.between(700, 1300) // a certificate
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.rng.Uint32())
	}
	return base64.StdEncoding.EncodeToString(b)
}

// label is one label a kind of object may carry, and how to draw its value.
type label struct {
	key   string
	value func(g *Generator) string
}

// labels draws between lo and hi of the labels in pool, each at most once.
func (g *Generator) labels(pool []label, lo, hi int) map[string]string {
	n := g.between(lo, hi)
	out := make(map[string]string, n)
	for _, i := range g.rng.Perm(len(pool))[:n] {
		out[pool[i].key] = pool[i].value(g)
	}
	return out
}

// lastApplied returns kubectl's last-applied-configuration of an object:
// what kubectl apply sent, as compact JSON with its keys sorted and a
// trailing newline. meta holds its name, namespace, labels and the
// annotations it was applied with.
func lastApplied(kind string, meta metav1.ObjectMeta, spec any) string {
	m := map[string]any{"name": meta.Name}
	if meta.Namespace != "" {
		m["namespace"] = meta.Namespace
	}
	if len(meta.Labels) > 0 {
		m["labels"] = meta.Labels
	}
	if len(meta.Annotations) > 0 {
		m["annotations"] = meta.Annotations
	}
	raw, err := json.Marshal(map[string]any{
		"apiVersion": "fleet.example.com/v1beta1",
		"kind":       kind,
		"metadata":   m,
		"spec":       spec,
	})
	if err != nil {
		panic(err)
	}
	return string(raw) + "\n"
}

// lastAppliedKey is kubectl's annotation of what it last applied.
const lastAppliedKey = "kubectl.kubernetes.io/last-applied-configuration"

// sentence fills a template's %s with words and its %d with numbers.
func (g *Generator) sentence(template string, words ...[]string) string {
	var b strings.Builder
	w := 0
	for i := 0; i < len(template); i++ {
		if template[i] != '%' || i+1 == len(template) {
			b.WriteByte(template[i])
			continue
		}
		i++
		switch template[i] {
		case 's':
			b.WriteString(g.pick(words[w%len(words)]))
			w++
		case 'd':
			fmt.Fprint(&b, g.between(1, 999))
		default:
			b.WriteByte(template[i])
		}
	}
	return b.String()
}
