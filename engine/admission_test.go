package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/testkit/within"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/steps"
)

// With many more pending runs than workers, the leader gives an epoch only to as many
// as the workers can take: after every message of the log, the runs holding an epoch
// (assigned and waiting, or running) are at most the worker slots plus queueAhead. The
// others wait without an epoch and are assigned oldest submission first; every run
// succeeds. Negative control: with admission off, the leader assigns the whole backlog
// at once (issue 12's ~500k tasks), and the bound is broken.
func TestAdmissionBoundsEpochs(t *testing.T) {
	const workers, ahead, runs = 2, 3, 120
	for _, admission := range []bool{true, false} {
		t.Run(fmt.Sprintf("admission=%v", admission), func(t *testing.T) {
			e := startEngine(t, func(c *Config) { c.Workers = workers })
			defer stopEngine(e)
			e.hooks.QueueAheadN.Store(ahead)
			e.hooks.NoAdmission.Store(!admission)
			apply(t, e, "name: one\nsteps:\n  - name: a\n    uses: noop\n")
			ctx := ctxT(t, 60*time.Second)
			ids := make([]string, runs)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 32)
			for i := range ids {
				ids[i] = fmt.Sprintf("r-%04d", i)
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					// Given IDs take the scheduler's path: every assign is the
					// scheduler's, so the order below is the scheduler's alone.
					if _, err := e.StartRun(ctx, "one", nil, RunOptions{ID: ids[i]}); err != nil {
						t.Error(err)
					}
				}()
			}
			within.Group(t, 60*time.Second, &wg, "the submits")
			// A run StartRun names takes the leader's short path when there is room, but
			// not past the runs waiting for it: it is assigned after them (checked below).
			late, err := e.StartRun(ctx, "one", nil, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, late)
			for _, id := range ids {
				if r, err := e.WaitRun(ctx, id); err != nil || r.Status != checkpoint.StatusSucceeded {
					t.Fatalf("run %s: %v %v", id, err, r)
				}
			}
			peak := replayPeakHeld(t, e)
			bound := workers + ahead
			if admission && peak > bound {
				t.Fatalf("%d runs held an epoch at once, over %d worker slots + %d queued ahead", peak, workers, ahead)
			}
			if !admission && peak <= bound {
				t.Fatalf("without admission the peak was %d, within the bound %d: the test shows nothing", peak, bound)
			}
			t.Logf("peak runs holding an epoch: %d (bound %d)", peak, bound)
			if !admission {
				return
			}
			// Oldest submission first: the first epochs follow the submits' order (and,
			// within one log message, the run IDs').
			var rs []*checkpoint.Run
			for _, id := range ids {
				r, err := e.store.Run(id)
				if err != nil {
					t.Fatal(err)
				}
				rs = append(rs, r)
			}
			slices.SortFunc(rs, func(a, b *checkpoint.Run) int {
				return cmp.Or(cmp.Compare(a.CreatedSeq, b.CreatedSeq), cmp.Compare(a.ID, b.ID))
			})
			for i := 1; i < len(rs); i++ {
				if rs[i].Epochs[0].Epoch < rs[i-1].Epochs[0].Epoch {
					t.Fatalf("run %s (submitted at %d) was assigned at %d, before %s (submitted at %d, assigned at %d)",
						rs[i].ID, rs[i].CreatedSeq, rs[i].Epochs[0].Epoch, rs[i-1].ID, rs[i-1].CreatedSeq, rs[i-1].Epochs[0].Epoch)
				}
			}
		})
	}
}

// replayPeakHeld applies e's whole log to a fresh store, message by message, and
// returns the most runs that held an epoch at once.
func replayPeakHeld(t *testing.T, e *Engine) int {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	s, err := checkpoint.OpenStore(filepath.Join(t.TempDir(), "replay"), checkpoint.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	stream, err := e.js.Stream(ctx, logstream.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	last := stream.CachedInfo().State.LastSeq
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	peak := 0
	for seq := uint64(0); seq < last; {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		md, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		seq = md.Sequence.Stream
		if _, err := s.Apply(seq, msg.Data()); err != nil {
			t.Fatal(err)
		}
		assigned, running := s.Held()
		peak = max(peak, assigned+running)
	}
	return peak
}

// Tasks cannot take the memory leases need: with FLOW_TASKS full to its cap, a held
// lease keeps renewing and a new one is taken. Negative control: without the cap, tasks
// fill the server's memory budget and the lease is lost and no new one can be taken
// (issue 12: "every lease renewal fails (insufficient resources)").
func TestFullTaskStreamLeavesLeasesTheirMemory(t *testing.T) {
	for _, capped := range []bool{true, false} {
		t.Run(fmt.Sprintf("capped=%v", capped), func(t *testing.T) {
			srv, err := natsnode.Start(natsnode.Config{DataDir: t.TempDir(), MaxMemory: 4 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown()
			nc, err := srv.Connect()
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t, 30*time.Second)
			cfg := epoch.Config{TTL: 600 * time.Millisecond, AllowShortTTL: true, Counters: &epoch.Counters{}}
			kv, err := jsport.OpenKV(ctx, js, jsport.LeasesConfig(cfg.TTL, 1), nil)
			if err != nil {
				t.Fatal(err)
			}
			leases, err := epoch.NewLeases(kv, cfg)
			if err != nil {
				t.Fatal(err)
			}
			held, err := leases.Acquire(ctx, "run-held", 1, "node-a")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = held.Release(context.Background()) }()
			var maxBytes int64 // 0: no cap
			if capped {
				maxBytes = 1 << 20
			}
			if err := jsport.EnsureTasks(ctx, js, 1, maxBytes); err != nil {
				t.Fatal(err)
			}
			// Fill the stream until the server refuses a task.
			junk := []byte(strings.Repeat("x", 32<<10))
			var refused error
			for i := 0; refused == nil; i++ {
				if i > 1000 {
					t.Fatal("32 MiB of tasks accepted on a 4 MiB server")
				}
				_, refused = js.Publish(ctx, port.TasksSubject, junk, jetstream.WithMsgID(fmt.Sprint("junk-", i)))
			}
			info, err := js.Stream(ctx, port.TasksStream)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("tasks stream full at %d bytes: %v", info.CachedInfo().State.Bytes, refused)
			// Three renewals of the held lease after the stream filled, and a new lease.
			ok := cfg.Counters.RenewalsOK.Load()
			deadline := time.Now().Add(3 * time.Second)
			for cfg.Counters.RenewalsOK.Load() < ok+3 && held.Err() == nil && time.Now().Before(deadline) {
				select {
				case <-held.Done():
				case <-time.After(20 * time.Millisecond): // polling a counter, with a deadline
				}
			}
			actx, cancel := context.WithTimeout(ctx, time.Second) // Acquire retries until its context ends
			fresh, acqErr := leases.Acquire(actx, "run-new", 2, "node-a")
			cancel()
			if acqErr == nil {
				defer func() { _ = fresh.Release(context.Background()) }()
			}
			if capped {
				if err := held.Err(); err != nil {
					t.Fatalf("the held lease was lost with the tasks stream full: %v", err)
				}
				if cfg.Counters.RenewalsOK.Load() < ok+3 {
					t.Fatal("the held lease did not renew within 3s")
				}
				if acqErr != nil {
					t.Fatalf("no new lease with the tasks stream full: %v", acqErr)
				}
				return
			}
			if acqErr == nil || !errors.Is(held.Err(), epoch.ErrLeaseLost) {
				t.Fatalf("without the cap: new lease error %v, held lease %v; want both to fail", acqErr, held.Err())
			}
		})
	}
}

// A tasks stream made before the cap gets it from an admin path's repair.
func TestTasksStreamFromBeforeTheCapGetsIt(t *testing.T) {
	srv, err := natsnode.Start(natsnode.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 10*time.Second)
	if err := jsport.EnsureTasks(ctx, js, 1, 0); err != nil { // the stream as it was
		t.Fatal(err)
	}
	// A node does not update it (a node's credential may not: issue 36); an admin path
	// does (checkStreams at a start on the embedded server, cluster repair).
	if err := jsport.EnsureTasks(ctx, js, 1, jsport.TasksMaxBytes); !errors.Is(err, jsport.ErrCapNotSet) {
		t.Fatalf("a node's ensure of a stream from before the cap: %v; want ErrCapNotSet", err)
	}
	if _, err := jsport.Repair(ctx, js, []jsport.Want{jsport.WantStream(jsport.TasksConfig(1, jsport.TasksMaxBytes))}, false, 0); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, port.TasksStream)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxBytes != jsport.TasksMaxBytes || c.Discard != jetstream.DiscardNew {
		t.Fatalf("after the update: max bytes %d, discard %v; want %d and DiscardNew", c.MaxBytes, c.Discard, jsport.TasksMaxBytes)
	}
}

// A run started on the leader does not pass runs waiting for room, even at a moment when
// there is room (the scheduler has not yet run since it freed): it is assigned after
// them. Negative control: with the check off, the short path gives it an epoch in its
// submit's message, ahead of runs submitted before it.
func TestShortPathDoesNotPassWaitingRuns(t *testing.T) {
	for _, guard := range []bool{true, false} {
		t.Run(fmt.Sprintf("guard=%v", guard), func(t *testing.T) {
			release := make(chan struct{})
			reg := steps.NewRegistry(0)
			if err := reg.Register("block", blockUntil(release)); err != nil {
				t.Fatal(err)
			}
			// Nothing but an applied message may wake the scheduler while the late run is
			// started (else it may assign the waiting runs first and the control shows
			// nothing): no reconcile tick, no lease renewal within the test.
			e := startEngine(t, func(c *Config) {
				c.Workers, c.Registry = 1, reg
				c.Lease.TTL, c.ReconcileInterval = time.Minute, time.Hour
			})
			defer stopEngine(e)
			defer close(release)
			waitLeader(t, e)
			e.hooks.QueueAheadN.Store(1)
			e.hooks.AdmitPastWaiting.Store(!guard)
			apply(t, e, "name: blocks\nsteps:\n  - name: a\n    uses: block\n")
			ctx := ctxT(t, 30*time.Second)
			// One run on the only worker, one assigned waiting for it, three waiting for room.
			ids := []string{"w1", "w2", "w3", "w4", "w5"}
			for _, id := range ids {
				if _, err := e.StartRun(ctx, "blocks", nil, RunOptions{ID: id}); err != nil {
					t.Fatal(err)
				}
			}
			// w1's step start note must be applied too, and the scheduler's pass over the
			// last message finished: either, after the room appears, would let the
			// scheduler assign the waiting runs first.
			if err := e.waitFor(ctx, func() bool {
				a, r := e.store.Held()
				st, err := e.store.Steps("w1")
				return a == 1 && r == 1 && e.store.QueuedRuns() == 3 && e.admission.Backlogged() &&
					err == nil && len(st) == 1 && st[0].Status == checkpoint.StepRunning
			}); err != nil {
				t.Fatal("the backlog did not form:", err)
			}
			for settle := time.Now().Add(10 * time.Second); e.hooks.ScheduledUpTo.Load() < e.store.Applied(); {
				if time.Now().After(settle) {
					t.Fatalf("the scheduler did not finish its pass over sequence %d", e.store.Applied())
				}
				time.Sleep(time.Millisecond) // polling the scheduler's progress, with a deadline
			}
			// Room appears; the scheduler has not run since (nothing was applied).
			before := e.store.Applied()
			e.hooks.QueueAheadN.Store(10)
			late, err := e.StartRun(ctx, "blocks", nil, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.waitFor(ctx, func() bool {
				r, err := e.store.Run(late)
				return err == nil && r.Epoch > 0
			}); err != nil {
				t.Fatal(err)
			}
			lateRun, _ := e.store.Run(late)
			passed := 0
			for _, id := range ids[2:] {
				if r, err := e.store.Run(id); err == nil && (r.Epoch == 0 || r.Epoch > lateRun.Epoch) {
					passed++
				}
			}
			if guard && passed > 0 {
				t.Fatalf("the late run (epoch %d) passed %d runs waiting before it", lateRun.Epoch, passed)
			}
			if !guard && passed == 0 {
				var eps []int64
				for _, id := range ids {
					r, _ := e.store.Run(id)
					eps = append(eps, r.Epoch)
				}
				t.Fatalf("with the check off the late run did not pass the waiting runs: the control shows nothing (applied %d before; late epoch %d; epochs %v)", before, lateRun.Epoch, eps)
			}
		})
	}
}

// blockUntil is a step that waits until release is closed (then succeeds) or its
// context ends (then fails with it).
func blockUntil(release <-chan struct{}) steps.Step {
	return steps.Func(func(ctx context.Context, _ steps.Input) (json.RawMessage, error) {
		select {
		case <-release:
			return json.RawMessage(`{}`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
}
