package logstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
)

// writeSubmits writes n runs' submits through the environment's log and returns the
// last sequence.
func writeSubmits(t *testing.T, env *testEnv, prefix string, n int) uint64 {
	t.Helper()
	var seq uint64
	for i := range n {
		var err error
		if seq, err = write(ctxT(t), env.log.Writer, submitEntry(fmt.Sprintf("%s-%d", prefix, i), checkpoint.StepSpec{Name: "one"})); err != nil {
			t.Fatal(err)
		}
	}
	return seq
}

// startOn opens and starts a Log of node over store; the error is Start's.
func startOn(t *testing.T, env *testEnv, store *checkpoint.Store, node string) (*Log, error) {
	t.Helper()
	l, err := Open(ctxT(t), testConfig(env.js, store, node, func(c *Config) { c.StallTimeout = 400 * time.Millisecond }))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(ctxT(t)); err != nil {
		l.Stop()
		return nil, err
	}
	t.Cleanup(l.Stop)
	return l, nil
}

// A message deleted from the end of the log counts as seen: a node that had not applied
// it catches up instead of waiting for it forever (the stream's last sequence is the
// deleted one). Control: before the fix a restarted node waited for it for good; here
// the deletion is undone by a new write, which the node then applies normally.
func TestDeletedTailCountsAsSeen(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	last := writeSubmits(t, env, "r", 5)
	stream, err := env.js.Stream(ctx, DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	for seq := last - 1; seq <= last; seq++ {
		if err := stream.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	fresh := memStore(t)
	l, err := startOn(t, env, fresh, "node-b")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := l.Applier.CatchUp(cctx); err != nil {
		t.Fatalf("catch up over a deleted tail: %v (applied %d of %d)", err, fresh.Applied(), last)
	}
	if fresh.Applied() != last {
		t.Fatalf("applied %d, want %d", fresh.Applied(), last)
	}
	if _, err := fresh.Run(fmt.Sprintf("r-%d", 4)); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("a deleted message's run exists: %v", err)
	}
	seq, err := write(ctx, env.log.Writer, submitEntry("after", checkpoint.StepSpec{Name: "one"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Applier.WaitApplied(ctx, seq); err != nil {
		t.Fatal(err)
	}
}

// A stream deleted and created again restarts its sequences: a node whose state was
// built from the old one refuses to start on the new one, saying what happened and how
// to recover; a node with a new state starts.
func TestRecreatedStreamIsRefused(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	writeSubmits(t, env, "old", 5)
	old := env.store
	env.log.Stop()
	if err := env.js.DeleteStream(ctx, DefaultStream); err != nil {
		t.Fatal(err)
	}
	// The new stream (Open creates it), with a message of its own.
	newer, err := startOn(t, env, memStore(t), "node-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := write(ctx, newer.Writer, submitEntry("new-0", checkpoint.StepSpec{Name: "one"})); err != nil {
		t.Fatal(err)
	}
	_, err = startOn(t, env, old, "node-a")
	if !errors.Is(err, ErrWrongLog) || !strings.Contains(err.Error(), "deleted and created again") || !strings.Contains(err.Error(), "move its state aside") {
		t.Fatalf("the old state on a recreated stream: %v; want ErrWrongLog saying the stream was recreated and how to recover", err)
	}
}

// The log purged past what a node applied, with no snapshot to bridge the gap: the
// node refuses to start instead of serving a fraction of the runs.
func TestPurgedPastAppliedIsRefused(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	writeSubmits(t, env, "a", 3)
	behind := memStore(t)
	l, err := startOn(t, env, behind, "node-b")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Applier.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	l.Stop()
	last := writeSubmits(t, env, "b", 5)
	stream, err := env.js.Stream(ctx, DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(last-1)); err != nil {
		t.Fatal(err)
	}
	_, err = startOn(t, env, behind, "node-b")
	if !errors.Is(err, ErrWrongLog) || !strings.Contains(err.Error(), "purged") {
		t.Fatalf("a state behind a purged log: %v; want ErrWrongLog saying messages were purged", err)
	}
	// Control: a node that had applied everything purged starts.
	if _, err := startOn(t, env, env.store, "node-a"); err != nil {
		t.Fatalf("a node caught up with the purged log: %v", err)
	}
}

// A stream deleted and created again while a node consumes it: the node's applier stops
// with ErrWrongLog (it must not go on serving its old state while every write times
// out).
func TestRecreatedWhileConsumingStopsTheApplier(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	writeSubmits(t, env, "old", 3)
	watched, err := startOn(t, env, memStore(t), "node-b")
	if err != nil {
		t.Fatal(err)
	}
	if err := watched.Applier.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := env.js.DeleteStream(ctx, DefaultStream); err != nil {
		t.Fatal(err)
	}
	if _, err := env.js.CreateStream(ctx, jetstream.StreamConfig{Name: DefaultStream, Subjects: []string{DefaultSubject}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-watched.Applier.Failed():
	case <-time.After(20 * time.Second):
		t.Fatalf("the applier goes on after its stream was recreated (applied %d)", watched.Applier.Store().Applied())
	}
	if err := watched.Applier.Err(); !errors.Is(err, ErrWrongLog) {
		t.Fatalf("applier stopped with %v; want ErrWrongLog", err)
	}
}

// Garbage published to the log is rejected at its sequence and applying goes on: the
// next write is applied and its writer gets its verdict.
func TestGarbageInTheLogIsRejected(t *testing.T) {
	env := startEnv(t, t.TempDir())
	ctx := ctxT(t)
	ack, err := env.js.Publish(ctx, DefaultSubject, []byte("garbage"))
	if err != nil {
		t.Fatal(err)
	}
	seq, err := write(ctx, env.log.Writer, submitEntry("after", checkpoint.StepSpec{Name: "one"}))
	if err != nil {
		t.Fatalf("a write after garbage: %v", err)
	}
	if seq != ack.Sequence+1 {
		t.Fatalf("write at %d, garbage at %d", seq, ack.Sequence)
	}
	rejected, err := env.store.RejectedMessages()
	if err != nil || len(rejected) != 1 || rejected[0].Seq != ack.Sequence {
		t.Fatalf("rejections: %v %v", rejected, err)
	}
}
