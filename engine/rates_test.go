package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/steps"
)

// stamps is a step kind that records when each of its attempts started.
type stamps struct {
	mu  sync.Mutex
	ats []time.Time
}

func (s *stamps) step() steps.Step {
	return steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		s.mu.Lock()
		s.ats = append(s.ats, time.Now())
		s.mu.Unlock()
		return json.RawMessage(`{}`), nil
	})
}

// registry is a node's registry with the stamp kind.
func (s *stamps) registry(t *testing.T) *steps.Registry {
	reg := steps.NewRegistry(0)
	if err := reg.Register("stamp", s.step()); err != nil {
		t.Fatal(err)
	}
	return reg
}

// items is a list of n numbers (a foreach's).
func items(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// mostInAWindow is the most starts within any window of length d.
func mostInAWindow(ats []time.Time, d time.Duration) int {
	ats = slices.Clone(ats)
	slices.SortFunc(ats, time.Time.Compare)
	most, lo := 0, 0
	for hi := range ats {
		for ats[hi].Sub(ats[lo]) >= d {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	return most
}

const paidWorkflow = `name: paid
inputs:
  n: {type: list}
steps:
  - name: pay
    uses: stamp
    foreach: "{{ inputs.n }}"
    parallelism: 8
    rate_limit: {key: wallet, limit: 10, per: 1s}
`

// Two engines over one NATS server, two runs on each side with eight items at once
// each: the wallet never sees more than its rate in any second (10, plus the one and
// the slack's share docs/workflow-spec.md states: 12), though the runs could go four
// times as fast. Negative control: each node pacing alone (Hooks.RatesLocal), the two
// nodes together pass it.
func TestRateLimitPacesStartsAcrossNodes(t *testing.T) {
	for _, guard := range []bool{true, false} {
		t.Run(fmt.Sprintf("guard=%v", guard), func(t *testing.T) {
			srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(t.TempDir(), "nats"), Listen: "127.0.0.1:0", NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown()
			st := &stamps{}
			node := func(id string) *Engine {
				reg := st.registry(t)
				h := &testhooks.Hooks{}
				h.RatesLocal.Store(!guard)
				return startEngineWith(t, h, func(c *Config) { c.NodeID, c.NATSURL, c.Registry, c.Workers = id, srv.ClientURL(), reg, 1 })
			}
			a, b := node("node-a"), node("node-b")
			if err := a.Ops().WaitClusterVersion(ctxT(t, 30*time.Second), 3); err != nil {
				t.Fatal(err)
			}
			apply(t, a, paidWorkflow)
			var ids []string
			for range 4 {
				id, err := a.StartRun(ctxT(t, 10*time.Second), "paid", map[string]any{"n": items(15)}, RunOptions{})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			owners := map[string]bool{}
			for _, id := range ids {
				if _, err := a.WaitRun(ctxT(t, 60*time.Second), id); err != nil {
					t.Fatal(err)
				}
				v, _ := b.Run(id)
				for _, ep := range v.Run.Epochs {
					owners[ep.Owner] = true
				}
			}
			if len(st.ats) != 60 || len(owners) != 2 {
				t.Fatalf("%d starts on %d nodes; want 60 on both", len(st.ats), len(owners))
			}
			most := mostInAWindow(st.ats, time.Second)
			t.Logf("at most %d starts in a second (limit 10)", most)
			switch {
			case guard && most > 12:
				t.Fatalf("%d starts within a second: the rate is 10/s (12 with its stated slack)", most)
			case !guard && most <= 12:
				t.Fatalf("control: per-node pacing kept to %d starts a second; it shows nothing", most)
			}
		})
	}
}

// A start waiting for its moment is seen from the other node: its run waiting of kind
// rate with the key and the step, and `flowctl limits` with the key, its rate, the
// start reserved ahead and the waiter; the run's cancel ends the wait.
func TestRateWaitIsShown(t *testing.T) {
	srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(t.TempDir(), "nats"), Listen: "127.0.0.1:0", NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	st := &stamps{}
	a := startEngine(t, func(c *Config) { c.NATSURL, c.Registry = srv.ClientURL(), st.registry(t) })
	b := startEngine(t, func(c *Config) { c.NodeID, c.NATSURL, c.Registry = "node-b", srv.ClientURL(), st.registry(t) })
	if err := a.Ops().WaitClusterVersion(ctxT(t, 30*time.Second), 3); err != nil {
		t.Fatal(err)
	}
	apply(t, a, strings.ReplaceAll(paidWorkflow, "limit: 10, per: 1s", "limit: 1, per: 1h"))
	id, err := a.StartRun(ctxT(t, 10*time.Second), "paid", map[string]any{"n": items(2)}, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var r client.Run
	pollUntil(t, 30*time.Second, "the run shown waiting for the wallet's rate on node-b", func() bool {
		r, err = b.API().Run(id)
		return err == nil && r.Waiting != nil && r.Waiting.Kind == client.WaitRate
	})
	if r.Status != "waiting" || r.Waiting.Key != "wallet" || r.Waiting.Step != "pay" {
		t.Fatalf("run %s, waiting %+v", r.Status, r.Waiting)
	}
	l, err := b.API().Limits(ctxT(t, 10*time.Second))
	if err != nil || len(l.Rates) != 1 {
		t.Fatalf("limits %+v %v", l, err)
	}
	w := l.Rates[0]
	if w.Key != "wallet" || w.Limit != 1 || w.Per != "1h0m0s" || w.Reserved != 1 || len(w.Waiting) != 1 || w.Waiting[0].Run != id || w.Waiting[0].Step != "pay" || !slices.Equal(w.Workflows, []string{"paid"}) {
		t.Fatalf("rate %+v", w)
	}
	ma, mb := a.Metrics(ctxT(t, 5*time.Second)).Rates["wallet"], b.Metrics(ctxT(t, 5*time.Second)).Rates["wallet"]
	if ma.Starts+mb.Starts != 1 || ma.Waiting+mb.Waiting != 1 {
		t.Fatalf("metrics %+v %+v", ma, mb)
	}
	if err := a.Cancel(ctxT(t, 10*time.Second), id, "enough"); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 30*time.Second, "the wait ended with the run", func() bool { return len(a.rates.Waiters())+len(b.rates.Waiters()) == 0 })
}
