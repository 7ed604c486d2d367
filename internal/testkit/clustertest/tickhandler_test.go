package clustertest

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// A paused schedule's ticks never run; each one's on_deadline handler starts at its
// deadline, once, across a SIGKILL of the leader: the handler runs, one per tick (its ID
// is the tick's), cover every tick from the first told to one after the kill without a
// gap (a tick whose deadline passed while no leader ran is told by the next) and none
// twice. engine's TestTickNeverRanStartsItsHandlerOnce holds the ID's control.
func TestPausedTickHandlerOnceAcrossALeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a flowd process")
	}
	t.Parallel()
	url := startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	nodes := map[string]*Proc{}
	for _, n := range []string{"node-a", "node-b"} {
		nodes[n] = StartFlowd(t, c, n, "--lease-ttl", "2s")
	}
	cl := dial(t, c)
	leader := func() string {
		var st client.ClusterStatus
		if call(t, cl, "cluster.status", client.Request{}, &st) != nil {
			return ""
		}
		return st.Leader
	}
	WaitFor(t, 30*time.Second, "a leader", func() bool { return leader() != "" })
	yaml := `name: nightly
deadline: 2s
schedule: {cron: "*/2 * * * * *", catchup: none}
steps:
  - {name: a, uses: noop}
on_deadline:
  - {name: tell, uses: noop, with: {why: "{{ run.error }}"}}
`
	WaitFor(t, 30*time.Second, "the workflow applied", func() bool {
		return call(t, cl, "workflow.apply", client.Request{File: "n.yaml", YAML: yaml}, nil) == nil
	})
	mustFlowctl(t, url, "cron", "pause", "nightly", "--reason", "ledger migration")
	// handled is each tick's handler runs, by the tick's run ID.
	handled := func() map[string][]client.Run {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		runs, err := cl.Runs(ctx, client.ListOptions{Workflow: "nightly", Limit: 1000})
		if err != nil {
			return nil
		}
		out := map[string][]client.Run{}
		for _, r := range runs {
			if i := strings.Index(r.ID, ".on-deadline"); i > 0 {
				out[r.ID[:i]] = append(out[r.ID[:i]], r)
			}
		}
		return out
	}
	WaitFor(t, 60*time.Second, "the first paused tick's handler", func() bool { return len(handled()) > 0 })
	was := leader()
	nodes[was].Kill()
	killed := time.Now()
	WaitFor(t, 60*time.Second, "another leader", func() bool { l := leader(); return l != "" && l != was })
	after := "nightly-" + killed.Add(4*time.Second).UTC().Format("20060102T150405Z")
	WaitFor(t, 60*time.Second, "handlers of ticks after the kill", func() bool {
		for tick := range handled() {
			if tick >= after {
				return true
			}
		}
		return false
	})
	h := handled()
	var ticks []string
	for tick, runs := range h {
		ticks = append(ticks, tick)
		if len(runs) != 1 {
			t.Fatalf("the tick %s has %d handler runs, want 1", tick, len(runs))
		}
		if runs[0].ID != tick+".on-deadline.0" {
			t.Fatalf("handler %s: want %s.on-deadline.0", runs[0].ID, tick)
		}
	}
	sort.Strings(ticks)
	parse := func(id string) time.Time {
		at, err := time.Parse("20060102T150405Z", strings.TrimPrefix(id, "nightly-"))
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	for i := 1; i < len(ticks); i++ {
		if d := parse(ticks[i]).Sub(parse(ticks[i-1])); d != 2*time.Second {
			t.Fatalf("ticks %s and %s are %s apart: a tick between them was never told (%v)", ticks[i-1], ticks[i], d, ticks)
		}
	}
	WaitFor(t, 60*time.Second, "the handlers to succeed", func() bool {
		for _, runs := range handled() {
			if r := runOf(t, url, runs[0].ID); r.Status != "succeeded" {
				return false
			}
		}
		return true
	})
	t.Logf("%d ticks told once each, %s to %s, across the kill of %s at %s", len(ticks), ticks[0], ticks[len(ticks)-1], was, killed.UTC().Format("15:04:05"))
}
