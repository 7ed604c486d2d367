package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// startNATSServer starts one nats-server process (JetStream, synced) and returns its URL.
func startNATSServer(t *testing.T) string {
	_, url := startNATSServerProc(t)
	return url
}

// startNATSServerProc is startNATSServer, with the process (to stop and restart it).
func startNATSServerProc(t *testing.T) (*Proc, string) {
	bin := Binaries(t)
	dir := t.TempDir()
	port := freePorts(t, 1)[0]
	conf := filepath.Join(dir, "n.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf("listen: 127.0.0.1:%d\nmax_payload: 8MB\njetstream { store_dir: %q, sync_interval: always }\n", port, filepath.Join(dir, "js"))), 0o644)
	logf, _ := os.Create(filepath.Join(dir, "nats.log"))
	p := &Proc{Name: "nats", args: []string{filepath.Join(bin, "nats-server"), "-c", conf}, log: logf}
	p.start(t)
	t.Cleanup(p.Kill)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	c := &Cluster{URLs: []string{url}}
	waitJetStream(t, c)
	return p, url
}

// Failover cron: a 2-second schedule (catch-up all) on three flowd nodes sharing one
// NATS server; the leader is SIGKILLed 8 times and SIGSTOPped past its lease 4 times.
// Every fire time produces exactly one run, none is lost. Invariant 4 of DESIGN.md.
func TestFailoverCron(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and pauses flowd processes for about a minute")
	}
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
	yaml := "name: tick\nschedule: {cron: \"*/2 * * * * *\", catchup: all, overlap: allow}\nsteps:\n  - name: a\n    uses: noop\n"
	if err := call(t, cl, "workflow.apply", client.Request{File: "tick.yaml", YAML: yaml}, nil); err != nil {
		t.Fatal(err)
	}
	// probe runs measure a killed leader's replacement by its first scheduling action:
	// a run submitted right after the kill is assigned an epoch by the next leader.
	if err := call(t, cl, "workflow.apply", client.Request{File: "probe.yaml", YAML: "name: probe\nsteps:\n  - name: a\n    uses: noop\n"}, nil); err != nil {
		t.Fatal(err)
	}
	var failovers, toAssign []time.Duration
	for i := 0; i < 12; i++ {
		name, term := leader()
		p := nodes[name]
		if p == nil {
			t.Fatalf("leader %q unknown", name)
		}
		start := time.Now()
		if i%3 == 2 { // a pause past the lease
			p.Stop()
			WaitFor(t, 20*time.Second, "a new leader after a pause", func() bool { l, tm := leader(); return l != "" && tm > term })
			failovers = append(failovers, time.Since(start))
			p.Cont()
		} else {
			p.Kill()
			// The first request may still be routed to the dead node's subscription and
			// never answered: retry with the same run ID (a repeat is refused as existing).
			probe := map[string]string{"id": fmt.Sprintf("probe-%d", i)}
			WaitFor(t, 30*time.Second, "the probe run submitted", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				err := callCtx(ctx, cl, "run.start", client.Request{Workflow: "probe", ID: probe["id"]}, nil)
				var ae *client.Error
				return err == nil || errors.As(err, &ae) && ae.Code == client.CodeConflict
			})
			WaitFor(t, 20*time.Second, "a new leader after a kill", func() bool { l, tm := leader(); return l != "" && tm > term })
			failovers = append(failovers, time.Since(start))
			WaitFor(t, 20*time.Second, "the probe run assigned", func() bool {
				var r client.Run
				return call(t, cl, "run.get", client.Request{ID: probe["id"]}, &r) == nil && r.Epoch > 0
			})
			toAssign = append(toAssign, time.Since(start))
			p.Restart(t)
		}
		time.Sleep(1500 * time.Millisecond) // let the new leader fire a tick or two: the test's pace, not a synchronisation
	}
	time.Sleep(3 * time.Second) // a last tick or two under a stable leader
	var runs []client.Run
	if err := call(t, cl, "run.list", client.Request{Workflow: "tick", Limit: 10000}, &runs); err != nil {
		t.Fatal(err)
	}
	var ticks []time.Time
	for _, r := range runs {
		at, err := time.Parse(time.RFC3339, r.ScheduledAt)
		if err != nil || r.Trigger != "cron" {
			t.Fatalf("run %+v", r)
		}
		ticks = append(ticks, at)
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i].Before(ticks[j]) })
	if len(ticks) < 15 {
		t.Fatalf("only %d ticks fired", len(ticks))
	}
	for i := 1; i < len(ticks); i++ {
		if d := ticks[i].Sub(ticks[i-1]); d != 2*time.Second {
			b, _ := json.Marshal(ticks)
			t.Fatalf("fire times %s and %s are %s apart: a tick was lost or fired twice\n%s", ticks[i-1], ticks[i], d, b)
		}
	}
	slices.Sort(failovers)
	slices.Sort(toAssign)
	t.Logf("%d fire times, one run each; leader failover (kill or pause -> new term): median %s, max %s; leader SIGKILL -> a run submitted after it assigned (polled): median %s, max %s (TTL 1s)",
		len(ticks), failovers[len(failovers)/2].Round(time.Millisecond), failovers[len(failovers)-1].Round(time.Millisecond),
		toAssign[len(toAssign)/2].Round(time.Millisecond), toAssign[len(toAssign)-1].Round(time.Millisecond))
}
