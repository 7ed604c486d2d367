package clustertest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// Durable timers across a failover (issue 26): three flowd processes on one NATS
// server, runs parked on a sleep until one instant; the leader is SIGKILLed just before
// it. Every run wakes once (one accepted wake in its history, whatever the new leader
// and the old one wrote), and the wake is late by the failover: at most the lease TTL it
// takes the term to lapse, the new leader's first timer pass, and the log's round trip.
func TestTimersFireOnceAcrossALeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a flowd process while timers are due")
	}
	t.Parallel()
	url := startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	nodes := map[string]*Proc{}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		nodes[n] = StartFlowd(t, c, n, "--lease-ttl", "1s")
	}
	cl := dial(t, c)
	leader := func() (string, int64) {
		var st client.ClusterStatus
		if call(t, cl, "cluster.status", client.Request{}, &st) != nil {
			return "", 0
		}
		return st.Leader, st.Term
	}
	WaitFor(t, 30*time.Second, "a leader", func() bool { l, _ := leader(); return l != "" })
	yaml := "name: nap\ninputs:\n  at: {type: string}\nsteps:\n  - {name: nap, uses: sleep, with: {until: \"{{ inputs.at }}\"}}\n"
	if err := call(t, cl, "workflow.apply", client.Request{File: "nap.yaml", YAML: yaml}, nil); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(6 * time.Second).Truncate(time.Second)
	const n = 12
	var ids []string
	for i := range n {
		var out map[string]string
		id := fmt.Sprintf("nap-%d", i)
		if err := call(t, cl, "run.start", client.Request{Workflow: "nap", ID: id, Inputs: map[string]string{"at": due.Format(time.RFC3339)}}, &out); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	WaitFor(t, 20*time.Second, "every run parked", func() bool {
		var runs []client.Run
		return call(t, cl, "run.list", client.Request{Workflow: "nap", Status: "waiting", Limit: 100}, &runs) == nil && len(runs) == n
	})
	name, term := leader()
	if time.Until(due) < time.Second {
		t.Fatalf("parking took until %s before the timers: the test's pace is off", time.Until(due))
	}
	time.Sleep(time.Until(due.Add(-300 * time.Millisecond))) // the test's pace: the kill lands just before the timers are due
	nodes[name].Kill()
	WaitFor(t, 20*time.Second, "a new leader", func() bool { l, tm := leader(); return l != "" && tm > term })
	WaitFor(t, 30*time.Second, "every run woke and ended", func() bool {
		var runs []client.Run
		return call(t, cl, "run.list", client.Request{Workflow: "nap", Status: "succeeded", Limit: 100}, &runs) == nil && len(runs) == n
	})
	var lates []time.Duration
	for _, id := range ids {
		var evs []client.Event
		if err := call(t, cl, "run.history", client.Request{ID: id}, &evs); err != nil {
			t.Fatal(err)
		}
		var wakes []client.Event
		for _, ev := range evs {
			if ev.Kind == "wake" && ev.Outcome == "accepted" {
				wakes = append(wakes, ev)
			}
		}
		if len(wakes) != 1 {
			t.Fatalf("run %s woke %d times: %+v", id, len(wakes), evs)
		}
		at, err := time.Parse(time.RFC3339Nano, wakes[0].At)
		if err != nil {
			t.Fatal(err)
		}
		if at.Before(due) {
			t.Fatalf("run %s woke at %s, before its time %s", id, at, due)
		}
		lates = append(lates, at.Sub(due))
	}
	slices.Sort(lates)
	t.Logf("leader %s killed 300ms before %d timers were due; wakes late by %s (min) to %s (max)", name, n, lates[0], lates[len(lates)-1])
	// The TTL for the term to lapse, an election, a timer pass (1 s), and slack for two
	// loaded cores.
	if worst := lates[len(lates)-1]; worst > 5*time.Second {
		t.Fatalf("a timer fired %s late", worst)
	}
}
