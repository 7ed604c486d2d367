package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
)

// The client's actions at a later moment of the world: a holder paused and its run
// cancelled, a squatter, signals, decisions, cancels and retries.

// stopAndCancel is the slot drain's fault: when run id has a process alive that holds its
// account (any step of a keyed run, step b of a slotted one; tried tries
// times, 200ms apart, from at on), its node is paused for 1.5 TTL and the run cancelled
// meanwhile: the books close while the process runs on until its watchdog stops it.
func (c *simClient) stopAndCancel(id string, at time.Duration, tries int) {
	s := c.s
	c.later(at, func() {
		for _, n := range s.nodes {
			for p := range n.procs {
				if p.alive && p.in.Run == id && s.holdsKey(p.in) != "" && s.faultOn && n.alive && !n.paused {
					s.stats.StopCancels++
					n.pause()
					s.after(s.cfg.TTL*3/2, n.resume)
					c.cancelLater(id, 0)
					return
				}
			}
		}
		if tries > 1 {
			c.stopAndCancel(id, 200*time.Millisecond, tries-1)
		}
	})
}

// squatLater has a person start a run of chain at under the ID parent's kid step gives
// its child, before or while the parent gets there: the engine refuses IDs it derives
// (a parent adopting the squatter's run would skip its child's own steps; invariant
// "child").
func (c *simClient) squatLater(parent string, at time.Duration) {
	s := c.s
	id := checkpoint.ChildID(parent, "kid", checkpoint.ItemWhole)
	c.later(at, func() {
		c.call("squat "+id, "ops", func(ctx context.Context, api *engine.API) error {
			_, err := api.StartRun(ctx, "chain", client.StartOptions{ID: id})
			return err
		}, func(err error) {
			switch {
			case errors.Is(err, engine.ErrReservedID) || isCode(err, client.CodeBadRequest):
				s.stats.SquatsRefused++
			case err == nil:
				s.tracef("cl", "%s squats on the child ID of %s", id, parent)
			}
		})
	})
}

// signalLater sends run id its signal at random times after at: none at all (its wait
// times out), once, or twice with the same signal ID (a client retrying: applied once);
// with distinct, the two may be two signals (two waits on one name: each consumes one).
func (c *simClient) signalLater(id string, at time.Duration, distinct bool) {
	s := c.s
	for k := range s.rng.IntN(3) {
		when := at + time.Duration(s.rng.Int64N(int64(4*time.Second)))
		sid := "sig-" + id
		if distinct && s.rng.IntN(2) == 0 {
			sid += fmt.Sprint("-", k)
		}
		c.later(when, func() {
			c.call("signal "+id+" "+sid, "ops", func(ctx context.Context, api *engine.API) error {
				return api.Signal(ctx, id, "go", client.SignalOptions{ID: sid})
			}, func(error) {}) // a run that ended or is not there yet refuses it: fine
		})
	}
}

// decideLater has people decide run id's approval at random times after at: the
// starter (ops, who does not count), the same person twice, a rejection now and then.
func (c *simClient) decideLater(id string, at time.Duration) {
	s := c.s
	for range s.rng.IntN(5) {
		when := at + time.Duration(s.rng.Int64N(int64(8*time.Second)))
		who := people[s.rng.IntN(len(people))].Name
		approve := s.rng.IntN(8) != 0
		c.later(when, func() {
			c.call(fmt.Sprintf("decide %s %s %t", id, who, approve), who, func(ctx context.Context, api *engine.API) error {
				_, err := api.Decide(ctx, id, "ok", approve, "")
				return err
			}, func(error) {}) // one that cannot count, or comes too soon or too late, is refused: fine
		})
	}
}

// cancelLater cancels run id at (if it has not ended: a cancel of an ended run is
// refused), its children with it.
func (c *simClient) cancelLater(id string, at time.Duration) {
	c.later(at, func() {
		c.call("cancel "+id, "ops", func(ctx context.Context, api *engine.API) error {
			return api.Cancel(ctx, id, "")
		}, func(error) {})
	})
}

// retryLater retries run id at, if it has ended other than well: whole, or from a step
// (approve's from its approval, with an input changed by fin1, who then does not count).
func (c *simClient) retryLater(id, wf string, at time.Duration) {
	s := c.s
	opts := client.RetryOptions{}
	actor := "ops"
	switch {
	case wf == "approve" && s.rng.IntN(2) == 0:
		opts, actor = client.RetryOptions{From: "ok", Inputs: map[string]string{"note": "again"}}, "fin1"
		c.decideLater(id, at)
	case wf == "chain" && s.rng.IntN(2) == 0:
		opts.From = "b"
	}
	c.later(at, func() {
		c.call(fmt.Sprintf("retry %s from %q", id, opts.From), actor, func(ctx context.Context, api *engine.API) error {
			if opts.From == "" && opts.Inputs == nil {
				return api.Retry(ctx, id)
			}
			return api.RetryFrom(ctx, id, opts)
		}, func(error) {}) // a run that has not ended, or succeeded, is refused: fine
	})
}
