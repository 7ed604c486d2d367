package clustertest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/beats"
)

// keyCluster is three flowd (leases of ttl, and the flags extra) on a NATS server of
// their own, running the binary bin, with the beats workflow "keyed" applied (n beats a
// step).
func keyCluster(t *testing.T, bin, ttl string, n int, extra ...string) (*client.Client, map[string]*Proc, string) {
	t.Helper()
	return keyClusterOf(t, beats.Workflow, bin, ttl, n, extra...)
}

// keyClusterOf is keyCluster with the workflow "keyed" that workflowOf gives (beats'
// Workflow: the run holds the key; StepWorkflow: its step pay does).
func keyClusterOf(t *testing.T, workflowOf func(testing.TB, string, string, int, int) string, bin, ttl string, n int, extra ...string) (*client.Client, map[string]*Proc, string) {
	t.Helper()
	url := startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	names := []string{"node-a", "node-b", "node-c"}
	nodes := map[string]*Proc{}
	for _, name := range names {
		nodes[name] = startFlowdBin(t, c, name, bin, append(append([]string{"--lease-ttl", ttl}, extra...), stepsAsTestUser()...)...)
	}
	logsOnFailure(t, names, nodes)
	cl := dial(t, c)
	WaitFor(t, 60*time.Second, "a leader and three nodes", func() bool {
		st := statusOf(t, cl)
		return st.Leader != "" && len(st.Nodes) == 3
	})
	dir := t.TempDir()
	if err := call(t, cl, "workflow.apply", client.Request{File: "keyed.yaml", YAML: workflowOf(t, "keyed", dir, n, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	return cl, nodes, dir
}

// startKeyed starts runs k00.. of one key, in order.
func startKeyed(t *testing.T, cl *client.Client, runs int) []string {
	t.Helper()
	var ids []string
	for i := 0; i < runs; i++ {
		id := fmt.Sprintf("k%02d", i)
		if err := call(t, cl, "run.start", client.Request{Workflow: "keyed", ID: id, Inputs: map[string]string{"acct": "a"}}, nil); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// beatingOffLeader waits for a run of ids to be running and beating on a node that does
// not lead, other than the runs in skip, and returns it and its owner.
func beatingOffLeader(t *testing.T, cl *client.Client, dir string, ids []string, skip map[string]bool) (string, string) {
	t.Helper()
	var run, owner string
	WaitFor(t, 90*time.Second, "a run beating on a node that does not lead", func() bool {
		leader := statusOf(t, cl).Leader
		// Beating now, read before and after asking where it runs: the asks take a
		// while on a loaded machine, and a beat read before many of them is stale.
		beating := func(id string) bool {
			iv, ok := beats.Intervals(dir)[id]
			return ok && time.Since(time.Unix(0, iv.Last)) < 500*time.Millisecond
		}
		for _, id := range ids {
			if skip[id] || !beating(id) {
				continue
			}
			var r client.Run
			if call(t, cl, "run.get", client.Request{ID: id}, &r) != nil || r.Status != "running" || r.Owner == "" || r.Owner == leader {
				continue
			}
			if beating(id) {
				run, owner = id, r.Owner
				return true
			}
		}
		return false
	})
	return run, owner
}

// cancelRun cancels run id, asking again after a second without an answer: a request
// the NATS server hands to the paused flowd (a member of the API's queue group still, as
// far as the server knows) is never answered, and the next goes to another.
func cancelRun(t *testing.T, cl *client.Client, id string) {
	t.Helper()
	WaitFor(t, 30*time.Second, "the cancel of "+id+" answered", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cl.CancelRun(ctx, id)
		var ae *client.Error
		return err == nil || errors.As(err, &ae) && ae.Code == client.CodeConflict // an earlier ask got through
	})
}

// A key with limit 1 holds one run at a time in real time, through the faults that make
// a run's books and its processes part: 20 runs of one key on three flowd, the owner of
// one SIGKILLed (and restarted), the owner of another SIGSTOPped past its lease (its run
// taken over, then the owner let go on), and the owner of a third SIGSTOPped and its run
// cancelled meanwhile (its step runs on until its trust deadline). Each step writes a
// beat every 20ms while it runs; no two runs' beats interleave, and every run ends.
//
// No two epochs of one run beat at once either: the paused owner's step stops at its
// trust deadline, before the lease can lapse and the run be taken over.
//
// The controls switch off one guard each: the leader's slot drain (a slot free once the
// state ends its run: the cancel of a paused owner's run lets the next run start while
// the cancelled step still beats), and the step's trust deadline (steps.noTrustDeadline:
// a paused owner's step beats on beside its run's next epoch, which took the key's slot
// over at the lease's lapse).
func TestKeyHoldsOneRunAtATime(t *testing.T) {
	if testing.Short() {
		t.Skip("SIGKILLs and SIGSTOPs flowd processes")
	}
	t.Parallel()
	t.Run("guard", func(t *testing.T) {
		cl, nodes, dir := keyCluster(t, filepath.Join(Binaries(t), "flowd"), "2s", 50)
		keyFaults(t, cl, nodes, dir, startKeyed(t, cl, 20))
	})
	// The same faults on a step's key: the runs park at step pay for its slot (no lease,
	// no worker) and hold it only there.
	t.Run("guard-step-key", func(t *testing.T) {
		cl, nodes, dir := keyClusterOf(t, beats.StepWorkflow, filepath.Join(Binaries(t), "flowd"), "2s", 50)
		keyFaults(t, cl, nodes, dir, startKeyed(t, cl, 12))
	})
	t.Run("control-no-drain", func(t *testing.T) {
		bin := FlowdLinkedWith(t, "github.com/flowrun/flow/engine/internal/leader.noSlotDrain=1")
		// Longer leases and steps than the guard's: the paused owner's step runs on for
		// the trust window (2/3 of the TTL) after its last renewal, which the next run
		// must start within for the damage to show, on a loaded machine too.
		// One worker a node: a node busy with its run has no fetch open, so the paused
		// owner's stale fetch cannot take the next run's task (which would then wait for
		// a redelivery, long after the cancelled step stopped).
		cl, nodes, dir := keyCluster(t, bin, "10s", 400, "--workers", "1")
		ids := startKeyed(t, cl, 12)
		// A try can still miss the window (the cancel's asks that go to the paused node
		// take a second each): up to three tries, each with another run.
		skip := map[string]bool{}
		for try := 1; ; try++ {
			cancelled, owner := beatingOffLeader(t, cl, dir, ids, skip)
			skip[cancelled] = true
			nodes[owner].Stop()
			cancelRun(t, cl, cancelled)
			damaged := false
			for deadline := time.Now().Add(30 * time.Second); !damaged && time.Now().Before(deadline); {
				damaged = len(beats.Crossings(beats.Intervals(dir), ids)) > 0
				time.Sleep(20 * time.Millisecond) // polling the beats file, with a deadline
			}
			nodes[owner].Cont()
			if damaged {
				t.Logf("control (try %d): %v", try, beats.Crossings(beats.Intervals(dir), ids))
				return
			}
			if try == 3 {
				t.Fatalf("with the drain off, no run of the key beat beside a cancelled one in %d tries: the control shows nothing", try)
			}
			t.Logf("try %d: %s cancelled while %s was paused, and no run beat beside it; again", try, cancelled, owner)
		}
	})
	t.Run("control-no-trust-deadline", func(t *testing.T) {
		bin := FlowdLinkedWith(t, "github.com/flowrun/flow/steps.noTrustDeadline=1")
		// Steps long enough (600 beats, 12 s and more) to outlive a 2 s lease's lapse
		// and the takeover after it.
		cl, nodes, dir := keyCluster(t, bin, "2s", 600)
		ids := startKeyed(t, cl, 12)
		stopped, owner := beatingOffLeader(t, cl, dir, ids, nil)
		nodes[owner].Stop()
		defer nodes[owner].Cont()
		WaitFor(t, 60*time.Second, "the damage: "+stopped+"'s next epoch beating beside its paused owner's step", func() bool {
			ex := beats.Executions(dir)
			return len(beats.Crossings(ex, beats.Keys(ex))) > 0
		})
		ex := beats.Executions(dir)
		t.Logf("control: %v", beats.Crossings(ex, beats.Keys(ex)))
	})
}

// keyFaults is TestKeyHoldsOneRunAtATime's guard on runs ids of one key: a holder's node
// SIGKILLed and restarted, another SIGSTOPped past its lease until its run is taken over,
// a third's run cancelled while its node is SIGSTOPped; every run ends and no two runs'
// (nor two epochs') beats cross.
func keyFaults(t *testing.T, cl *client.Client, nodes map[string]*Proc, dir string, ids []string) {
	t.Helper()
	skip := map[string]bool{}

	killed, owner := beatingOffLeader(t, cl, dir, ids, skip)
	skip[killed] = true
	nodes[owner].Kill()
	nodes[owner].Restart(t)
	t.Logf("%s's owner %s SIGKILLed and restarted", killed, owner)

	stopped, owner := beatingOffLeader(t, cl, dir, ids, skip)
	skip[stopped] = true
	nodes[owner].Stop()
	WaitFor(t, 60*time.Second, stopped+" taken over from its paused owner", func() bool {
		var r client.Run
		return call(t, cl, "run.get", client.Request{ID: stopped}, &r) == nil && r.Owner != owner && len(r.Epochs) > 1
	})
	nodes[owner].Cont()
	t.Logf("%s's owner %s SIGSTOPped past its lease and let go on", stopped, owner)

	cancelled, owner := beatingOffLeader(t, cl, dir, ids, skip)
	nodes[owner].Stop()
	cancelRun(t, cl, cancelled)
	WaitFor(t, 60*time.Second, "a run after the cancelled one beating", func() bool {
		ivs := beats.Intervals(dir)
		for _, id := range ids {
			if iv, ok := ivs[id]; ok && iv.First > ivs[cancelled].Last {
				return true
			}
		}
		return false
	})
	nodes[owner].Cont()
	t.Logf("%s cancelled while its owner %s was SIGSTOPped", cancelled, owner)

	WaitFor(t, 180*time.Second, "every run ended", func() bool {
		for _, id := range ids {
			var r client.Run
			if call(t, cl, "run.get", client.Request{ID: id}, &r) != nil || (r.Status != "succeeded" && r.Status != "cancelled") {
				return false
			}
		}
		return true
	})
	ivs := beats.Intervals(dir)
	if c := beats.Crossings(ivs, ids); len(c) > 0 {
		t.Fatalf("runs of one key ran at once: %v", c)
	}
	// Nor two epochs of one run: the paused owner's step stopped at its trust
	// deadline, before its run's next epoch began.
	if ex := beats.Executions(dir); len(beats.Crossings(ex, beats.Keys(ex))) > 0 {
		t.Fatalf("executions of one key ran at once: %v", beats.Crossings(ex, beats.Keys(ex)))
	}
	t.Logf("the shortest time between one run's last beat and the next one's first: %s", beats.ShortestGap(ivs))
	if len(ivs) < len(ids)-1 {
		t.Fatalf("only %d of %d runs beat: the test saw too little", len(ivs), len(ids))
	}
}
