package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/cached-apiserver/cached-apiserver/internal/testkit"
	"github.com/cached-apiserver/cached-apiserver/pkg/apis/fleet/v1beta1"
	"github.com/cached-apiserver/cached-apiserver/pkg/cmd/server"
	"github.com/cached-apiserver/cached-apiserver/pkg/generated/clientset/versioned"
)

// directLoad writes Assignments straight into etcd, encoded by the
// server's own storage codec as its etcd3 store would write them on a
// create, many to a transaction and many transactions at once, without the
// decoding, admission and encoding of each that a create through the API
// costs the two cores.
//
// Object i is a-<i> in namespace ns-<i mod 100>, labelled group=g<i mod 10>,
// for spec.agentName agent-<i mod 1000>: a label value selects a tenth of
// them, an agent a thousandth. Its spec.payload is random base64, as an
// opaque description of work would be (a run of one letter would make gzip's
// figures meaningless), long enough that the stored JSON is bytes long.
type directLoad struct {
	// objects are written, each bytes of stored JSON.
	objects, bytes int
	// perRevision objects go into each transaction, and so share an etcd
	// revision: 128 (etcd's --max-txn-ops), as a bulk load, a restore or a
	// mass lease expiry lands them; 1, as writes through the API land.
	perRevision int
	// quota is etcd's --quota-backend-bytes: quotaFor unless set.
	quota int64
}

// directLoadFor is the load the environment variables named with prefix
// ask for: <prefix>_BYTES (1024) of JSON an object, <prefix>_PER_REVISION
// (128) objects to a revision, <prefix>_ETCD_QUOTA bytes of etcd backend.
func directLoadFor(prefix string, objects int) directLoad {
	d := directLoad{objects: objects, bytes: testkit.EnvInt(prefix+"_BYTES", 1024), perRevision: testkit.EnvInt(prefix+"_PER_REVISION", 128)}
	d.quota = int64(testkit.EnvInt(prefix+"_ETCD_QUOTA", int(d.quotaFor())))
	return d
}

// quotaFor is a backend quota with room for the load three times over
// (etcd's database took 1.3 times the JSON at 100,000 objects, either
// shape), and 2 GiB more for the writes the benchmark makes and etcd's
// free pages.
func (d directLoad) quotaFor() int64 {
	return 2<<30 + 3*int64(d.objects)*int64(d.bytes+len(assignmentsKey)+32)
}

// etcdFlags are the flags etcd needs for the load: the quota, and room
// for a transaction of perRevision objects.
func (d directLoad) etcdFlags() []string {
	txnBytes := d.perRevision * (d.bytes + 256)
	return []string{"--quota-backend-bytes", strconv.FormatInt(d.quota, 10),
		"--max-txn-ops", strconv.Itoa(max(128, d.perRevision)),
		"--max-request-bytes", strconv.Itoa(max(3<<19, 2*txnBytes))}
}

// concurrency is how many transactions are in flight at once: enough
// that etcd batches many of them into one commit of its backend. At
// 100,000 objects, 4 to 32 transactions of 128 loaded alike (2.2 to 5.3 s,
// on two cores shared with other work); of one object a transaction, 512
// took 7 to 27 s, 64 and 256 no less.
func (d directLoad) concurrency() int {
	return min(512, max(8, 1024/d.perRevision))
}

// millionAt returns the namespace and name of object i; waitCacheReady
// finds the last one by its name.
func millionAt(i int) (ns, name string) {
	return fmt.Sprintf("ns-%02d", i%100), fmt.Sprintf("a-%06d", i)
}

// loaderFields are the fields a create of object i through the API
// records as its client's, as server-side apply's field manager writes
// them (checkStoredShape compares the two).
const loaderFields = `{"f:metadata":{"f:labels":{".":{},"f:group":{}}},"f:spec":{"f:agentName":{},"f:payload":{}}}`

// object returns object i as a create through the API would leave it,
// with a payload of payload bytes.
func (d directLoad) object(i, payload int, created metav1.Time) *v1beta1.Assignment {
	ns, name := millionAt(i)
	return &v1beta1.Assignment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), Generation: 1, CreationTimestamp: created,
			Labels: map[string]string{"group": fmt.Sprintf("g%d", i%10)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "bench-loader", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: v1beta1.SchemeGroupVersion.String(), Time: &created, FieldsType: "FieldsV1",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(loaderFields)}}}},
		Spec:   v1beta1.AssignmentSpec{AgentName: fmt.Sprintf("agent-%03d", i%1000), Payload: randomPayload(i, payload)},
		Status: v1beta1.AssignmentStatus{Phase: v1beta1.AssignmentPending},
	}
}

// randomPayload is n characters of base64's alphabet, the same for the
// same i.
func randomPayload(i, n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	rng := rand.New(rand.NewPCG(uint64(i), 0x6d696c6c696f6e))
	p := make([]byte, n)
	for j := 0; j < n; j += 10 {
		for k, r := j, rng.Uint64(); k < min(j+10, n); k, r = k+1, r>>6 {
			p[k] = alphabet[r&63]
		}
	}
	return string(p)
}

// storageCodec is the codec the server stores Assignments with, from its
// own options.
func storageCodec() runtime.Codec {
	return server.NewOptions(io.Discard).Recommended.Etcd.StorageConfig.Codec
}

// payloadFor returns the payload that makes an object's JSON d.bytes long.
func (d directLoad) payloadFor(b *testing.B, codec runtime.Codec) int {
	var buf bytes.Buffer
	// One byte of payload: an empty one is left out, its key too.
	if err := codec.Encode(d.object(0, 1, metav1.Now()), &buf); err != nil {
		b.Fatal(err)
	}
	if buf.Len() > d.bytes {
		b.Logf("an object takes %d bytes with no payload, more than the %d asked for", buf.Len(), d.bytes)
	}
	return max(1, d.bytes-buf.Len()+1)
}

// run loads etcd and returns how long it took and the mean bytes of JSON an
// object. It fails the benchmark, saying what to do, when etcd raises its
// NOSPACE alarm, and unless etcd then holds every object.
func (d directLoad) run(ctx context.Context, b *testing.B, etcd *clientv3.Client) (time.Duration, float64) {
	codec := storageCodec()
	payload := d.payloadFor(b, codec)
	created := metav1.Now()
	var next, written, stored atomic.Int64
	batches := (d.objects + d.perRevision - 1) / d.perRevision
	t0 := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for range d.concurrency() {
		g.Go(func() error {
			var buf bytes.Buffer
			ops := make([]clientv3.Op, 0, d.perRevision)
			for k := int(next.Add(1)) - 1; k < batches; k = int(next.Add(1)) - 1 {
				ops = ops[:0]
				for i := k * d.perRevision; i < min((k+1)*d.perRevision, d.objects); i++ {
					buf.Reset()
					if err := codec.Encode(d.object(i, payload, created), &buf); err != nil {
						return err
					}
					ns, name := millionAt(i)
					ops = append(ops, clientv3.OpPut(assignmentsKey+ns+"/"+name, buf.String()))
					stored.Add(int64(buf.Len()))
				}
				if _, err := etcd.Txn(gctx).Then(ops...).Commit(); err != nil {
					return err
				}
				written.Add(int64(len(ops)))
			}
			return nil
		})
	}
	err := g.Wait()
	took := time.Since(t0)
	d.failOnNoSpace(ctx, b, etcd, err, written.Load())
	if err != nil {
		b.Fatalf("loading etcd: %v", err)
	}
	count, err := etcd.Get(ctx, assignmentsKey, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		b.Fatal(err)
	}
	if count.Count != int64(d.objects) {
		b.Fatalf("etcd holds %d Assignments after loading %d", count.Count, d.objects)
	}
	status, err := etcd.Status(ctx, etcd.Endpoints()[0])
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("loaded %d objects of %d bytes, %d to a revision, in %v (%.0f objects/s); etcd's database %d MiB of a quota of %d MiB",
		d.objects, stored.Load()/int64(d.objects), d.perRevision, took.Round(time.Millisecond), float64(d.objects)/took.Seconds(),
		status.DbSize>>20, d.quota>>20)
	return took, float64(stored.Load()) / float64(d.objects)
}

// failOnNoSpace fails the benchmark, saying what to do, when the load's
// error, or etcd's alarms, say that etcd's backend is full.
func (d directLoad) failOnNoSpace(ctx context.Context, b *testing.B, etcd *clientv3.Client, err error, written int64) {
	noSpace := errors.Is(err, rpctypes.ErrNoSpace)
	if alarms, err := etcd.AlarmList(ctx); err == nil {
		for _, a := range alarms.Alarms {
			noSpace = noSpace || a.Alarm == etcdserverpb.AlarmType_NOSPACE
		}
	}
	if noSpace {
		b.Fatalf("etcd raised its NOSPACE alarm after %d of %d objects: its --quota-backend-bytes of %d MiB is too small "+
			"for the load; set MILLION_ETCD_QUOTA higher, in bytes", written, d.objects, d.quota>>20)
	}
}

// frozenEtcd is the load's etcd, whose data directory, as the load left
// it, is put back before each server's turn, so that every turn starts
// from the same revisions and history whatever the turns before wrote. A
// warm start fills its history from etcd's last revisions: after another
// turn's writes they would be those writes, not the load.
type frozenEtcd struct {
	cluster *testkit.EtcdCluster
	client  *clientv3.Client
	// frozen holds a copy of the member's data directory.
	frozen string
}

// freeze stops etcd and copies its data directory.
func freeze(b *testing.B, cluster *testkit.EtcdCluster, client *clientv3.Client) *frozenEtcd {
	f := &frozenEtcd{cluster: cluster, client: client, frozen: filepath.Join(b.TempDir(), "frozen")}
	if err := cluster.Procs[0].Terminate(time.Minute); err != nil {
		b.Fatal(err)
	}
	copyDir(b, f.frozen, cluster.Members[0].Dir)
	return f
}

// thaw stops etcd if it runs, puts the frozen copy in place of its data
// directory, and restarts it on the same ports.
func (f *frozenEtcd) thaw(ctx context.Context, b *testing.B) {
	proc, dir := f.cluster.Procs[0], f.cluster.Members[0].Dir
	if err := proc.Terminate(time.Minute); err != nil {
		b.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		b.Fatal(err)
	}
	copyDir(b, dir, f.frozen)
	if err := proc.Start(); err != nil {
		b.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := f.client.Get(ctx, "health")
		return err == nil, nil
	}); err != nil {
		b.Fatalf("etcd did not serve within 2 minutes of its restart: %v", err)
	}
}

// copyDir copies the directory src to dst, which must not exist, as etcd
// wants its data: readable by its owner only.
func copyDir(b *testing.B, dst, src string) {
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		b.Fatal(err)
	}
	if err := filepath.WalkDir(dst, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return err
		}
		return os.Chmod(path, 0o700)
	}); err != nil {
		b.Fatal(err)
	}
}

// checkStoredShape creates one Assignment through the server and fails
// the benchmark unless etcd holds it with the same fields, at every depth,
// as the loader's objects: what the loader writes is what the server would.
func checkStoredShape(ctx context.Context, b *testing.B, cfg *rest.Config, etcd *clientv3.Client, d directLoad) {
	a := &v1beta1.Assignment{ObjectMeta: metav1.ObjectMeta{Name: "stored-shape", Namespace: "writes", Labels: map[string]string{"group": "g0"}},
		Spec: v1beta1.AssignmentSpec{AgentName: "agent-000", Payload: "x"}}
	if _, err := versioned.NewForConfigOrDie(cfg).FleetV1beta1().Assignments(a.Namespace).Create(ctx, a, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	got, err := etcd.Get(ctx, assignmentsKey+a.Namespace+"/"+a.Name)
	if err != nil || len(got.Kvs) != 1 {
		b.Fatalf("reading the Assignment created through the server from etcd: %v, %d keys", err, len(got.Kvs))
	}
	var loaded bytes.Buffer
	if err := storageCodec().Encode(d.object(0, 1, metav1.Now()), &loaded); err != nil {
		b.Fatal(err)
	}
	want, have := jsonPaths(b, got.Kvs[0].Value), jsonPaths(b, loaded.Bytes())
	if !slices.Equal(want, have) {
		b.Fatalf("the loader's objects are not what the server stores:\nserver: %s\nloader: %s", got.Kvs[0].Value, loaded.Bytes())
	}
}

// jsonPaths returns the path of every value in the JSON document doc,
// sorted, without the values: two documents with the same fields at every
// depth have the same paths.
func jsonPaths(b *testing.B, doc []byte) []string {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		b.Fatal(err)
	}
	var paths []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		paths = append(paths, path)
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range v {
				walk(path+"[]", e)
			}
		}
	}
	walk("", v)
	slices.Sort(paths)
	return slices.Compact(paths)
}
