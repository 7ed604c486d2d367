package engine

import (
	"context"
	"slices"
	"strings"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine/internal/leader"
	"github.com/flowrun/flow/workflow"
)

// What this node's state says of concurrency keys (engine/internal/leader keys.go): who
// holds each key's slots, and which queued runs wait for one. The leader's own count
// adds the slots it still drains (a run ended whose owner's lease is live); a node
// answers from its state alone, so a run whose key shows free here may wait a moment
// longer for that drain.

// keyUse is one key as this node's state has it.
type keyUse struct {
	limit     int
	holders   []string
	waiting   int
	workflows []string
}

// keyUses counts the holders of every key (runs holding an epoch or parked), and, when
// queued is set, the queued runs waiting for each key, reading at most maxQueued of them.
func (e *Engine) keyUses(queued bool) (map[string]*keyUse, bool, error) {
	uses := map[string]*keyUse{}
	use := func(k string, limit int, wf string) *keyUse {
		u := uses[k]
		if u == nil {
			u = &keyUse{limit: limit}
			uses[k] = u
		}
		if !slices.Contains(u.workflows, wf) {
			u.workflows = append(u.workflows, wf)
		}
		return u
	}
	for _, id := range e.store.KeyHolders(nil) {
		r, err := e.store.Run(id)
		if err != nil {
			continue // ended since
		}
		for _, k := range leader.RunKeys(e.specs, r) {
			u := use(k.Key, k.Limit, r.Workflow)
			u.holders = append(u.holders, r.ID)
		}
		for _, k := range r.SlotKeys() { // its steps' slots (checkpoint/slots.go)
			u := use(k.Key, k.Limit, r.Workflow)
			u.holders = append(u.holders, r.ID)
		}
	}
	if !queued {
		return uses, true, nil
	}
	for _, w := range e.store.SlotWaiters() {
		r, err := e.store.Run(w.Run)
		if err != nil {
			continue
		}
		for _, k := range w.Keys {
			use(k.Key, k.Limit, r.Workflow).waiting++
		}
	}
	const maxQueued = 10000
	read, complete := 0, true
	err := e.store.EachQueued(func(r *checkpoint.Run) checkpoint.QueueVerdict {
		if read++; read > maxQueued {
			complete = false
			return checkpoint.QueueStop
		}
		for _, k := range leader.RunKeys(e.specs, r) {
			use(k.Key, k.Limit, r.Workflow).waiting++
		}
		return checkpoint.QueueNext
	})
	return uses, complete, err
}

// keyWaiting is what a queued run waits for when one of its keys is full by this node's
// state: the run is shown waiting, of kind concurrency, with the key and its holders.
func keyWaiting(r *checkpoint.Run, keys []workflow.KeyLimit, uses map[string]*keyUse) *client.Waiting {
	if !r.NeedsAssign() {
		return nil
	}
	for _, k := range keys {
		u := uses[k.Key]
		if u != nil && len(u.holders) >= k.Limit {
			return &client.Waiting{Kind: client.WaitConcurrency, Key: k.Key, Limit: k.Limit, Holders: u.holders, Since: ts(r.UpdatedAt)}
		}
	}
	return nil
}

// showKeyWaits marks the queued runs among runs whose key is full as waiting, and
// names the full key and its holders of the runs parked for a step's slots.
func (e *Engine) showKeyWaits(out []client.Run, runs []checkpoint.Run) {
	var uses map[string]*keyUse
	for i := range runs {
		r := &runs[i]
		if w := r.Waiting; r.Status == checkpoint.StatusWaiting && w != nil && w.Kind == checkpoint.WaitConcurrency && out[i].Waiting != nil {
			if uses == nil {
				var err error
				if uses, _, err = e.keyUses(false); err != nil {
					return
				}
			}
			for _, k := range w.Keys {
				if u := uses[k.Key]; u != nil && len(u.holders) >= k.Limit {
					out[i].Waiting.Key, out[i].Waiting.Limit, out[i].Waiting.Holders = k.Key, k.Limit, u.holders
					break
				}
			}
			continue
		}
		if !r.NeedsAssign() {
			continue
		}
		keys := leader.RunKeys(e.specs, r)
		if len(keys) == 0 {
			continue
		}
		if uses == nil {
			var err error
			if uses, _, err = e.keyUses(false); err != nil {
				return
			}
		}
		if w := keyWaiting(r, keys, uses); w != nil {
			out[i].Status, out[i].Waiting = string(checkpoint.StatusWaiting), w
		}
	}
}

// Limits is `flowctl limits`: every concurrency key in use, with its holders and the
// number of runs waiting for it.
func (a *API) Limits(ctx context.Context) (client.Limits, error) {
	uses, complete, err := a.e.keyUses(true)
	if err != nil {
		return client.Limits{}, wireError(err)
	}
	rates, err := a.e.rateUses(ctx)
	if err != nil {
		return client.Limits{}, wireError(err)
	}
	out := client.Limits{Keys: []client.KeyUse{}, Complete: complete, Rates: rates}
	for k, u := range uses {
		out.Keys = append(out.Keys, client.KeyUse{Key: k, Limit: u.limit, Holders: append([]string{}, u.holders...), Waiting: u.waiting, Workflows: u.workflows})
	}
	slices.SortFunc(out.Keys, func(x, y client.KeyUse) int { return strings.Compare(x.Key, y.Key) })
	return out, nil
}
