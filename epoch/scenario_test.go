package epoch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/logstream"
)

// The seeds' scenario C: a worker whose heartbeat was removed keeps working after its
// lease lapsed; the leader reclaims the run with a new epoch and another worker takes
// it. The first worker's next commit is rejected and it stops with the reason
// lock-stolen-mid-run. With fencing disabled too, the same story ends in a double commit.

const stolenReason = "lock-stolen-mid-run"

var scenarioSteps = []string{"s1", "s2", "s3", "s4"}

type scenarioWorker struct {
	name    string
	lg      *logstream.Log
	lease   *Lease
	epoch   int64
	paused  chan struct{} // a step blocks here until closed (a long step, a GC pause)
	entered chan struct{} // closed when the worker reaches the step it pauses before (may be nil)
}

// work runs the steps from the first without a checkpoint; it returns why it stopped
// ("error: ..." for what should not happen: it runs on goroutines, where t.Fatal may
// not be called).
func (w *scenarioWorker) work(ctx context.Context, pauseBefore string) string {
	steps, err := w.lg.Applier.Store().Steps("run-c")
	if err != nil {
		return "error: " + err.Error()
	}
	for _, st := range steps {
		if st.Status == checkpoint.StepSucceeded {
			continue // resume from checkpoints
		}
		if st.Name == pauseBefore {
			if w.entered != nil {
				close(w.entered)
			}
			select { // the test wakes it
			case <-w.paused:
			case <-ctx.Done():
				return "never woken: " + ctx.Err().Error()
			}
		}
		if err := w.lease.Check(); err != nil {
			return "lease-lost"
		}
		err := w.lg.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "run-c", Step: st.Name,
			Item: checkpoint.ItemWhole, Epoch: w.epoch, Owner: w.name, Output: json.RawMessage(fmt.Sprintf(`{"by":%q}`, w.name))}).Await(ctx)
		if errors.Is(err, checkpoint.ErrFenced) {
			return stolenReason
		}
		if err != nil {
			return "error: " + err.Error()
		}
	}
	return "done"
}

// scenarioResult is how scenario C ended.
type scenarioResult struct {
	zombie, fresh string // why each worker stopped
	accepted      map[string]int
	fenced        []checkpoint.Fenced
	s2By          string // whose output s2's checkpoint holds
}

// runScenarioC: the zombie commits s1 and stalls before s2 with its heartbeat removed;
// its lease lapses; the leader hands the run to "fresh", which also stops before s2;
// then the zombie wakes and commits s2, which nobody has committed yet (so only the
// epoch check can fence it), and then fresh goes on.
func runScenarioC(t *testing.T, heartbeat bool, guardsOff *testhooks.Hooks) scenarioResult {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store, err := checkpoint.OpenStore(filepath.Join(t.TempDir(), "state"), checkpoint.StoreOptions{Hooks: guardsOff})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	logCfg := logstream.DefaultConfig()
	src, err := jsport.OpenStream(ctx, js, jsport.LogConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	logCfg.Stream, logCfg.Store, logCfg.Node = src, store, "node"
	lg, err := logstream.Open(logCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := lg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer lg.Stop()
	write := func(e checkpoint.Entry) uint64 {
		f := lg.Writer.Write(ctx, e)
		err := f.Await(ctx)
		seq := f.Seq()
		if err != nil {
			t.Fatalf("%s: %v", e.Kind, err)
		}
		return seq
	}
	var specs []checkpoint.StepSpec
	for _, s := range scenarioSteps {
		specs = append(specs, checkpoint.StepSpec{Name: s})
	}
	write(checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: "run-c", Submit: &checkpoint.Submit{Workflow: "wf", Trigger: checkpoint.TriggerManual, Steps: specs}})
	e1 := int64(write(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "run-c", Term: 1}))

	zombieCfg := testConfig()
	zombieCfg.Hooks = &testhooks.Hooks{NoRenew: !heartbeat, NoKillSwitch: !heartbeat}
	zls, err := newLeases(ctx, js, zombieCfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := newLeases(ctx, js, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	watcher, err := ls.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Stop()

	zl, err := zls.Acquire(ctx, "run-c", e1, "zombie")
	if err != nil {
		t.Fatal(err)
	}
	defer zl.Release(ctx)
	write(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "run-c", Epoch: e1, Owner: "zombie"})
	zombie := &scenarioWorker{name: "zombie", lg: lg, lease: zl, epoch: e1, paused: make(chan struct{})}
	stopped := make(chan string, 1)
	go func() { stopped <- zombie.work(ctx, "s2") }() // commits s1, then stalls before s2
	zombieStopped := func() string {
		select {
		case stop := <-stopped:
			return stop
		case <-time.After(10 * testTTL):
			t.Fatal("the zombie did not stop within 10 TTLs of waking")
			return ""
		}
	}

	// The leader: when the zombie's lease lapses, reclaim the run and hand it to "fresh".
	select {
	case ev := <-watcher.Events():
		if !heartbeat && (ev.Kind != LeaseLapsed || ev.Lease.Owner != "zombie") {
			t.Fatalf("event %+v", ev)
		}
		if heartbeat {
			t.Fatalf("the lease lapsed although the holder renewed it: %+v", ev)
		}
	case <-time.After(3 * testTTL):
		if !heartbeat {
			t.Fatal("the zombie's lease never lapsed")
		}
		// With its heartbeat, the long step kept its lease for 3 TTLs: nothing to steal.
		close(zombie.paused)
		return scenarioResult{zombie: zombieStopped(), accepted: countAccepted(t, store)}
	}
	e2 := int64(write(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "run-c", Epoch: e1, Term: 1, Reason: checkpoint.ReasonLeaseExpired}))
	fl, err := ls.Acquire(ctx, "run-c", e2, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Release(ctx)
	write(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "run-c", Epoch: e2, Owner: "fresh"})
	fresh := &scenarioWorker{name: "fresh", lg: lg, lease: fl, epoch: e2, paused: make(chan struct{}), entered: make(chan struct{})}
	freshStopped := make(chan string, 1)
	go func() { freshStopped <- fresh.work(ctx, "s2") }()
	select {
	case <-fresh.entered:
	case <-time.After(10 * testTTL):
		t.Fatal("the new owner never reached s2")
	}
	// The zombie wakes up and carries on with s2, before the new owner commits it.
	close(zombie.paused)
	res := scenarioResult{zombie: zombieStopped()}
	close(fresh.paused)
	select {
	case res.fresh = <-freshStopped:
	case <-time.After(10 * testTTL):
		t.Fatal("the new owner did not stop within 10 TTLs")
	}
	v, err := store.View("run-c")
	if err != nil {
		t.Fatal(err)
	}
	res.accepted, res.fenced = countAccepted(t, store), v.Fenced
	var out struct{ By string }
	_ = json.Unmarshal(v.Steps[1].Output, &out)
	res.s2By = out.By
	return res
}

func countAccepted(t *testing.T, store *checkpoint.Store) map[string]int {
	v, err := store.View("run-c")
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, ev := range v.Events {
		if ev.Kind == checkpoint.KindCommit && ev.Outcome == "accepted" {
			n[ev.Step]++
		}
	}
	return n
}

func TestScenarioC(t *testing.T) {
	t.Run("heartbeat keeps the lease through a long step", func(t *testing.T) {
		res := runScenarioC(t, true, &testhooks.Hooks{})
		if res.zombie != "done" {
			t.Fatalf("worker stopped: %s", res.zombie)
		}
		for _, s := range scenarioSteps {
			if res.accepted[s] != 1 {
				t.Fatalf("step %s committed %d times", s, res.accepted[s])
			}
		}
	})
	t.Run("no heartbeat: stolen mid-run, fenced by the epoch check", func(t *testing.T) {
		res := runScenarioC(t, false, &testhooks.Hooks{})
		if res.zombie != stolenReason || res.fresh != "done" {
			t.Fatalf("zombie stopped with %q, the new owner with %q; want %q and done", res.zombie, res.fresh, stolenReason)
		}
		if len(res.fenced) != 1 || res.fenced[0].Reason != "stale-epoch" || res.fenced[0].Step != "s2" || res.fenced[0].Owner != "zombie" {
			t.Fatalf("fenced %+v; want the zombie's s2 fenced as stale-epoch", res.fenced)
		}
		for _, s := range scenarioSteps {
			if res.accepted[s] != 1 {
				t.Fatalf("step %s committed %d times; want once", s, res.accepted[s])
			}
		}
		if res.s2By != "fresh" {
			t.Fatalf("s2's checkpoint is %q's; want fresh's", res.s2By)
		}
	})
	t.Run("no heartbeat and no epoch check: the zombie's commit is kept", func(t *testing.T) {
		res := runScenarioC(t, false, &testhooks.Hooks{NoEpochCheck: true})
		if res.s2By != "zombie" || res.accepted["s2"] != 1 {
			t.Fatalf("without the epoch check s2 holds %q's output (accepted %d times); the control expects the zombie's stale commit kept", res.s2By, res.accepted["s2"])
		}
		t.Logf("without the epoch check the zombie's stale commit of s2 was kept; the new owner stopped with %q", res.fresh)
	})
	t.Run("no heartbeat and no fencing: the double commit", func(t *testing.T) {
		res := runScenarioC(t, false, &testhooks.Hooks{NoEpochCheck: true, NoCheckpointCheck: true})
		if res.accepted["s2"] != 2 {
			t.Fatalf("without fencing, step s2 was committed %d times; the control expects the double commit (zombie stopped: %s)", res.accepted["s2"], res.zombie)
		}
		t.Logf("without fencing the zombie's stale commit of s2 and the new owner's were both accepted: %v", res.accepted)
	})
}
