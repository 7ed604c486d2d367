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
	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/testhooks"
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
	return startOnWith(t, env, store, node, nil)
}

// startOnWith is startOn with the test switches h (nil: production's).
func startOnWith(t *testing.T, env *testEnv, store *checkpoint.Store, node string, h *testhooks.Hooks) (*Log, error) {
	t.Helper()
	l, err := Open(testConfig(env.js, store, node, func(c *Config) { c.StallTimeout = 400 * time.Millisecond; c.Hooks = h }))
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

// startOnFreshStream is startOn right after the stream was deleted: Open creates it
// again, and the server may refuse while it still removes the old one's files ("error
// creating store for stream", seen on a busy machine), so it is asked again, with a
// deadline.
func startOnFreshStream(t *testing.T, env *testEnv, store *checkpoint.Store, node string) *Log {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		// The stream is created here first: testConfig's creation panics on a refusal
		// (seen under busy loops beside the suite), and the refusal is this retry's to take.
		_, err := jsport.OpenStream(ctxT(t), env.js, jsport.LogConfig(1))
		var l *Log
		if err == nil {
			l, err = Open(testConfig(env.js, store, node, func(c *Config) { c.StallTimeout = 400 * time.Millisecond }))
		}
		if err == nil {
			if err = l.Start(ctxT(t)); err == nil {
				t.Cleanup(l.Stop)
				return l
			}
			l.Stop()
		}
		if !strings.Contains(err.Error(), "error creating store") || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // the server's pace, not a synchronisation
	}
}

// runsIn reports which of the runs store holds ("+id") and which it does not ("-id").
func runsIn(store *checkpoint.Store, ids ...string) string {
	var out []string
	for _, id := range ids {
		if _, err := store.Run(id); err == nil {
			out = append(out, "+"+id)
		} else {
			out = append(out, "-"+id)
		}
	}
	return strings.Join(out, " ")
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
// to recover; a node with a new state starts. Control (Hooks.NoLogCheck): the old state
// starts on the new stream and serves runs the log does not hold, without the one it
// does (the new stream's sequence 1 is at or below the old state's applied sequence).
func TestRecreatedStreamIsRefused(t *testing.T) {
	for _, check := range []bool{true, false} {
		t.Run(map[bool]string{true: "log-check", false: "control-no-log-check"}[check], func(t *testing.T) {
			env := startEnv(t, t.TempDir())
			ctx := ctxT(t)
			writeSubmits(t, env, "old", 5)
			old := env.store
			env.log.Stop()
			if err := env.js.DeleteStream(ctx, DefaultStream); err != nil {
				t.Fatal(err)
			}
			// The new stream (Open creates it), with a message of its own.
			newer := startOnFreshStream(t, env, memStore(t), "node-b")
			if _, err := write(ctx, newer.Writer, submitEntry("new-0", checkpoint.StepSpec{Name: "one"})); err != nil {
				t.Fatal(err)
			}
			l, err := startOnWith(t, env, old, "node-a", &testhooks.Hooks{NoLogCheck: !check})
			if check {
				if !errors.Is(err, ErrWrongLog) || !strings.Contains(err.Error(), "deleted and created again") || !strings.Contains(err.Error(), "move its state aside") {
					t.Fatalf("the old state on a recreated stream: %v; want ErrWrongLog saying the stream was recreated and how to recover", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("control: the old state on a recreated stream without the check: %v", err)
			}
			if err := l.Applier.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
			if got := runsIn(old, "old-0", "old-4", "new-0"); got != "+old-0 +old-4 -new-0" {
				t.Fatalf("control: the node without the log check holds %s; want the old stream's runs and not the new one's: the control shows nothing", got)
			}
			t.Logf("control: caught up with the new stream, the node serves %s", runsIn(old, "old-0", "old-4", "new-0"))
		})
	}
}

// The log purged past what a node applied, with no snapshot to bridge the gap: the
// node refuses to start instead of serving a fraction of the runs; a node that had
// applied everything purged starts. Control (Hooks.NoLogCheck): the node behind starts,
// catches up, and serves a state with a hole: the runs of the purged messages it had not
// applied are missing, the ones before and after are there.
func TestPurgedPastAppliedIsRefused(t *testing.T) {
	for _, check := range []bool{true, false} {
		t.Run(map[bool]string{true: "log-check", false: "control-no-log-check"}[check], func(t *testing.T) {
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
			if err := stream.Purge(ctx, jetstream.WithPurgeSequence(last-1)); err != nil { // b-0 to b-2 go
				t.Fatal(err)
			}
			l, err = startOnWith(t, env, behind, "node-b", &testhooks.Hooks{NoLogCheck: !check})
			if check {
				if !errors.Is(err, ErrWrongLog) || !strings.Contains(err.Error(), "purged") {
					t.Fatalf("a state behind a purged log: %v; want ErrWrongLog saying messages were purged", err)
				}
				// A node that had applied everything purged starts.
				if _, err := startOn(t, env, env.store, "node-a"); err != nil {
					t.Fatalf("a node caught up with the purged log: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("control: a state behind a purged log without the check: %v", err)
			}
			if err := l.Applier.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
			want := "+a-0 +a-2 -b-0 -b-1 -b-2 +b-3 +b-4"
			if got := runsIn(behind, "a-0", "a-2", "b-0", "b-1", "b-2", "b-3", "b-4"); got != want || behind.Applied() != last {
				t.Fatalf("control: the node without the log check holds %s (applied %d of %d); want the hole %s: the control shows nothing", got, behind.Applied(), last, want)
			}
			t.Logf("control: applied %d of %d, the node serves %s", behind.Applied(), last, want)
		})
	}
}

// A stream deleted and created again while a node consumes it: the node's applier stops
// with ErrWrongLog (it must not go on serving its old state while every write times
// out). Control (Hooks.NoLogCheck): through the same window (5 s: 50 probes, the applier
// probes every StallTimeout/4, 100 ms here) the applier goes on, and a run written to
// the new stream never reaches the node.
func TestRecreatedWhileConsumingStopsTheApplier(t *testing.T) {
	for _, check := range []bool{true, false} {
		t.Run(map[bool]string{true: "log-check", false: "control-no-log-check"}[check], func(t *testing.T) {
			env := startEnv(t, t.TempDir())
			ctx := ctxT(t)
			writeSubmits(t, env, "old", 3)
			store := memStore(t)
			watched, err := startOnWith(t, env, store, "node-b", &testhooks.Hooks{NoLogCheck: !check})
			if err != nil {
				t.Fatal(err)
			}
			if err := watched.Applier.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
			if err := env.js.DeleteStream(ctx, DefaultStream); err != nil {
				t.Fatal(err)
			}
			// The server may refuse to create the stream again while it still removes the
			// old one's files ("error creating store for stream"): ask again, with a deadline.
			for deadline := time.Now().Add(10 * time.Second); ; {
				_, err := env.js.CreateStream(ctx, jetstream.StreamConfig{Name: DefaultStream, Subjects: []string{port.LogSubject}})
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond) // the server's pace, not a synchronisation
			}
			msg, err := checkpoint.EncodeMessage("node-c", submitEntry("new-0", checkpoint.StepSpec{Name: "one"}))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := env.js.Publish(ctx, port.LogSubject, msg); err != nil {
				t.Fatal(err)
			}
			// The same window on both sides: 50 probes, where the check needs one.
			const window = 5 * time.Second
			select {
			case <-watched.Applier.Failed():
				if !check {
					t.Fatalf("control: the applier stopped without the log check: %v", watched.Applier.Err())
				}
			case <-time.After(window):
				if check {
					t.Fatalf("the applier goes on after its stream was recreated (applied %d)", store.Applied())
				}
				if got := runsIn(store, "old-0", "new-0"); got != "+old-0 -new-0" {
					t.Fatalf("control: the node holds %s: the control shows nothing", got)
				}
				t.Logf("control: %s after the stream was recreated, the applier goes on and the node serves %s", window, runsIn(store, "old-0", "new-0"))
				return
			}
			if err := watched.Applier.Err(); !errors.Is(err, ErrWrongLog) {
				t.Fatalf("applier stopped with %v; want ErrWrongLog", err)
			}
		})
	}
}

// Garbage published to the log is rejected at its sequence and applying goes on: the
// next write is applied on every node and its writer gets its verdict. Control
// (Hooks.StopOnUndecodable, the store's rejection off): the other node's applier stops
// on the garbage and never applies the write after it.
func TestGarbageInTheLogIsRejected(t *testing.T) {
	for _, reject := range []bool{true, false} {
		t.Run(map[bool]string{true: "rejected", false: "control-stop-on-undecodable"}[reject], func(t *testing.T) {
			env := startEnv(t, t.TempDir())
			ctx := ctxT(t)
			other := memStoreWith(t, &testhooks.Hooks{StopOnUndecodable: !reject})
			b, err := startOn(t, env, other, "node-b")
			if err != nil {
				t.Fatal(err)
			}
			ack, err := env.js.Publish(ctx, port.LogSubject, []byte("garbage"))
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
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			err = b.Applier.WaitApplied(wctx, seq)
			if !reject {
				var corrupt *checkpoint.CorruptError
				if err == nil || !errors.As(b.Applier.Err(), &corrupt) || corrupt.Seq != ack.Sequence || other.Applied() != ack.Sequence-1 {
					t.Fatalf("control: node-b %v (applier %v, applied %d); want it stopped on the garbage at %d: the control shows nothing", err, b.Applier.Err(), other.Applied(), ack.Sequence)
				}
				t.Logf("control: node-b stopped at %d: %v", ack.Sequence, b.Applier.Err())
				return
			}
			if err != nil {
				t.Fatalf("node-b after the garbage: %v", err)
			}
			for node, store := range map[string]*checkpoint.Store{"node-a": env.store, "node-b": other} {
				rejected, err := store.RejectedMessages()
				if err != nil || len(rejected) != 1 || rejected[0].Seq != ack.Sequence {
					t.Fatalf("%s's rejections: %v %v", node, rejected, err)
				}
				if _, err := store.Run("after"); err != nil {
					t.Fatalf("%s: the write after the garbage: %v", node, err)
				}
			}
		})
	}
}
