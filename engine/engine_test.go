package engine

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/base/testhooks"
)

func TestMain(m *testing.M) {
	if handled := helperMain(); handled {
		return
	}
	// nats.go's async publisher (the object store's Put, a snapshot's upload) starts a
	// goroutine that reads its status channel under a lock; if the publisher is cleaned up
	// before that read, the goroutine waits on a nil channel for good (seen once in CI,
	// with every test passed). It holds nothing of flow's.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}

var testLease = epoch.Config{TTL: time.Second, Backoff: backoff.Policy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}}

func startEngine(t testing.TB, mod func(*Config)) *Engine {
	t.Helper()
	return startEngineWith(t, nil, mod)
}

// startEngineWith starts an engine with the test switches h (nil: production's).
func startEngineWith(t testing.TB, h *testhooks.Hooks, mod func(*Config)) *Engine {
	t.Helper()
	// ParkAfter: the tests' long sleeps hold a worker (a running run to cancel, drain,
	// steal); the waits' tests set their own.
	cfg := Config{NodeID: "node-a", DataDir: filepath.Join(t.TempDir(), "data"), NATSListen: "-", Lease: testLease, ParkAfter: 24 * time.Hour}
	if os.Getenv("FLOW_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h != nil {
		e.hooks = h
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Stop(ctx)
	})
	return e
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func apply(t testing.TB, e *Engine, yaml string) {
	t.Helper()
	if _, err := e.ApplyWorkflow(ctxT(t, 10*time.Second), "test.yaml", []byte(yaml)); err != nil {
		t.Fatal(err)
	}
}

func runToEnd(t testing.TB, e *Engine, wf string, inputs map[string]any) *checkpoint.RunView {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	id, err := e.StartRun(ctx, wf, inputs, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitRun(ctx, id); err != nil {
		t.Fatalf("run %s: %v", id, err)
	}
	v, err := e.Run(id)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func output(t testing.TB, v *checkpoint.RunView, step string) map[string]any {
	t.Helper()
	for _, s := range v.Steps {
		if s.Name == step {
			var m map[string]any
			_ = json.Unmarshal(s.Output, &m)
			return m
		}
	}
	t.Fatalf("no step %s", step)
	return nil
}

func TestRunNoopWorkflow(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: hello
inputs:
  who: {type: string, default: world}
  n: {type: int, default: 2}
steps:
  - name: a
    uses: noop
    with: {greeting: "hello {{ inputs.who }}", n: "{{ inputs.n }}"}
  - name: b
    needs: [a]
    uses: noop
    with: {from_a: "{{ steps.a.output.greeting }}", epoch: "{{ run.epoch }}"}
`)
	v := runToEnd(t, e, "hello", map[string]any{"n": "3"})
	if v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("run %+v", v.Run)
	}
	if got := output(t, v, "b"); got["from_a"] != "hello world" || got["epoch"] != float64(v.Run.Epoch) {
		t.Fatalf("b output %v", got)
	}
	if got := output(t, v, "a"); got["n"] != float64(3) {
		t.Fatalf("a output %v", got)
	}
	if len(v.Run.Epochs) != 1 || v.Run.Epochs[0].Owner != "node-a" || v.Run.EpochChanges != 0 {
		t.Fatalf("epochs %+v", v.Run.Epochs)
	}
}
