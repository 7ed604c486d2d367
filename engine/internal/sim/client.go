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
	srcs := append([]string(nil), workflows...)
	if s.cfg.Cron {
		srcs = append(srcs, cronWorkflow)
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
				if s.cfg.Cron {
					c.unscheduleAt(s.cfg.CronUntil)
				}
			}
		})
	}
}

// unscheduleAt applies the cron workflow without its schedule at offset at from the
// start, or now if that has passed: only once every apply's outcome is known, so that a
// retried first apply does not bring the schedule back after it.
func (c *simClient) unscheduleAt(at time.Duration) {
	s := c.s
	c.later(max(0, T0.Add(at).Sub(s.now)), func() {
		// The schedule ends: a version without it (the ticks recorded stay).
		src := strings.Replace(cronWorkflow, "schedule: {cron: \"@every 4s\", overlap: allow, catchup: all}\n", "", 1)
		c.call("unschedule tick", "ops", func(ctx context.Context, api *engine.API) error {
			_, err := api.ApplyWorkflow(ctx, "sim.yaml", []byte(src))
			return err
		}, func(error) {})
	})
}

// submitAll starts the runs at random times, each of a random workflow.
func (c *simClient) submitAll() {
	s := c.s
	names := []string{"chain", "fan", "wait"}
	sort.Strings(names)
	for i := 1; i <= s.cfg.Runs; i++ {
		at := time.Duration(s.rng.Int64N(int64(s.cfg.SubmitIn)))
		wf := names[s.rng.IntN(len(names))]
		id := fmt.Sprintf("r%d", i)
		if wf == "wait" {
			c.signalLater(id, at)
		}
		c.later(at, func() {
			c.call("start "+id+" "+wf, "ops", func(ctx context.Context, api *engine.API) error {
				_, err := api.StartRun(ctx, wf, client.StartOptions{ID: id})
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

// signalLater sends run id its signal at random times after at: none at all (its wait
// times out), once, or twice with the same signal ID (a client retrying: applied once).
func (c *simClient) signalLater(id string, at time.Duration) {
	s := c.s
	for range s.rng.IntN(3) {
		when := at + time.Duration(s.rng.Int64N(int64(4*time.Second)))
		c.later(when, func() {
			c.call("signal "+id, "ops", func(ctx context.Context, api *engine.API) error {
				return api.Signal(ctx, id, "go", client.SignalOptions{ID: "sig-" + id})
			}, func(error) {}) // a run that ended or is not there yet refuses it: fine
		})
	}
}

// The workflows the client applies. Their steps are simulated processes (process.go).
var workflows = []string{
	`name: chain
max_epochs: 1
steps:
  - {name: a, uses: sim}
  - {name: b, uses: sim, needs: [a], retry: {max_attempts: 2, initial_interval: 100ms}}
  - {name: c, uses: sim, needs: [b]}
`,
	`name: fan
max_epochs: 4
inputs:
  items: {type: list, default: [1, 2, 3, 4]}
steps:
  - {name: split, uses: sim}
  - {name: each, uses: sim, needs: [split], foreach: "{{ inputs.items }}", parallelism: 2, retry: {max_attempts: 2, initial_interval: 50ms}}
  - {name: side, uses: sim, needs: [split]}
  - {name: join, uses: sim, needs: [each, side]}
`,
	// A signal that may come before the wait, after it, twice with the same id, or never
	// (the timeout: the run goes on).
	`name: wait
max_epochs: 3
steps:
  - {name: a, uses: sim}
  - {name: w, uses: wait, needs: [a], with: {signal: go, timeout: 3s, on_timeout: continue}}
  - {name: b, uses: sim, needs: [w]}
`,
}

const cronWorkflow = `name: tick
max_epochs: 3
schedule: {cron: "@every 4s", overlap: allow, catchup: all}
steps:
  - {name: a, uses: sim}
  - {name: b, uses: sim, needs: [a]}
`
