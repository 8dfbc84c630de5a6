// Package packer compresses the watch cache's objects at rest, in the
// background (issue 67): it trains a dictionary from the resource's
// objects once the cache holds them, compresses each object version once
// it is older than the history window, retrains when the objects compress
// markedly worse than they did just after the last training, and then
// compresses again what the old dictionary holds.
//
// It takes no lock of the cache's: it reads a snapshot of the store, and
// object.Pack swaps an object's bytes in place, which every holder of the
// object (the store and its snapshots, the history, watchers, lists being
// written, gzip runs) sees at once, and which no reader waits for: a
// reader that loaded the old bytes goes on reading them. A version inside
// the window stays as it is, so that what watchers are sent as it happens
// is read as before; the store's objects that were listed when the cache
// started are compressed at its first pass.
//
// A dictionary is retired from the codec's table as soon as another
// replaces it; each compressed object keeps the dictionary it needs
// (object.Packing), so that the last one to need it takes it with it when
// it is collected: a retrain's pass compresses again every current object,
// and the history's older versions go as the history moves on.
//
// Nothing here is measured outside the process: the ratio it judges is
// its own (docs/architecture.md, "Objects compressed at rest").
package packer

import (
	"context"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/compress"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/object"
	"github.com/cached-apiserver/cached-apiserver/pkg/storage/cacher/internal/store"
)

// Defaults for Config.
const (
	// DefaultInterval is the time between passes: a quarter of the default
	// history window, so that a version is compressed at most 1.25 windows
	// after it was written. A pass over 100,000 objects with nothing to
	// compress reads each object's body pointer: a few milliseconds.
	DefaultInterval = 20 * time.Second
	// DefaultSamples is how many objects a dictionary is trained from:
	// 1,000 did as well as 10,000 on the realistic corpus (BenchmarkCodec,
	// docs/benchmarks.md).
	DefaultSamples = 1000
	// DefaultDegraded is how much worse than just after the last training
	// the objects may compress, as a factor of the ratio of their records'
	// bytes to theirs, before the packer retrains: a quarter, a change of
	// shape that a retrain repays (a dictionary of 16 KiB against 64 KiB is
	// 0.283 against 0.242, a sixth), not noise.
	DefaultDegraded = 1.25
	// DefaultMinJudged is how many compressed objects the ratio is judged
	// on at least: fewer are too few to tell a change of shape from the
	// objects that happen to be there.
	DefaultMinJudged = 100
)

// Objects is the state the packer compresses: the store.
type Objects interface {
	Latest() store.Snapshot
}

// Config is what a Packer compresses, and how.
type Config struct {
	// Objects are the cache's current objects; Codec is what their
	// builder compressed them with (object.BuilderConfig.Compression).
	Objects Objects
	Codec   *compress.Codec
	// Window is how long a version stays as it is after it was written:
	// the cache's history window.
	Window time.Duration
	// Interval is the time between passes. Default DefaultInterval.
	Interval time.Duration
	// Samples is how many objects a dictionary is trained from. Default
	// DefaultSamples.
	Samples int
	// Degraded is the factor of the ratio just after the last training
	// past which the packer retrains. Default DefaultDegraded.
	Degraded float64
	// MinJudged is the fewest compressed objects the ratio is judged on.
	// Default DefaultMinJudged.
	MinJudged int
	// Clock times the window and the passes.
	Clock clock.WithTicker
}

// Packer compresses a cache's objects. Only one goroutine may use it:
// Run's, or a test's calling Pass.
type Packer struct {
	cfg Config
	// marks are the store's resourceVersion at past passes, oldest first,
	// from the newest at least a window old: what the window cuts at.
	marks []mark
	// dict is the id of the dictionary trained last, 0 before the first.
	dict uint32
	// baseline is the ratio of records' bytes to objects' just after the
	// last training, 0 before it is known; retrain asks the next pass for
	// a new dictionary.
	baseline float64
	retrain  bool
	scratch  object.Scratch
}

// mark is the store's resourceVersion at a time.
type mark struct {
	at time.Time
	rv uint64
}

// New returns a Packer for cfg, its defaults filled in.
func New(cfg Config) *Packer {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Samples <= 0 {
		cfg.Samples = DefaultSamples
	}
	if cfg.Degraded <= 1 {
		cfg.Degraded = DefaultDegraded
	}
	if cfg.MinJudged <= 0 {
		cfg.MinJudged = DefaultMinJudged
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Packer{cfg: cfg}
}

// Run passes over the objects now and every Interval until ctx ends. The
// caller starts it once the cache is ready: the first pass trains on what
// the cache listed.
func (p *Packer) Run(ctx context.Context) {
	t := p.cfg.Clock.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		p.Pass()
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// Result is what one pass did.
type Result struct {
	// Trained is whether it trained a dictionary.
	Trained bool
	// Packed counts the objects it compressed, and Repacked those it
	// compressed again against a new dictionary; Failed those it could
	// not, which stay as they were.
	Packed, Repacked, Failed int
}

// Pass compresses the objects that left the window, training or
// retraining the dictionary first when it must, and compresses again the
// objects an older dictionary holds.
func (p *Packer) Pass() Result {
	var res Result
	snap := p.cfg.Objects.Latest()
	if snap.Len() == 0 {
		return res
	}
	cut := p.cut(p.cfg.Clock.Now(), snap.RV)
	if p.dict == 0 || p.retrain {
		if !p.train(snap) {
			return res
		}
		res.Trained = true
	}
	cur := p.cfg.Codec.Current()
	var plain, packed int64
	judged := 0
	var failure error
	snap.Scan("", true, "", func(o *object.Object) bool {
		pk := o.Packing()
		if !pk.Packable {
			return true
		}
		stale := pk.Dict != nil && pk.Dict.ID() != 0 && pk.Dict != cur
		if (pk.Dict == nil && o.RV <= cut) || stale {
			if err := o.Pack(&p.scratch); err != nil {
				res.Failed++
				failure = err
				return true
			}
			if stale {
				res.Repacked++
			} else {
				res.Packed++
			}
			pk = o.Packing()
		}
		if pk.Dict != nil {
			plain += int64(o.Len())
			packed += int64(pk.Record)
			judged++
		}
		return true
	})
	if failure != nil {
		klog.ErrorS(failure, "The watch cache could not compress some objects; they stay as they are", "objects", res.Failed)
	}
	p.judge(res.Trained, judged, plain, packed)
	if res.Packed+res.Repacked > 0 {
		klog.V(2).InfoS("The watch cache compressed objects at rest", "objects", res.Packed, "again", res.Repacked, "trained", res.Trained)
	}
	return res
}

// Retrain makes the next pass train a new dictionary, as when the objects
// compress worse, and compress every object again against it.
func (p *Packer) Retrain() { p.retrain = true }

// cut returns the newest resourceVersion whose objects have all left the
// window at now, when the store is at rv, and marks rv at now. At the
// first pass, what the store holds counts as old: the objects the cache
// listed as it started, which no watcher was sent as they changed.
func (p *Packer) cut(now time.Time, rv uint64) uint64 {
	if len(p.marks) == 0 {
		p.marks = append(p.marks, mark{at: now.Add(-p.cfg.Window), rv: rv})
	}
	p.marks = append(p.marks, mark{at: now, rv: rv})
	old := now.Add(-p.cfg.Window)
	i := 0
	for i+1 < len(p.marks) && !p.marks[i+1].at.After(old) {
		i++
	}
	p.marks = p.marks[i:]
	return p.marks[0].rv
}

// train trains a dictionary from up to Samples objects spread over snap,
// and retires the one it replaces from the codec's table (package doc).
// It reports whether it trained one.
func (p *Packer) train(snap store.Snapshot) bool {
	step := max(1, snap.Len()/p.cfg.Samples)
	samples := make([][]byte, 0, min(snap.Len(), p.cfg.Samples))
	i := 0
	snap.Scan("", true, "", func(o *object.Object) bool {
		if i++; (i-1)%step != 0 {
			return true
		}
		// A copy of its own, or decompressed into one: the codec reads
		// the samples after the scan.
		if b, err := o.Bytes(nil); err == nil && len(b) > 0 {
			samples = append(samples, b)
		}
		return len(samples) < p.cfg.Samples
	})
	id, err := p.cfg.Codec.Train(samples)
	if err != nil {
		// Too little to make a dictionary of: the next pass tries again.
		klog.V(2).InfoS("The watch cache did not train a dictionary to compress its objects", "samples", len(samples), "err", err)
		return false
	}
	if p.dict != 0 {
		p.cfg.Codec.Retire(p.dict)
	}
	p.dict, p.retrain, p.baseline = id, false, 0
	klog.V(2).InfoS("The watch cache trained a dictionary to compress its objects", "samples", len(samples))
	return true
}

// judge compares the ratio of the compressed objects' records to their
// bytes with the baseline, which a pass that trained sets: past
// Degraded times it, the next pass retrains.
func (p *Packer) judge(trained bool, judged int, plain, packed int64) {
	if judged == 0 || plain == 0 {
		return
	}
	ratio := float64(packed) / float64(plain)
	switch {
	case trained || p.baseline == 0:
		p.baseline = ratio
	case judged >= p.cfg.MinJudged && ratio > p.baseline*p.cfg.Degraded:
		p.retrain = true
	}
}
