package logstream

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/testhooks"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashHelperEnv) != "" {
		crashHelperMain()
		return
	}
	goleak.VerifyTestMain(m)
}

// memStore is a real Pebble on an in-memory file system.
func memStore(t testing.TB) *checkpoint.Store {
	t.Helper()
	return memStoreWith(t, nil)
}

// memStoreWith is memStore with the store's test switches h (nil: production's).
func memStoreWith(t testing.TB, h *testhooks.Hooks) *checkpoint.Store {
	t.Helper()
	s, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: vfs.NewMem(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var t0 = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

func submitEntry(run string, steps ...checkpoint.StepSpec) checkpoint.Entry {
	return checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: run, At: t0, Submit: &checkpoint.Submit{
		Workflow: "wf", Version: 1, Trigger: checkpoint.TriggerManual, MaxEpochs: 3, Steps: steps,
	}}
}

// testConfig is DefaultConfig for node over js and store, changed by set.
func testConfig(js jetstream.JetStream, store *checkpoint.Store, node string, set ...func(*Config)) Config {
	cfg := testConfigOn(logStream(js), store, node, set...)
	cfg.Snapshots = snapshotsOf(js)
	return cfg
}

// testConfigOn is DefaultConfig for node over the log src and store, changed by set.
func testConfigOn(src port.Stream, store *checkpoint.Store, node string, set ...func(*Config)) Config {
	cfg := DefaultConfig()
	cfg.Stream, cfg.Store, cfg.Node = src, store, node
	for _, f := range set {
		f(&cfg)
	}
	return cfg
}

// write writes entries in one message and awaits them: the message's sequence and the
// first rejection.
func write(ctx context.Context, w *Writer, entries ...checkpoint.Entry) (uint64, error) {
	f := w.Write(ctx, entries...)
	err := f.Await(ctx)
	return f.Seq(), err
}

// testEnv is an embedded JetStream (in process, synced) with a Log and Store.
type testEnv struct {
	dir   string
	srv   *natsnode.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	store *checkpoint.Store
	log   *Log
}

func startEnv(t testing.TB, dir string) *testEnv {
	t.Helper()
	return startEnvSync(t, dir, true)
}

// startEnvSync: with synced false, the server does not fsync (benchmarks of the ceiling).
func startEnvSync(t testing.TB, dir string, synced bool) *testEnv {
	t.Helper()
	srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(dir, "nats"), NoSync: !synced})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := srv.Connect()
	if err != nil {
		srv.Shutdown()
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	env := &testEnv{dir: dir, srv: srv, nc: nc, js: js}
	env.openLog(t)
	t.Cleanup(env.close)
	return env
}

func (env *testEnv) openLog(t testing.TB) {
	t.Helper()
	store, err := checkpoint.OpenStore(filepath.Join(env.dir, "state"), checkpoint.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Open(testConfig(env.js, store, "node-a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	env.store, env.log = store, l
}

func (env *testEnv) closeLog() {
	if env.log != nil {
		env.log.Stop()
		env.store.Close()
		env.log, env.store = nil, nil
	}
}

func (env *testEnv) close() {
	env.closeLog()
	env.nc.Close()
	env.srv.Shutdown()
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// logStream is the log on js, created if missing (as jsport.Open does for a node).
func logStream(js jetstream.JetStream) port.Stream {
	s, err := jsport.OpenStream(context.Background(), js, jsport.LogConfig(1))
	if err != nil {
		panic(err) // tests' set-up: a server that cannot create the log fails them all
	}
	return s
}

// snapshotsOf is the snapshots' object store on js.
func snapshotsOf(js jetstream.JetStream) port.Objects {
	return jsport.ObjectsOf(js, jsport.SnapshotsConfig(1))
}
