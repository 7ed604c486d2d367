package engine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/worker"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/testkit/proctest"
	"github.com/flowrun/flow/steps"
)

// pollUntil polls cond (other processes' state, a KV key: nothing to wait on) until it
// holds or d passes.
func pollUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond) // polling, with a deadline
	}
}

// Invariant 8, cancel: an exec step is running on node A (a process that will write a
// marker, its side effect, two seconds later); an operator cancels the run through node B.
// Node A learns it from the log, the step's process group is stopped at once (the
// process is gone, the marker never appears), the lease is released, and A writes
// nothing more for that epoch. The control keeps A's epoch running after the cancel
// (the propagation switched off): the run says cancelled, yet the marker appears, and
// A's late commit reaches the log (refused, as the run is over).
func TestCancelStopsTheStepProcess(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "cancel-on-another-node", true: "control-not-propagated"}[control], func(t *testing.T) {
			srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(t.TempDir(), "nats"), Listen: "127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Shutdown) // after the engines' Stop (cleanups run last-in first-out)
			a := startEngine(t, func(c *Config) { c.NATSURL = srv.ClientURL() })
			a.hooks.KeepEndedRunning.Store(control)
			dir := t.TempDir()
			pidFile, marker := filepath.Join(dir, "pid"), filepath.Join(dir, "marker")
			apply(t, a, fmt.Sprintf(`
name: side-effect
steps:
  - name: pay
    uses: exec
    with: {command: [sh, -c, "read hp _ < /proc/self/stat; echo $hp > %s; sleep 2; touch %s"]}
`, pidFile, marker))
			ctx := ctxT(t, 30*time.Second)
			id, err := a.StartRun(ctx, "side-effect", nil, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var pid int
			pollUntil(t, 10*time.Second, "the step's process", func() bool {
				b, err := os.ReadFile(pidFile)
				pid, _ = strconv.Atoi(string(bytes.TrimSpace(b)))
				return err == nil && bytes.HasSuffix(b, []byte("\n")) && pid > 0
			})
			b := startEngine(t, func(c *Config) { c.NodeID = "node-b"; c.NATSURL = srv.ClientURL() })
			if err := b.Cancel(ctx, id, ""); err != nil {
				t.Fatal(err)
			}
			r, err := a.WaitRun(ctx, id)
			if err != nil || r.Status != checkpoint.StatusCancelled {
				t.Fatalf("run on node A: %v %+v", err, r)
			}
			kv, err := a.js.KeyValue(ctx, epoch.LeaseBucket)
			if err != nil {
				t.Fatal(err)
			}
			leaseGone := func() bool {
				_, err := kv.Get(ctx, id)
				return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted)
			}
			if control {
				pollUntil(t, 10*time.Second, "the marker of the cancelled run's step", func() bool { _, err := os.Stat(marker); return err == nil })
				pollUntil(t, 10*time.Second, "the lease released after the step", leaseGone)
				if after := eventsAfterCancel(t, a, id); len(after) == 0 {
					t.Fatal("control: node A wrote nothing after the cancel")
				}
				return
			}
			pollUntil(t, 2*time.Second, "the step's process to be stopped", func() bool { return !proctest.Alive(pid) })
			pollUntil(t, 5*time.Second, "the lease released", leaseGone)
			// The process is dead and the marker is its last act: it cannot appear now.
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the cancelled step's side effect happened")
			}
			// The lease is released after execute's last write: none followed the cancel.
			if after := eventsAfterCancel(t, a, id); len(after) != 0 {
				t.Fatalf("node A wrote after the cancel: %+v", after)
			}
		})
	}
}

// eventsAfterCancel returns the run's events after its cancel entry.
func eventsAfterCancel(t *testing.T, e *Engine, id string) []checkpoint.Event {
	t.Helper()
	v, err := e.store.View(id)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range v.Events {
		if ev.Kind == checkpoint.KindCancel {
			return v.Events[i+1:]
		}
	}
	t.Fatalf("no cancel among the events %+v", v.Events)
	return nil
}

// A step that ignores SIGTERM gets SIGKILL after the engine's stop grace, TTL/4 of the
// lease (250ms here), not Exec's 2s default: a lost lease's process is dead before the
// lease can move to another node (docs/decisions.md).
func TestCancelKillsAStubbornStepWithinTheLeaseGrace(t *testing.T) {
	e := startEngine(t, nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	apply(t, e, fmt.Sprintf(`
name: stubborn
steps:
  - name: hang
    uses: exec
    with: {command: [sh, -c, "trap '' TERM; read hp _ < /proc/self/stat; echo $hp > %s; while true; do sleep 0.02; done"]}
`, pidFile))
	ctx := ctxT(t, 30*time.Second)
	id, err := e.StartRun(ctx, "stubborn", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	pollUntil(t, 10*time.Second, "the step's process", func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(string(bytes.TrimSpace(b)))
		return err == nil && bytes.HasSuffix(b, []byte("\n")) && pid > 0
	})
	cancelled := time.Now()
	if err := e.Cancel(ctx, id, ""); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 5*time.Second, "the stubborn process to be killed", func() bool { return !proctest.Alive(pid) })
	grace := e.workers.StopGrace()
	// Under the 2s default, whatever the load on the machine: the grace was cut.
	if took := time.Since(cancelled); grace != testLease.TTL/4 || took < grace || took >= steps.KillGrace {
		t.Fatalf("killed %s after the cancel with a grace of %s; want the grace %s, and dead before Exec's default grace %s", took, grace, testLease.TTL/4, steps.KillGrace)
	}
}

// A cancel applied after newRunExec read the run but before the run was registered in
// e.mu.running finds nothing to stop; execute's first act (checkEnded) catches it. The
// control: with no run ended meanwhile, checkEnded leaves the epoch alone (and reads
// nothing).
func TestCancelBeforeRegistrationIsCaught(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.DisableScheduler = true }) // the run stays pending: no owner races the test
	apply(t, e, "name: idle\nsteps:\n  - name: a\n    uses: noop\n")
	ctx := ctxT(t, 20*time.Second)
	for _, cancelled := range []bool{true, false} {
		id, err := e.StartRun(ctx, "idle", nil, RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lease, err := e.leases.Acquire(ctx, id, 1, e.cfg.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		cause, err := e.workers.ProbeEnded(id, 1, lease, func() {
			if cancelled {
				if err := e.Cancel(ctx, id, ""); err != nil {
					t.Fatal(err)
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if (cause != nil) != cancelled || (cancelled && !errors.Is(cause, worker.ErrRunEnded)) {
			t.Fatalf("cancelled %v: the epoch's context ended with %v", cancelled, cause)
		}
		_ = lease.Release(ctx)
	}
}
