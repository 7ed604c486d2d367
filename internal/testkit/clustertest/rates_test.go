package clustertest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// arrivals is a downstream that records when each request reached it.
type arrivals struct {
	mu  sync.Mutex
	ats []time.Time
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.ats = append(a.ats, time.Now())
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"ok": true}`))
}

// most is the most requests that reached it within any window of d, and how many in all.
func (a *arrivals) most(d time.Duration) (int, int) {
	a.mu.Lock()
	ats := slices.Clone(a.ats)
	a.mu.Unlock()
	slices.SortFunc(ats, time.Time.Compare)
	most, lo := 0, 0
	for hi := range ats {
		for ats[hi].Sub(ats[lo]) >= d {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	return most, len(ats)
}

// A rate limit of 50 a second over three real flowd processes and six runs of sixty
// credits, sixteen at once each (the runs could go far faster), one node SIGSTOPped
// for more than a lease while it paces (its runs taken over) and then continued: the
// wallet never sees more than 56 requests in any second (50, plus one, plus the 10%
// slack the design states: engine/internal/rates), and every run succeeds.
//
// The control is flowd linked with engine.ratesLocal on every node: each node paces the
// key alone, in its memory, and the wallet sees the nodes' rates added up.
func TestRateLimitHoldsAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts flowd processes")
	}
	t.Parallel()
	const limit, bound, runs, items = 50, 56, 6, 60
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "guard", true: "control-rates-local"}[control], func(t *testing.T) {
			bin := filepath.Join(Binaries(t), "flowd")
			if control {
				bin = FlowdLinkedWith(t, "github.com/flowrun/flow/engine.ratesLocal=1")
			}
			wallet := &arrivals{}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: wallet, ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = srv.Serve(ln) }()
			t.Cleanup(func() { _ = srv.Close() })
			nodes, cl, _ := threeFlowdOnOneServer(t, bin)
			yaml := fmt.Sprintf(`name: credit
inputs:
  n: {type: list}
steps:
  - name: pay
    uses: http
    foreach: "{{ inputs.n }}"
    parallelism: 16
    rate_limit: {key: wallet, limit: %d, per: 1s}
    with: {method: POST, url: "http://%s/credit", body: {n: "{{ item }}"}}
`, limit, ln.Addr())
			if err := call(t, cl, "workflow.apply", client.Request{File: "credit.yaml", YAML: yaml}, nil); err != nil {
				t.Fatal(err)
			}
			list := make([]string, items)
			for i := range list {
				list[i] = fmt.Sprint(i)
			}
			var ids []string
			for i := range runs {
				id := fmt.Sprintf("credit-%d", i)
				if err := call(t, cl, "run.start", client.Request{Workflow: "credit", ID: id, Inputs: map[string]string{"n": "[" + strings.Join(list, ",") + "]"}}, nil); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			count := func() int { _, n := wallet.most(time.Second); return n }
			if !control {
				// A worker paused past its moments (and its lease) resumes: it spends none
				// of the moments it reserved before the pause, nor a stale lease.
				WaitFor(t, 60*time.Second, "80 credits paid", func() bool { return count() >= 80 })
				var owner, run string
				WaitFor(t, 30*time.Second, "a run being paid, and its owner", func() bool {
					for _, id := range ids {
						var r client.Run
						if call(t, cl, "run.get", client.Request{ID: id}, &r) == nil && (r.Status == "running" || r.Status == "waiting") && r.Owner != "" {
							owner, run = r.Owner, id
							return true
						}
					}
					return false
				})
				nodes[owner].Stop()
				before := count()
				WaitFor(t, 60*time.Second, "the stopped owner's run taken over", func() bool {
					var r client.Run
					return call(t, cl, "run.get", client.Request{ID: run}, &r) == nil && r.Owner != "" && r.Owner != owner
				})
				nodes[owner].Cont()
				t.Logf("%s stopped while it paid %s, continued after its run was taken over and %d more credits", owner, run, count()-before)
			}
			owners := map[string]bool{}
			WaitFor(t, 120*time.Second, "every run ended", func() bool {
				for _, id := range ids {
					var r client.Run
					if call(t, cl, "run.get", client.Request{ID: id}, &r) != nil || (r.Status != "succeeded" && r.Status != "failed") {
						return false
					}
				}
				return true
			})
			for _, id := range ids {
				var r client.Run
				if err := call(t, cl, "run.get", client.Request{ID: id}, &r); err != nil || r.Status != "succeeded" {
					t.Fatalf("run %s: %s %s %v", id, r.Status, r.Error, err)
				}
				for _, ep := range r.Epochs {
					owners[ep.Owner] = true
				}
			}
			most, all := wallet.most(time.Second)
			t.Logf("%d requests from %d nodes; at most %d within a second (limit %d/s, bound %d)", all, len(owners), most, limit, bound)
			if all < runs*items || len(owners) < 2 {
				t.Fatalf("%d requests from %d nodes; want %d from two or more", all, len(owners), runs*items)
			}
			if !control { // flowctl limits lists the key and its rate
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				l, err := cl.Limits(ctx)
				cancel()
				if err != nil || len(l.Rates) != 1 || l.Rates[0].Key != "wallet" || l.Rates[0].Limit != limit || l.Rates[0].Per != "1s" ||
					!slices.Equal(l.Rates[0].Workflows, []string{"credit"}) {
					t.Fatalf("limits: %+v %v", l, err)
				}
			}
			switch {
			case !control && most > bound:
				t.Fatalf("the wallet saw %d requests within a second; the rate is %d/s (%d with its stated slack)", most, limit, bound)
			case control && most <= bound:
				t.Fatalf("control: per-node pacing kept the wallet to %d requests a second; it shows nothing", most)
			}
		})
	}
}

// threeFlowdOnOneServer starts node-a, node-b and node-c of bin (lease TTL 2 s) on one
// NATS server (at url), and waits for a leader, all three, and cluster version 3.
func threeFlowdOnOneServer(t *testing.T, bin string) (nodes map[string]*Proc, cl *client.Client, url string) {
	t.Helper()
	url = startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	names := []string{"node-a", "node-b", "node-c"}
	nodes = map[string]*Proc{}
	for _, name := range names {
		nodes[name] = startFlowdBin(t, c, name, bin, append([]string{"--lease-ttl", "2s"}, stepsAsTestUser()...)...)
	}
	logsOnFailure(t, names, nodes)
	cl = dial(t, c)
	WaitFor(t, 60*time.Second, "a leader, three nodes, cluster version 3", func() bool {
		st := statusOf(t, cl)
		return st.Leader != "" && len(st.Nodes) == 3 && st.ClusterVersion >= 3
	})
	return nodes, cl, url
}
