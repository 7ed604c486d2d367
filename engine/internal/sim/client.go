package sim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/workflow"
)

// The client: the people and programs that use the cluster, through a node's API as the
// API service calls it (engine.API, after catching up with the log as it does), each
// call on a goroutine of its own.
// An outcome it does not learn (the node died, the answer was lost, the write's outcome
// is unknown) is asked again of another node, with the same run ID, signal ID or
// approval: what it does the second time must be harmless.

type simClient struct {
	s       *Sim
	ops     int // operations started
	pending int // operations whose outcome is not known yet (or not yet due)
	wfs     map[string]string
}

func newClient(s *Sim) *simClient { return &simClient{s: s, wfs: map[string]string{}} }

// done: every operation the workload drew has its outcome.
func (c *simClient) done() bool { return c.pending == 0 }

// live is a node the client can call now.
func (c *simClient) live() *node {
	var up []*node
	for _, n := range c.s.nodes {
		if n.up && !n.paused {
			up = append(up, n)
		}
	}
	if len(up) == 0 {
		return nil
	}
	return up[c.s.rng.IntN(len(up))]
}

// call runs fn on a live node's engine as actor, on a goroutine, until its outcome is
// known; then done gets it (on the loop). An unknown outcome is asked again after a
// pause. name names the operation (the trace's, and the order of outcomes that come at
// one moment).
func (c *simClient) call(name, actor string, fn func(context.Context, *engine.API) error, done func(error)) {
	s := c.s
	c.ops++
	op := c.ops
	c.pending++
	var try func()
	try = func() {
		n := c.live()
		if n == nil {
			s.after(500*time.Millisecond, try)
			return
		}
		e := n.eng
		key := fmt.Sprintf("client %06d %s", op, name)
		go func() {
			ctx, cancel := context.WithTimeout(audit.WithActor(context.Background(), actor), 15*time.Second)
			api := e.API()
			err := api.CatchUp(ctx)
			if err == nil {
				err = fn(ctx, api)
			}
			cancel()
			s.submit("", key, func() {
				if unknown(err) {
					s.after(500*time.Millisecond, try)
					return
				}
				c.pending--
				s.tracef("cl", "%s through %s: %s", name, n.name, outcome(err))
				done(err)
			})
		}()
	}
	try()
}

// unknown tells an outcome the client must ask again: the call reached no verdict.
func unknown(err error) bool {
	if err == nil {
		return false
	}
	return errors.Is(err, errDead) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, engine.ErrNotStarted) || errors.Is(err, logstream.ErrAppendUncertain) || errors.Is(err, logstream.ErrStopped)
}

// isCode says whether err is the API's error with code.
func isCode(err error, code string) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Code == code
}

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// later runs fn at d from now, counted as pending until then.
func (c *simClient) later(d time.Duration, fn func()) {
	c.pending++
	c.s.after(d, func() {
		c.pending--
		fn()
	})
}

// start applies the workflows, then starts the runs and what else the workload does.
func (c *simClient) start() {
	s := c.s
	srcs := append(append(append([]string(nil), workflows...), moreWorkflows...), alarmWorkflow)
	if s.cfg.KeyedRuns > 0 {
		srcs = append(srcs, keyedWorkflow)
	}
	if s.cfg.Events > 0 {
		srcs = append(srcs, eventWorkflow)
	}
	if s.cfg.Cron {
		srcs = append(srcs, cronWorkflow(s.cfg.Catchup))
	}
	applied := 0
	for i, src := range srcs {
		name := fmt.Sprintf("apply %d", i)
		c.call(name, "ops", func(ctx context.Context, api *engine.API) error {
			_, err := api.ApplyWorkflow(ctx, "sim.yaml", []byte(src))
			return err
		}, func(err error) {
			if err != nil {
				s.fail("sim", "apply a workflow: %v", err)
				return
			}
			if applied++; applied == len(srcs) {
				c.submitAll()
				c.submitKeyed()
				c.signalStarts()
				c.events()
				c.labelled()
				c.rated()
				if s.cfg.Hold {
					c.releaseAt(s.cfg.Release)
				}
				if s.cfg.Cron {
					c.cronOps(func() { c.unscheduleAt(s.cfg.CronUntil) })
				}
			}
		})
	}
}

// cronOps pauses and resumes the schedule, and backfills the ticks so far (invariant 4:
// one run per tick, however many ways it is started).
func (c *simClient) cronOps(then func()) {
	s := c.s
	until := max(0, T0.Add(s.cfg.CronUntil).Sub(s.now))
	pause, backfill := s.rng.IntN(2) == 0, s.rng.IntN(2) == 0
	fill := func() {
		from, to := T0.Format(time.RFC3339), s.now.Format(time.RFC3339)
		c.call("backfill tick", "ops", func(ctx context.Context, api *engine.API) error {
			_, err := api.Backfill(ctx, "tick", client.BackfillOptions{From: from, To: to, MaxParallel: 2})
			return err
		}, func(error) { then() })
	}
	switch {
	case pause:
		// Paused for a while (the leader fires nothing meanwhile), then resumed, and
		// then perhaps backfilled.
		at := time.Duration(s.rng.Int64N(int64(until) + 1))
		back := time.Second + time.Duration(s.rng.Int64N(int64(6*time.Second)))
		c.later(at, func() {
			c.call("pause tick", "ops", func(ctx context.Context, api *engine.API) error {
				return api.PauseSchedule(ctx, "tick", "sim")
			}, func(error) {
				c.later(back, func() {
					c.call("resume tick", "ops", func(ctx context.Context, api *engine.API) error {
						return api.ResumeSchedule(ctx, "tick")
					}, func(error) {
						if backfill {
							c.later(time.Duration(s.rng.Int64N(int64(3*time.Second))), fill)
						} else {
							then()
						}
					})
				})
			})
		})
	case backfill:
		// Racing the cron's own fires: a tick's run has the tick's ID either way.
		c.later(until/2+time.Duration(s.rng.Int64N(int64(until/2)+1)), fill)
	default:
		then()
	}
}

// unscheduleAt applies the cron workflow without its schedule at offset at from the
// start, or now if that has passed: only once every apply's outcome is known, so that a
// retried first apply does not bring the schedule back after it.
func (c *simClient) unscheduleAt(at time.Duration) {
	s := c.s
	c.later(max(0, T0.Add(at).Sub(s.now)), func() {
		// The schedule ends: a version without it (the ticks recorded stay).
		src := cronWorkflow("")
		c.call("unschedule tick", "ops", func(ctx context.Context, api *engine.API) error {
			_, err := api.ApplyWorkflow(ctx, "sim.yaml", []byte(src))
			return err
		}, func(error) {})
	})
}

// releaseAt releases the operator's hold on the cluster version at offset at from the
// start (or now): the raise. The gate refuses it while a member reads format 1 only
// (cluster status says why); otherwise the leader raises the version at its next pass.
func (c *simClient) releaseAt(at time.Duration) {
	s := c.s
	c.later(max(0, T0.Add(at).Sub(s.now)), func() {
		var note string
		c.call("release the cluster version", "ops", func(ctx context.Context, api *engine.API) error {
			if err := api.HoldClusterVersion(ctx, false, ""); err != nil {
				return err
			}
			note = api.Cluster(ctx).VersionNote
			return nil
		}, func(err error) {
			if err == nil && strings.Contains(note, "log formats up to") {
				s.stats.RaisesRefused++
				s.tracef("cl", "the raise is refused: %s", note)
			}
		})
	})
}

// submitAll starts the runs at random times, each of a random workflow.
func (c *simClient) submitAll() {
	s := c.s
	names := []string{"approve", "chain", "fan", "nap", "pair", "parent", "wait"}
	sort.Strings(names)
	for i := 1; i <= s.cfg.Runs; i++ {
		at := time.Duration(s.rng.Int64N(int64(s.cfg.SubmitIn)))
		wf := names[s.rng.IntN(len(names))]
		id := fmt.Sprintf("r%d", i)
		var inputs map[string]string
		var alarm time.Duration // an alarm's time, after its start
		switch wf {
		case "wait", "pair":
			c.signalLater(id, at, wf == "pair")
		case "approve":
			c.decideLater(id, at)
		case "parent":
			if s.rng.IntN(2) == 0 {
				c.squatLater(id, at+time.Duration(s.rng.Int64N(int64(time.Second))))
			}
		case "nap":
			inputs = map[string]string{"nap": []string{"1s", "4s", "9s"}[s.rng.IntN(3)]}
			if s.rng.IntN(2) == 0 {
				// A sleep until a time (its timer as the log states it), in a workflow
				// of one epoch whose loss dead-letters it (its handler runs).
				wf = "alarm"
				alarm = []time.Duration{6 * time.Second, 10 * time.Second, 15 * time.Second}[s.rng.IntN(3)]
				s.alarms[id] = true
			}
		}
		if s.rng.IntN(5) == 0 {
			c.cancelLater(id, at+time.Duration(s.rng.Int64N(int64(6*time.Second))))
		}
		if s.rng.IntN(5) == 0 {
			c.retryLater(id, wf, at+10*time.Second+time.Duration(s.rng.Int64N(int64(15*time.Second))))
		}
		c.later(at, func() {
			if alarm > 0 {
				inputs = map[string]string{"at": s.now.Add(alarm).Truncate(time.Second).Format(time.RFC3339)}
			}
			c.call("start "+id+" "+wf, "ops", func(ctx context.Context, api *engine.API) error {
				_, err := api.StartRun(ctx, wf, client.StartOptions{ID: id, Inputs: inputs})
				if isCode(err, client.CodeConflict) {
					return nil // an earlier try got through: the run exists
				}
				return err
			}, func(err error) {
				if err != nil {
					s.fail("sim", "start %s: %v", id, err)
				}
			})
		})
	}
}

// submitKeyed starts the keyed runs k1.. over two accounts at times of their own stream,
// cancels some of them a little later (often while they run: a cancel whose owner is
// paused or cut off is what the slot's drain is for), and retries one of them later (a
// cancelled one goes back to its first place in the queue). Half of them are of the
// slotted workflow, whose step b holds the account's key: a step's slot and a run's of
// one key exclude each other.
func (c *simClient) submitKeyed() {
	s := c.s
	retried := false
	var slotted []func() // the slotted runs' starts and retries, once their workflow is applied
	for i := 1; i <= s.cfg.KeyedRuns; i++ {
		at := time.Duration(s.keyed.Int64N(int64(s.cfg.SubmitIn)))
		id := fmt.Sprintf("k%d", i)
		acct := []string{"x", "y"}[s.keyed.IntN(2)]
		s.keyOf[id] = acct
		wf := "keyed"
		if s.keyed.IntN(2) == 0 {
			wf = "slotted"
			s.keyStep[id] = "b"
		}
		var then []func()
		switch fault := s.keyed.IntN(3); {
		case fault == 0 && wf == "slotted":
			// A slotted run is stopped mid-step more often: its slot drains only then.
			d := at + time.Duration(s.keyed.Int64N(int64(4*time.Second)))
			then = append(then, func() { c.stopAndCancel(id, d, 40) })
		case fault == 0:
			d := at + time.Duration(s.keyed.Int64N(int64(4*time.Second)))
			then = append(then, func() { c.cancelLater(id, d) })
		case fault == 1:
			d := at + time.Duration(s.keyed.Int64N(int64(2*time.Second)))
			tries := 10
			if wf == "slotted" {
				tries = 40 // its step b, after a and a grant
			}
			then = append(then, func() { c.stopAndCancel(id, d, tries) })
		}
		// A retry puts a cancelled run back at its first place in the queue, ahead of
		// later runs of its key (the leader's unapplied-assign and term-tail guards).
		// One a seed: each keyed run holds its account for seconds, and the runs of an
		// account must all end within the liveness bound.
		if !retried && s.keyed.IntN(2) == 0 {
			retried = true
			d := at + 2*time.Second + time.Duration(s.keyed.Int64N(int64(6*time.Second)))
			then = append(then, func() { c.retryLater(id, wf, d) })
		}
		then = append(then, func() {
			c.later(at, func() { c.startGiven(wf, client.StartOptions{ID: id, Inputs: map[string]string{"acct": acct}}) })
		})
		if wf == "slotted" {
			slotted = append(slotted, then...)
			continue
		}
		for _, f := range then {
			f()
		}
	}
	if len(slotted) == 0 {
		return
	}
	// A step's concurrency needs cluster version 3; applied off fin's and wallet's beats.
	c.later(250*time.Millisecond, func() {
		c.applyAtVersion3("slotted", slottedWorkflow, "concurrency on a step", time.Second+171*time.Millisecond, func() {
			for _, f := range slotted {
				f()
			}
		})
	})
}

// startGiven starts a run of wf under the ID opts gives: a conflict is an earlier try
// of this start that landed.
func (c *simClient) startGiven(wf string, opts client.StartOptions) {
	c.call("start "+opts.ID+" "+wf, "ops", func(ctx context.Context, api *engine.API) error {
		_, err := api.StartRun(ctx, wf, opts)
		if isCode(err, client.CodeConflict) {
			return nil
		}
		return err
	}, func(err error) {
		if err != nil {
			c.s.fail("sim", "start %s: %v", opts.ID, err)
		}
	})
}

// labelled applies the workflow "fin" (runs_on: finance on a step), again a second
// later while the cluster version is below 3 (which runs_on needs: an older node would
// take its runs) until a while after the faults, then starts the runs f1.. at times of
// their own stream.
func (c *simClient) labelled() {
	s := c.s
	if s.cfg.LabelledRuns == 0 {
		return
	}
	c.applyAtVersion3("fin", finWorkflow, "runs_on", time.Second, func() {
		for i := 1; i <= s.cfg.LabelledRuns; i++ {
			id := fmt.Sprintf("f%d", i)
			s.finRuns[id] = true
			priority := []int{-5, 0, 5}[s.label.IntN(3)] // issue 39's priorities ride on these runs
			c.later(time.Duration(s.label.Int64N(int64(s.cfg.SubmitIn))), func() {
				c.startGiven("fin", client.StartOptions{ID: id, Priority: &priority})
			})
		}
	})
}

// applyAtVersion3 applies workflow wf (src), which needs cluster version 3 for what
// (runs_on, rate_limit), again every retry while the version is below 3, until a while
// after the faults (a hold whose release was lost keeps the version at 1 for good, and
// the seed then has none of those runs); applied, it calls then.
func (c *simClient) applyAtVersion3(wf, src, what string, retry time.Duration, then func()) {
	s := c.s
	var apply func()
	apply = func() {
		c.call("apply "+wf, "ops", func(ctx context.Context, api *engine.API) error {
			_, err := api.ApplyWorkflow(ctx, wf+".yaml", []byte(src))
			return err
		}, func(err error) {
			if err != nil && strings.Contains(err.Error(), what+" needs cluster version") {
				if s.now.Before(T0.Add(s.cfg.FaultsFor + 15*time.Second)) {
					c.later(retry, apply)
				} else {
					s.tracef("cl", "%s not applied: the cluster version stays below 3", wf)
				}
				return
			}
			if err != nil {
				s.fail("sim", "apply %s: %v", wf, err)
				return
			}
			then()
		})
	}
	apply()
}

// rated applies the workflow "wallet" (rate_limit on its step pay), again a second
// later while the cluster version is below 3, then starts the runs w1.. within a second
// of each other: their pays contend for the wallet's rate from several nodes.
func (c *simClient) rated() {
	s := c.s
	if s.cfg.RatedRuns == 0 {
		return
	}
	// Half a second after fin, retried off fin's beat: two applies at one moment answer
	// in the order the engine's goroutines end, which no replay repeats.
	c.later(500*time.Millisecond, func() {
		c.applyAtVersion3("wallet", walletWorkflow, "rate_limit", time.Second+337*time.Millisecond, func() {
			at := time.Duration(s.rate.Int64N(int64(s.cfg.SubmitIn)))
			for i := 1; i <= s.cfg.RatedRuns; i++ {
				id := fmt.Sprintf("w%d", i)
				s.walletRuns[id] = true
				c.later(at+time.Duration(s.rate.Int64N(int64(time.Second))), func() {
					c.startGiven("wallet", client.StartOptions{ID: id})
				})
			}
		})
	})
}

// signalStarts has one to three callers each signal-with-start the runs s1.. (of the
// workflow "wait") at times of their own stream, with one signal ID or each its own:
// one of them starts the run, with its signal in the same message (invariant "sws").
func (c *simClient) signalStarts() {
	s := c.s
	for i := 1; i <= s.cfg.SignalStarts; i++ {
		id := fmt.Sprintf("s%d", i)
		at := time.Duration(s.signalStart.Int64N(int64(s.cfg.SubmitIn)))
		own := s.signalStart.IntN(2) == 0
		for k := range 1 + s.signalStart.IntN(3) {
			when := at + time.Duration(s.signalStart.Int64N(int64(2*time.Second)))
			sid := "sws-" + id
			if own {
				sid += fmt.Sprint("-", k)
			}
			c.later(when, func() {
				c.call("signal-with-start "+id+" "+sid, "ops", func(ctx context.Context, api *engine.API) error {
					_, err := api.SignalWithStart(ctx, id, "go", client.SignalOptions{ID: sid, Start: "wait"})
					return err
				}, func(err error) {
					if err == nil {
						s.signalStarted[id] = true
					} // else refused (the run ended) or no answer (its node died): fine
				})
			})
		}
	}
}

// eventTries bounds the deliveries of one copy of a message that found the cluster
// unable to start its run (its version below 3, a node that did not answer).
const eventTries = 30

// events publishes messages e1.. on the trigger of "ledger", each one to three times,
// and delivers every copy (to a live node, through the triggers part's handling) until
// its run is started or found; a copy whose start could not be made is delivered again
// a second later, as JetStream would after the triggers part's nak. Exactly one run per
// message (invariant "event").
func (c *simClient) events() {
	s := c.s
	for i := 1; i <= s.cfg.Events; i++ {
		at := time.Duration(s.event.Int64N(int64(s.cfg.SubmitIn)))
		for k := range 1 + s.event.IntN(3) {
			msg := workflow.TriggerMessage{ID: fmt.Sprintf("FLOW_EVENTS-%d", 10*i+k), Subject: fmt.Sprintf("sim.ledger.e%d", i),
				Stream: "FLOW_EVENTS", Seq: uint64(10*i + k), Data: fmt.Appendf(nil, `{"n":%d,"day":"2026-12-%02d"}`, i, i)}
			c.deliver(i, msg, at+time.Duration(s.event.Int64N(int64(2*time.Second))), eventTries)
		}
	}
}

// deliver delivers msg at when, and again a second later while its outcome is that it
// must be tried again (at most tries times).
func (c *simClient) deliver(i int, msg workflow.TriggerMessage, when time.Duration, tries int) {
	s := c.s
	c.later(when, func() {
		var outcome string
		c.call(fmt.Sprintf("event %d seq %d", i, msg.Seq), "ops", func(ctx context.Context, api *engine.API) error {
			var err error
			outcome, err = api.DeliverTriggerMessage(ctx, "ledger", 0, msg)
			if outcome == engine.TriggerRetried {
				return nil // a nak, not an unknown outcome: delivered again below
			}
			return err
		}, func(err error) {
			s.stats.TriggerDeliveries++
			switch {
			case outcome == engine.TriggerStarted || outcome == engine.TriggerSeen:
				s.eventSettled[i] = true
			case outcome == engine.TriggerRetried && tries > 1:
				c.deliver(i, msg, time.Second, tries-1)
			case outcome == engine.TriggerRefused:
				s.fail("event", "message %d (sequence %d) was refused: %v", i, msg.Seq, err)
			}
		})
	})
}
