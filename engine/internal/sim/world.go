package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/workflow"
)

// The world around the cluster: the network's links, the faults, the client that
// applies workflows and starts runs, and the checks that need the whole picture
// (side effects, liveness, the final states).

// delay is how long a message takes on a link: a fraction of a millisecond, and while
// faults last, sometimes a slow path of up to a TTL.
func (s *Sim) delay() time.Duration {
	d := 100*time.Microsecond + time.Duration(s.rng.Int64N(int64(2*time.Millisecond)))
	if s.faultOn && s.cfg.SlowP > 0 && s.rng.Float64() < s.cfg.SlowP {
		d += time.Duration(s.rng.Int64N(int64(s.cfg.TTL)))
	}
	return d
}

// link says whether a message leaving n's link (either way) gets on the wire: not if n
// is partitioned, nor if it is lost.
func (s *Sim) link(n *node) bool {
	if n.partitioned || (s.faultOn && s.cfg.Loss > 0 && s.rng.Float64() < s.cfg.Loss) {
		s.stats.Lost++
		return false
	}
	return true
}

// linkUp says whether a message arriving over n's link is delivered: not if a partition
// began while it travelled.
func (s *Sim) linkUp(n *node) bool { return !n.partitioned }

// scheduleFaults draws the faults' times and targets, all before FaultsFor, when every
// fault heals.
func (s *Sim) scheduleFaults() {
	c := s.cfg
	window := int64(c.FaultsFor)
	pick := func() *node { return s.nodes[s.rng.IntN(len(s.nodes))] }
	for i := 0; i < c.Partitions; i++ {
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := 200*time.Millisecond + time.Duration(s.rng.Int64N(int64(3*c.TTL)))
		s.after(at, func() {
			if !n.partitioned && s.faultOn {
				n.partitioned = true
				s.stats.Partitions++
				s.tracef(n.name, "PARTITIONED for %s", d)
				s.after(d, func() { s.heal(n) })
			}
		})
	}
	for i := 0; i < c.Pauses; i++ {
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := 100*time.Millisecond + time.Duration(s.rng.Int64N(int64(3*c.TTL)))
		s.after(at, func() {
			if s.faultOn && n.alive && !n.paused {
				n.pause()
				s.after(d, n.resume)
			}
		})
	}
	for i := 0; i < c.Kills; i++ {
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := 100*time.Millisecond + time.Duration(s.rng.Int64N(int64(2*c.TTL)))
		s.after(at, func() {
			if s.faultOn && n.alive {
				n.kill()
				s.after(d, n.restart)
			}
		})
	}
	for i := 0; i < c.Drains; i++ {
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := 100*time.Millisecond + time.Duration(s.rng.Int64N(int64(2*c.TTL)))
		s.after(at, func() {
			if s.faultOn && n.alive && !n.paused {
				n.drain()
				var back func()
				back = func() {
					if n.alive { // still draining
						s.after(100*time.Millisecond, back)
						return
					}
					n.restart()
				}
				s.after(d, back)
			}
		})
	}
	s.after(c.FaultsFor, func() {
		s.faultOn = false
		s.tracef("--", "faults end")
		for _, n := range s.nodes {
			s.heal(n)
			n.resume()
			n.restart()
		}
		s.watchEnd()
	})
}

func (s *Sim) heal(n *node) {
	if n.partitioned {
		n.partitioned = false
		s.tracef(n.name, "partition healed")
	}
}

// sideEffect is a step process's side effect, done at that moment by run's epoch:
// invariants 8 and 3 are checked against the whole log appended so far.
func (s *Sim) sideEffect(n *node, run, step string, item int, ep int64) {
	s.stats.SideEffects++
	s.tracef(n.name, "side effect %s/%s[%d] by epoch %d", run, step, item, ep)
	if err := s.check.SideEffect(run, step, item, ep); err != nil {
		s.failErr(err)
	}
}

// watchEnd looks, once the faults are over, for the end: every run ended and every
// node caught up; past Settle, a run still not ended breaks liveness.
func (s *Sim) watchEnd() {
	deadline := s.now.Add(s.cfg.Settle)
	var look func()
	look = func() {
		if s.finishedAll() {
			s.finished = true
			return
		}
		if !s.now.Before(deadline) {
			s.fail("liveness", "%s after the faults stopped, runs have not ended: %s", s.cfg.Settle, s.unfinished())
			return
		}
		s.after(250*time.Millisecond, look)
	}
	look()
}

func (s *Sim) done() bool { return s.finished }

// finishedAll: the client's work is written, every run ended, and every node applied
// the whole log.
func (s *Sim) finishedAll() bool {
	if !s.cl.allWritten() || s.unfinished() != "" {
		return false
	}
	last := uint64(len(s.srv.log))
	for _, n := range s.nodes {
		if !n.alive || n.store.Applied() != last {
			return false
		}
	}
	return true
}

// unfinished lists the runs that have not ended, with their status ("" if none).
func (s *Sim) unfinished() string {
	var out []string
	for _, st := range []checkpoint.RunStatus{checkpoint.StatusPending, checkpoint.StatusRunning, checkpoint.StatusWaiting} {
		_ = s.ref.EachRun(checkpoint.ListOptions{Status: st}, func(r *checkpoint.Run) bool {
			out = append(out, fmt.Sprintf("%s (%s, epoch %d, owner %q)", r.ID, r.Status, r.Epoch, r.Owner))
			return true
		})
	}
	return strings.Join(out, ", ")
}

// final checks invariant 9 at the end: every node's state is the reference's, byte for
// byte, and counts how the runs ended.
func (s *Sim) final() error {
	var want bytes.Buffer
	if err := s.ref.Dump(&want); err != nil {
		return err
	}
	for _, n := range s.nodes {
		var got bytes.Buffer
		if err := n.store.Dump(&got); err != nil {
			return err
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			s.fail("9", "%s's state differs from the whole log's (%s)", n.name, firstDiff(got.String(), want.String()))
			return s.failure
		}
	}
	for _, st := range []checkpoint.RunStatus{checkpoint.StatusSucceeded, checkpoint.StatusFailed, checkpoint.StatusCancelled} {
		c, _ := s.ref.CountRuns(st)
		switch st {
		case checkpoint.StatusSucceeded:
			s.stats.Succeeded = c
		case checkpoint.StatusFailed:
			s.stats.Failed = c
		default:
			s.stats.Cancelled = c
		}
	}
	return nil
}

func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(la) && i < len(lb); i++ {
		if la[i] != lb[i] {
			return fmt.Sprintf("line %d: %.120s vs %.120s", i+1, la[i], lb[i])
		}
	}
	return fmt.Sprintf("%d lines vs %d", len(la), len(lb))
}

// The workflows the client applies. Their steps are no-ops to the engine's registry;
// the simulation runs each attempt as a process of its own (worker.go).
var workflows = []string{
	`name: chain
max_epochs: 1
steps:
  - {name: a, uses: noop}
  - {name: b, uses: noop, needs: [a], retry: {max_attempts: 2, initial_interval: 100ms}}
  - {name: c, uses: noop, needs: [b]}
`,
	`name: fan
max_epochs: 4
inputs:
  items: {type: list, default: [1, 2, 3, 4]}
steps:
  - {name: split, uses: noop}
  - {name: each, uses: noop, needs: [split], foreach: "{{ inputs.items }}", parallelism: 2, retry: {max_attempts: 2, initial_interval: 50ms}}
  - {name: side, uses: noop, needs: [split]}
  - {name: join, uses: noop, needs: [each, side]}
`,
	// Waits (issue 26): a signal that may come before the wait, after it, twice with the
	// same id, or never (the timeout: the run goes on).
	`name: wait
max_epochs: 3
steps:
  - {name: a, uses: noop}
  - {name: w, uses: wait, needs: [a], with: {signal: go, timeout: 3s, on_timeout: continue}}
  - {name: b, uses: noop, needs: [w]}
`,
}

const cronWorkflow = `name: tick
max_epochs: 3
schedule: {cron: "@every 4s", overlap: allow, catchup: all}
steps:
  - {name: a, uses: noop}
  - {name: b, uses: noop, needs: [a]}
`

// client applies the workflows and starts the runs, through a node's API (its log
// writer): an outcome it does not learn is retried on another node, with the same run
// ID (a repeat is refused as "run exists").
type client struct {
	s       *Sim
	wfs     map[string]*workflow.Workflow
	pending int // writes not yet known to be in the log
	runs    int
}

func newClient(s *Sim) *client { return &client{s: s, wfs: map[string]*workflow.Workflow{}} }

func (c *client) allWritten() bool { return c.pending == 0 && c.runs == c.s.cfg.Runs }

func (c *client) start() {
	s := c.s
	srcs := append([]string(nil), workflows...)
	if s.cfg.Cron {
		srcs = append(srcs, cronWorkflow)
	}
	var names []string
	for _, src := range srcs {
		w, err := workflow.Load("sim.yaml", []byte(src), nil)
		if err != nil {
			s.fail("sim", "workflow: %v", err)
			return
		}
		c.wfs[w.Name] = w
		names = append(names, w.Name)
	}
	sort.Strings(names)
	applied := 0
	for _, name := range names {
		c.send(c.workflowEntry(c.wfs[name]), func() {
			applied++
			if applied == len(names) {
				c.submitAll()
			}
		})
	}
	if s.cfg.Cron {
		s.after(s.cfg.CronUntil, func() {
			// The schedule ends: a version without it (the ticks recorded stay).
			w, err := workflow.Load("sim.yaml", []byte(strings.Replace(cronWorkflow, "schedule: {cron: \"@every 4s\", overlap: allow, catchup: all}\n", "", 1)), nil)
			if err != nil {
				s.fail("sim", "workflow: %v", err)
				return
			}
			c.send(c.workflowEntry(w), func() {})
		})
	}
}

func (c *client) workflowEntry(w *workflow.Workflow) checkpoint.Entry {
	spec, _ := json.Marshal(w)
	return checkpoint.Entry{Kind: checkpoint.KindWorkflow, Owner: "client", Workflow: &checkpoint.WorkflowDef{Name: w.Name, Digest: w.Digest, Spec: spec}}
}

// submitAll starts the runs at random times, each of a random workflow.
func (c *client) submitAll() {
	s := c.s
	for i := 1; i <= s.cfg.Runs; i++ {
		at := time.Duration(s.rng.Int64N(int64(s.cfg.SubmitIn)))
		w := c.wfs[[]string{"chain", "fan", "wait"}[s.rng.IntN(3)]]
		id := fmt.Sprintf("r%d", i)
		if w.Name == "wait" {
			c.signalLater(id, at)
		}
		s.after(at, func() {
			sub := &checkpoint.Submit{Workflow: w.Name, Version: 1, Trigger: checkpoint.TriggerManual, MaxEpochs: w.MaxEpochs}
			if w.Name == "fan" {
				sub.Inputs = json.RawMessage(`{"items":[1,2,3,4]}`)
			}
			for _, st := range w.Steps {
				sub.Steps = append(sub.Steps, checkpoint.StepSpec{Name: st.Name, Foreach: st.Foreach != ""})
			}
			c.send(checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: id, Owner: "client", Submit: sub}, func() { c.runs++ })
		})
	}
}

// signalLater sends run id its signal at random times after at: none at all (its wait
// times out), once, or twice with the same id (a client retrying: applied once).
func (c *client) signalLater(id string, at time.Duration) {
	s := c.s
	times := s.rng.IntN(3)
	for range times {
		when := at + time.Duration(s.rng.Int64N(int64(4*time.Second)))
		c.pending++ // known once written: the run may end first (then it is refused)
		s.after(when, func() {
			c.pending--
			c.send(checkpoint.Entry{Kind: checkpoint.KindSignal, Run: id, Owner: "client", Actor: "ops",
				Signal: &checkpoint.Signal{Name: "go", ID: "sig-" + id}}, func() {})
		})
	}
}

// send writes e through a random live node until its outcome is known.
func (c *client) send(e checkpoint.Entry, done func()) {
	s := c.s
	c.pending++
	var try func()
	try = func() {
		var live []*node
		for _, n := range s.nodes {
			if n.alive && !n.paused {
				live = append(live, n)
			}
		}
		if len(live) == 0 {
			s.after(500*time.Millisecond, try)
			return
		}
		n := live[s.rng.IntN(len(live))]
		answered := false // the node may die before it answers: then the client asks again
		s.after(10*time.Second, func() {
			if !answered {
				answered = true
				try()
			}
		})
		n.write([]checkpoint.Entry{e}, func(_ uint64, errs []error) {
			if answered {
				return
			}
			answered = true
			if isUnknown(errs[0]) {
				s.after(500*time.Millisecond, try)
				return
			}
			c.pending--
			done()
		})
	}
	try()
}
