package clustertest

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/client"
)

// The previous release, for the rolling upgrade: the last commit whose flowd wrote and
// read log format 1 only (issue 37: the code users ran, built from the history by
// FlowdAt). Without the history (a shallow clone), today's flowd linked to read (and say
// it reads) format 1 only stands in for it, and the test says so.
const (
	previousReleaseCommit = "31c36d61c42f82e6cc6bceef815b44e654b805df"
	previousReleaseLinked = "github.com/flowrun/flow/checkpoint.readFormatsLinked=1"
)

// previousRelease is the previous release's flowd, and whether it is the real one
// (which predates the cluster version: it reports no formats, is no member of the
// roster, and knows no version to refuse).
func previousRelease(t *testing.T) (string, bool) {
	if bin, ok := FlowdAt(t, previousReleaseCommit); ok {
		return bin, true
	}
	t.Logf("the previous release %s is not in this checkout's history: today's flowd linked to read format 1 only stands in for it", previousReleaseCommit[:12])
	return FlowdLinkedWith(t, previousReleaseLinked), false
}

// The rolling upgrade (issue 28): three flowd of the previous release on one NATS
// server, runs being started and a two-second schedule firing; each node in turn
// drained (SIGTERM) and started again on the new build, on its own data. No applier
// stops, every run started succeeds and verifies (each step committed once), no epoch
// changes but the hand-backs (released), the schedule loses and doubles no tick, and
// the log holds format-1 messages only until the last node came back on the new build;
// then the cluster version moves to 3 and CBOR (format 3) appears.
//
// The control is the gate off (the new build linked with logstream.writeNewestLinked:
// writers use the newest format whatever the cluster version): the first node restarted
// writes the newest format at once, and the old nodes' appliers stop at the first such message
// ("upgrade flowd").
func TestRollingUpgrade(t *testing.T) {
	if testing.Short() {
		t.Skip("drains and restarts three flowd processes")
	}
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "gated", true: "control-gate-off"}[control], func(t *testing.T) {
			old, real := previousRelease(t)
			if control {
				// The real release records a format-2 message as rejected and goes on,
				// saying nothing (its state drifts from the log's, silently): the
				// stand-in, which stops its applier and says why, shows the gate's
				// damage where a test can see it.
				old, real = FlowdLinkedWith(t, previousReleaseLinked), false
			}
			newBin := ""
			if control {
				newBin = FlowdLinkedWith(t, "github.com/flowrun/flow/logstream.writeNewestLinked=1")
			}
			url := startNATSServer(t)
			c := &Cluster{URLs: []string{url}}
			names := []string{"node-a", "node-b", "node-c"}
			nodes := map[string]*Proc{}
			for _, n := range names {
				nodes[n] = startFlowdBin(t, c, n, old, "--lease-ttl", "2s")
			}
			logsOnFailure(t, names, nodes)
			cl := dial(t, c)
			status := func() client.ClusterStatus { return statusOf(t, cl) }
			WaitFor(t, 30*time.Second, "three nodes and a leader", func() bool {
				st := status()
				return st.Leader != "" && len(st.Nodes) == 3
			})
			if st := status(); !real && (st.ClusterVersion != 1 || len(st.Members) != 3) || real && st.ClusterVersion > 1 {
				t.Fatalf("the previous release's cluster: version %d, members %+v; want 1 and three (the real release: none)", st.ClusterVersion, st.Members)
			}
			pay := "name: pay\nsteps:\n  - {name: a, uses: noop}\n  - {name: b, uses: sleep, with: {duration: 300ms}, needs: [a]}\n  - {name: c, uses: noop, needs: [b]}\n"
			tick := "name: tick\nschedule: {cron: \"*/2 * * * * *\", catchup: all, overlap: allow}\nsteps:\n  - {name: a, uses: noop}\n"
			for file, yaml := range map[string]string{"pay.yaml": pay, "tick.yaml": tick} {
				if err := call(t, cl, "workflow.apply", client.Request{File: file, YAML: yaml}, nil); err != nil {
					t.Fatal(err)
				}
			}
			// Runs are started all along, through whichever node answers; a call that lost
			// its node is made again with the same ID (the API refuses a second run).
			var mu sync.Mutex
			var started []string
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				sc := dial(t, c)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(150 * time.Millisecond): // the workload's pace, not a wait for a condition
					}
					id := fmt.Sprintf("pay-%04d", i)
					for attempt := 0; attempt < 20; attempt++ {
						var res map[string]string
						err := call(t, sc, "run.start", client.Request{Workflow: "pay", ID: id}, &res)
						if err == nil || strings.Contains(err.Error(), "exists") {
							mu.Lock()
							started = append(started, id)
							mu.Unlock()
							break
						}
					}
				}
			}()
			firstFormat2 := uint64(0)
			for i, n := range names {
				WaitFor(t, 30*time.Second, "runs going", func() bool { mu.Lock(); defer mu.Unlock(); return len(started) > 5*(i+1) })
				nodes[n].Term(t)
				if i == len(names)-1 && !control {
					// The last old node is down but still a member: the version has not moved.
					if st := status(); st.ClusterVersion != 1 {
						t.Fatalf("the version moved to %d while %s (format 1 only) is still a member", st.ClusterVersion, n)
					}
					if seq := firstCBOR(t, url); seq != 0 {
						t.Fatalf("format 2 at sequence %d before the last node came back on the new build", seq)
					}
				}
				nodes[n].args[0] = orDefault(newBin, filepath.Join(Binaries(t), "flowd"))
				nodes[n].Restart(t)
				WaitFor(t, 60*time.Second, n+" back", func() bool {
					for _, nd := range status().Nodes {
						if nd.ID == n && len(nd.Formats) >= 2 {
							return true
						}
					}
					return false
				})
				if i == 0 && !control {
					// A rollback before the version moved: the first node goes back to the
					// previous build, comes back as it was, then is upgraded again.
					nodes[n].Term(t)
					nodes[n].args[0] = old
					nodes[n].Restart(t)
					WaitFor(t, 60*time.Second, n+" back on the previous build", func() bool {
						for _, nd := range status().Nodes {
							if nd.ID == n && len(nd.Formats) <= 1 && nd.Applied > 0 { // the real release says nothing of its formats
								return true
							}
						}
						return false
					})
					nodes[n].Term(t)
					nodes[n].args[0] = filepath.Join(Binaries(t), "flowd")
					nodes[n].Restart(t)
					WaitFor(t, 60*time.Second, n+" back on the new build", func() bool {
						for _, nd := range status().Nodes {
							if nd.ID == n && len(nd.Formats) >= 2 {
								return true
							}
						}
						return false
					})
				}
				if control {
					WaitFor(t, 30*time.Second, "format 2 in the log", func() bool { firstFormat2 = firstCBOR(t, url); return firstFormat2 != 0 })
					at := fmt.Sprintf("the message at sequence %d has log format 3", firstFormat2)
					stopped := func() bool {
						for _, other := range names[i+1:] {
							if l := LogOf(nodes[other]); strings.Contains(l, "upgrade flowd") && strings.Contains(l, at) {
								return true
							}
						}
						return false
					}
					WaitFor(t, 30*time.Second, "an old node's applier to stop at the first format-2 message", stopped)
					close(stop)
					wg.Wait()
					t.Logf("control: the gate off, format 2 from sequence %d, and an old node's applier stopped there", firstFormat2)
					return
				}
			}
			WaitFor(t, 30*time.Second, "cluster version 3", func() bool { return status().ClusterVersion == 3 })
			WaitFor(t, 30*time.Second, "format 2 in the log", func() bool { firstFormat2 = firstCBOR(t, url); return firstFormat2 != 0 })
			mu.Lock()
			before := len(started)
			mu.Unlock()
			WaitFor(t, 30*time.Second, "runs started in format 2", func() bool { mu.Lock(); defer mu.Unlock(); return len(started) >= before+10 })
			close(stop)
			wg.Wait()
			for _, n := range names {
				if l := LogOf(nodes[n]); strings.Contains(l, "upgrade flowd") || strings.Contains(l, "applier stopped") {
					t.Fatalf("%s's applier stopped during the upgrade", n)
				}
			}
			// After the version moved, the previous build refuses to start, naming the
			// version it would need.
			late := startFlowdBin(t, c, "node-d", old, "--lease-ttl", "2s")
			if real {
				// The real release knows no cluster version: it joins, and its applier
				// stops at the first format-2 message, applying none of it.
				WaitFor(t, 60*time.Second, "the previous release's applier to stop at format 2", func() bool {
					return strings.Contains(LogOf(late), "applier stopped")
				})
			} else {
				WaitFor(t, 60*time.Second, "the previous build to refuse to start", func() bool { return !late.Alive() })
				if l := LogOf(late); late.ExitCode() == 0 || !strings.Contains(l, "the cluster version is 3") || !strings.Contains(l, "reads format 3") {
					t.Fatalf("the previous build on a cluster at version 3: exit %d, log:\n%s", late.ExitCode(), tail(l))
				}
			}
			mu.Lock()
			ids := append([]string(nil), started...)
			mu.Unlock()
			for _, id := range ids {
				checkRunOnce(t, cl, id)
			}
			var ticks []client.Run
			WaitFor(t, 60*time.Second, "the ticks' runs to end", func() bool {
				ticks = nil
				if call(t, cl, "run.list", client.Request{Workflow: "tick", Limit: 1000}, &ticks) != nil {
					return false
				}
				for _, r := range ticks {
					if r.Status != "succeeded" {
						return false
					}
				}
				return len(ticks) > 0
			})
			checkTicksContiguous(t, ticks)
			t.Logf("%d runs and %d ticks across the upgrade; format 2 from sequence %d", len(ids), len(ticks), firstFormat2)
		})
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// firstCBOR is the first message of the log in format 2 (a CBOR array; format 1 is
// JSON), read from the stream itself; 0 if none.
func firstCBOR(t *testing.T, url string) uint64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		return 0
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "FLOW_LOG")
	if err != nil {
		return 0
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0
	}
	last := s.CachedInfo().State.LastSeq
	for seq := uint64(0); seq < last; {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return 0
		}
		got, found := 0, uint64(0)
		for m := range batch.Messages() { // read to the batch's end: a fetch left open outlives the test
			got++
			meta, _ := m.Metadata()
			seq = meta.Sequence.Stream
			if d := m.Data(); found == 0 && len(d) > 0 && d[0] != '{' {
				found = seq
			}
		}
		if found != 0 || got == 0 {
			return found
		}
	}
	return 0
}

// checkRunOnce waits for run id to end and checks that it succeeded with every step
// committed once (run verify) and no epoch change but a hand-back.
func checkRunOnce(t *testing.T, cl *client.Client, id string) {
	t.Helper()
	var r client.Run
	WaitFor(t, 60*time.Second, "run "+id+" to end", func() bool {
		return call(t, cl, "run.get", client.Request{ID: id}, &r) == nil && (r.Status == "succeeded" || r.Status == "failed" || r.Status == "dead_lettered")
	})
	if r.Status != "succeeded" {
		t.Fatalf("run %s ended %s: %s", id, r.Status, r.Error)
	}
	var v client.Verification
	if err := call(t, cl, "run.verify", client.Request{ID: id}, &v); err != nil || !v.OK {
		t.Fatalf("verify %s: %v %+v", id, err, v)
	}
	for _, ep := range r.Epochs {
		if ep.Reason != "assigned" && ep.Reason != "released" {
			t.Fatalf("run %s: epoch %d changed for %q, not a hand-back: %+v", id, ep.Epoch, ep.Reason, r.Epochs)
		}
	}
}

// checkTicksContiguous: the schedule's runs are two seconds apart, none lost or doubled.
func checkTicksContiguous(t *testing.T, ticks []client.Run) {
	t.Helper()
	var at []time.Time
	sort.Slice(ticks, func(i, j int) bool { return ticks[i].ScheduledAt < ticks[j].ScheduledAt })
	for _, r := range ticks {
		tm, err := time.Parse(time.RFC3339, r.ScheduledAt)
		if err != nil {
			t.Fatalf("tick run %s: scheduled_at %q: %v", r.ID, r.ScheduledAt, err)
		}
		at = append(at, tm)
	}
	for i := 1; i < len(at); i++ {
		if d := at[i].Sub(at[i-1]); d != 2*time.Second {
			t.Fatalf("ticks %s and %s are %s apart: a tick was lost or fired twice", at[i-1], at[i], d)
		}
	}
}
