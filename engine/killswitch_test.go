package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/steps"
)

// sideEffects is a step that honours its context: it waits for the test to release its
// epoch, then does its side effect (recorded with its epoch and time), unless its
// context ends first (recorded as stopped).
type sideEffects struct {
	mu      sync.Mutex
	done    []stepEffect
	stopped []stepEffect
	entered chan int64
	release map[int64]chan struct{}
}

type stepEffect struct {
	epoch int64
	at    time.Time
}

func newSideEffects() *sideEffects {
	return &sideEffects{entered: make(chan int64, 16), release: map[int64]chan struct{}{}}
}

func (s *sideEffects) gate(epoch int64) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.release[epoch] == nil {
		s.release[epoch] = make(chan struct{})
	}
	return s.release[epoch]
}

func (s *sideEffects) step() steps.Step {
	return steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		s.entered <- in.Epoch
		select {
		case <-s.gate(in.Epoch):
			s.mu.Lock()
			s.done = append(s.done, stepEffect{in.Epoch, time.Now()})
			s.mu.Unlock()
			return json.RawMessage(`{}`), nil
		case <-ctx.Done():
			s.mu.Lock()
			s.stopped = append(s.stopped, stepEffect{in.Epoch, time.Now()})
			s.mu.Unlock()
			return nil, ctx.Err()
		}
	})
}

func (s *sideEffects) of(list *[]stepEffect, epoch int64) (stepEffect, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range *list {
		if e.epoch == epoch {
			return e, true
		}
	}
	return stepEffect{}, false
}

// Invariant: a worker that lost its lease stops its step before another epoch can
// begin. The node's renewals are switched off (its lease lapses on the server after
// the TTL, as when its renewals stop reaching NATS); its kill switch cancels the
// epoch's context at 2/3 of the TTL, and a step that honours its context stops there,
// before the leader gives the run a new epoch. Negative control: with the kill switch
// off as well, the old epoch's step goes on, and its side effect happens after the new
// epoch began (the damage the kill switch prevents: two epochs at work at once).
func TestKillSwitchStopsTheStepBeforeTheTakeover(t *testing.T) {
	for _, killSwitch := range []bool{true, false} {
		t.Run(fmt.Sprintf("kill-switch=%v", killSwitch), func(t *testing.T) {
			fx := newSideEffects()
			e := startEngineWith(t, &testhooks.Hooks{NoRenew: true, NoKillSwitch: !killSwitch}, func(c *Config) {
				c.Workers = 1
				c.Registry = steps.NewRegistry(0)
				_ = c.Registry.Register("effect", fx.step())
			})
			defer stopEngine(e)
			defer func() { // let every epoch's step end, whatever happened
				for ep := int64(1); ep < 200; ep++ {
					g := fx.gate(ep)
					select {
					case <-g:
					default:
						close(g)
					}
				}
			}()
			apply(t, e, "name: effect\nmax_epochs: 50\nsteps:\n  - name: a\n    uses: effect\n")
			ctx := ctxT(t, 30*time.Second)
			id, err := e.StartRun(ctx, "effect", nil, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var first int64
			select {
			case first = <-fx.entered:
			case <-ctx.Done():
				t.Fatal("the step never started")
			}
			var takeover time.Time
			if err := e.waitFor(ctx, func() bool {
				r, err := e.store.Run(id)
				if err != nil || len(r.Epochs) < 2 {
					return false
				}
				takeover = r.Epochs[1].At
				return true
			}); err != nil {
				t.Fatal("the run never got a new epoch:", err)
			}
			close(fx.gate(first)) // the old epoch's step may now do its side effect, if it still runs
			if killSwitch {
				stopped, ok := fx.of(&fx.stopped, first)
				if !ok {
					t.Fatalf("the step of epoch %d was not stopped by the kill switch", first)
				}
				if !stopped.at.Before(takeover) {
					t.Fatalf("the step of epoch %d stopped %s after the new epoch began", first, stopped.at.Sub(takeover))
				}
				if _, ok := fx.of(&fx.done, first); ok {
					t.Fatalf("the step of epoch %d did its side effect although its lease was lost", first)
				}
				return
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				if done, ok := fx.of(&fx.done, first); ok {
					if !done.at.After(takeover) {
						t.Fatalf("control: the side effect came before the takeover; the test shows nothing")
					}
					t.Logf("control: the old epoch's side effect came %s after the new epoch began", done.at.Sub(takeover).Round(time.Millisecond))
					return
				}
				if time.Now().After(deadline) {
					t.Fatal("control: with the kill switch off the old epoch's step did not go on to its side effect")
				}
				time.Sleep(5 * time.Millisecond) // polling the step's record, with a deadline
			}
		})
	}
}
