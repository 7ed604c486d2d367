package checkpoint

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/natsnode"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashHelperEnv) != "" {
		crashHelperMain()
		return
	}
	if os.Getenv(diskFullHelperEnv) != "" {
		diskFullHelperMain()
		return
	}
	goleak.VerifyTestMain(m)
}

// memStore is a real Pebble on an in-memory file system.
func memStore(t testing.TB, unsafe Unsafe) *Store {
	t.Helper()
	s, err := OpenStore("state", StoreOptions{FS: vfs.NewMem(), Unsafe: unsafe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// msg encodes entries as one log message.
func msg(t interface{ Fatal(...any) }, entries ...Entry) []byte {
	var datas [][]byte
	for _, e := range entries {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		datas = append(datas, b)
	}
	return encodeEnvelope("test", datas)
}

// applyOne applies one entry as its own message at the next sequence.
func applyOne(t testing.TB, s *Store, e Entry) (uint64, error) {
	t.Helper()
	seq := s.Applied() + 1
	res, err := s.ApplyMessage(seq, msg(t, e))
	if err != nil {
		t.Fatalf("apply %s at %d: %v", e.Kind, seq, err)
	}
	return seq, res[0]
}

func mustApply(t testing.TB, s *Store, e Entry) uint64 {
	t.Helper()
	seq, err := applyOne(t, s, e)
	if err != nil {
		t.Fatalf("apply %s at %d: %v", e.Kind, seq, err)
	}
	return seq
}

var t0 = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

func submitEntry(run string, steps ...StepSpec) Entry {
	return Entry{Kind: KindSubmit, Run: run, At: t0, Submit: &Submit{
		Workflow: "wf", Version: 1, Trigger: TriggerManual, MaxEpochs: 3, Steps: steps,
	}}
}

// testEnv is an embedded JetStream (in process, synced) with a Log and Store.
type testEnv struct {
	dir   string
	srv   *natsnode.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	store *Store
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
	store, err := OpenStore(filepath.Join(env.dir, "state"), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := OpenLog(ctx, LogConfig{JS: env.js, Store: store, Node: "node-a"})
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

func memFS() vfs.FS { return vfs.NewMem() }
