package engine

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine/internal/nodes"
)

// Rate limits (workflow/ratelimit.go, engine/internal/rates): a rate-limited step's
// attempt waits on its worker for the moment it reserved in the FLOW_RATES bucket. Each
// node reports the steps waiting on it (nodes.Report.RateWaits, every few seconds), so
// that any node shows their runs waiting of kind rate, and `flowctl limits` lists every
// key with its rate, the starts reserved ahead and the steps waiting.

// rateWaits are the steps waiting on this node for a rate's moment (the node's report).
func (e *Engine) rateWaits() []nodes.RateWait {
	if e.rates == nil {
		return nil
	}
	ws := e.rates.Waiters()
	out := make([]nodes.RateWait, 0, len(ws))
	for _, w := range ws {
		out = append(out, nodes.RateWait{Run: w.Run, Step: w.Step, Item: w.Item, Key: w.Key, Since: w.Since.UTC()})
	}
	return out
}

// usesRates says whether r's workflow has a rate-limited step.
func (e *Engine) usesRates(r *checkpoint.Run) bool {
	wf, err := e.specs.OfRun(r)
	return err == nil && len(wf.RateLimits()) > 0
}

// rateWaiting is what a running run waits for when a live node reported one of its
// steps waiting for a rate's moment: kind rate, with the key and the step.
func (e *Engine) rateWaiting(r *checkpoint.Run) *client.Waiting {
	if r.Status != checkpoint.StatusRunning || !e.usesRates(r) {
		return nil
	}
	e.labels.live()
	e.labels.mu.Lock()
	i := slices.IndexFunc(e.labels.waits, func(w rateWaitAt) bool { return w.Run == r.ID }) // its oldest
	var w rateWaitAt
	if i >= 0 {
		w = e.labels.waits[i]
	}
	e.labels.mu.Unlock()
	if i < 0 {
		return nil
	}
	return &client.Waiting{Kind: client.WaitRate, Step: w.Step, Key: w.Key, Since: ts(w.Since)}
}

// showRateWaits marks the running runs among runs that wait for a rate as waiting.
func (e *Engine) showRateWaits(out []client.Run, runs []checkpoint.Run) {
	for i := range runs {
		if out[i].Waiting != nil {
			continue
		}
		if w := e.rateWaiting(&runs[i]); w != nil {
			out[i].Status, out[i].Waiting = string(checkpoint.StatusWaiting), w
		}
	}
}

// rateUses are the rate limits' keys as the bucket has them, with the steps the live
// nodes reported waiting for each, and the workflows applied here that use each.
func (e *Engine) rateUses(ctx context.Context) ([]client.RateUse, error) {
	if e.rates == nil {
		return []client.RateUse{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rs, err := e.rates.List(ctx)
	if err != nil {
		return nil, err
	}
	e.labels.live()
	e.labels.mu.Lock()
	waits := slices.Clone(e.labels.waits)
	e.labels.mu.Unlock()
	users := map[string][]string{}
	wfs, err := e.store.Workflows()
	if err != nil {
		return nil, err
	}
	for _, v := range wfs {
		wf := v.Name
		w, err := e.specs.Workflow(v.Name, v.Version)
		if err != nil {
			continue
		}
		for _, rl := range w.RateLimits() {
			if !slices.Contains(users[rl.Key], wf) {
				users[rl.Key] = append(users[rl.Key], wf)
			}
		}
	}
	out := make([]client.RateUse, 0, len(rs))
	for _, r := range rs {
		u := client.RateUse{Key: r.Key, Limit: r.Limit, Per: r.Per.String(), Reserved: r.Reserved, Next: tsNano(r.Next),
			Waiting: []client.RateWaiter{}, Workflows: users[r.Key]}
		if u.Workflows == nil {
			u.Workflows = []string{}
		}
		slices.Sort(u.Workflows)
		for _, w := range waits {
			if w.Key == r.Key {
				u.Waiting = append(u.Waiting, client.RateWaiter{Run: w.Run, Step: w.Step, Item: w.Item, Node: w.Node, Since: tsNano(w.Since)})
			}
		}
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b client.RateUse) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// RateCounts are one rate key's counters on this node (Metrics.Rates).
type RateCounts struct {
	// Starts went at their moment; Late woke past its slack and reserved again;
	// Conflicts reserved again because another node's reservation came first.
	Starts, Late, Conflicts int64
	// Waited is the time starts waited for their moment; Waiting the starts waiting now.
	Waited  time.Duration
	Waiting int
}

// rateCounts reads the rate limiter's counters by key.
func (e *Engine) rateCounts() map[string]RateCounts {
	out := map[string]RateCounts{}
	if e.rates == nil {
		return out
	}
	for _, k := range e.rates.Keys() {
		st := e.rates.StatsOf(k)
		out[k] = RateCounts{Starts: st.Starts.Load(), Late: st.Late.Load(), Conflicts: st.Conflicts.Load(), Waited: time.Duration(st.WaitNanos.Load())}
	}
	for _, w := range e.rates.Waiters() {
		c := out[w.Key]
		c.Waiting++
		out[w.Key] = c
	}
	return out
}
