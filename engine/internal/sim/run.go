package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/worker"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// errBoom is a simulated step's own failure.
var errBoom = errors.New("boom")

// runExec is one epoch of one run on this node.
type runExec struct {
	p      *pool
	run    *checkpoint.Run
	wf     *workflow.Workflow
	epoch  int64
	lease  *holder
	done   map[string]bool
	active map[string]bool // steps running now
	procs  []*proc
	// how the epoch ends
	stolen, completed, ended, finished bool
	cause                              error // why the epoch's context ended
	leaseCause                         error
	failedStep                         string
	failedErr                          error
	// park is the first step that asked to park the run (a wait with nothing to take):
	// nothing new starts, and the epoch parks once no step runs (worker/wait.go).
	park     *checkpoint.Wait
	parkStep string
}

// proc is one step attempt's process.
type proc struct {
	alive bool
	kill  func(cause error) // stop it: its step returns with the cause
}

func (x *runExec) n() *node { return x.p.n }

// cancel ends the epoch's context with cause (the first one stays) and kills its step
// processes: their steps return with it (a step in a write returns once it settles).
func (x *runExec) cancel(cause error) {
	if x.cause == nil {
		x.cause = cause
	}
	procs := x.procs
	x.procs = nil
	for _, pr := range procs {
		pr.kill(x.cause)
	}
	if len(x.active) == 0 {
		x.schedule()
	}
}

func (x *runExec) steal(cause error) error {
	if !x.stolen {
		x.stolen = true
		x.n().s.tracef(x.n().name, "%s epoch %d: %s (%v)", x.run.ID, x.epoch, worker.ReasonStolen, cause)
	}
	x.cancel(errStolen)
	return errStolen
}

func (x *runExec) leaseLost(cause error) {
	x.leaseCause = cause
	if !x.finished {
		x.cancel(cause)
	}
}

func (x *runExec) end(cause error) {
	if x.ended || x.finished {
		return
	}
	x.ended = true
	x.cancel(cause)
}

// write appends entries of this epoch after the local trust check; an unknown outcome
// or a fenced one steals the run (runExec.writeAll).
func (x *runExec) write(entries []checkpoint.Entry, done func([]error)) {
	fail := func(err error) {
		errs := make([]error, len(entries))
		for i := range errs {
			errs[i] = err
		}
		done(errs)
	}
	switch {
	case x.stolen:
		fail(errStolen)
		return
	case x.ended:
		fail(errRunEnded)
		return
	}
	if !x.n().s.cfg.Switches.NoTrustCheck {
		if err := x.lease.check(); err != nil {
			fail(x.steal(err))
			return
		}
	}
	for i := range entries {
		entries[i].Run, entries[i].Epoch, entries[i].Owner = x.run.ID, x.epoch, x.n().name
	}
	x.n().write(entries, func(_ uint64, errs []error) {
		for i, err := range errs {
			if err != nil && !worker.IsVerdict(err) {
				errs[i] = x.steal(err)
			}
		}
		done(errs)
	})
}

// note appends an entry without waiting for its outcome (a step's start).
func (x *runExec) note(e checkpoint.Entry) {
	if x.stolen || x.ended || x.lease.check() != nil {
		return
	}
	e.Run, e.Epoch, e.Owner = x.run.ID, x.epoch, x.n().name
	x.n().write([]checkpoint.Entry{e}, nil)
}

func (x *runExec) isDone(step string) bool { return x.done[step] }

// schedule starts the ready steps, or ends the epoch when nothing runs.
func (x *runExec) schedule() {
	if x.finished {
		return
	}
	ready := worker.ReadySteps(x.wf, x.isDone, x.active, 8, x.failedErr != nil || x.cause != nil || x.park != nil)
	for _, st := range ready {
		x.active[st.Name] = true
		x.runStep(st)
	}
	if len(x.active) == 0 {
		x.finish()
	}
}

// stepDone is a step's return: nil, or the error that ends the epoch.
func (x *runExec) stepDone(st *workflow.Step, err error) {
	if !x.active[st.Name] {
		return // cancelled meanwhile: it already returned with the cause
	}
	delete(x.active, st.Name)
	if err == nil {
		x.done[st.Name] = true
	} else {
		if x.failedErr == nil {
			x.failedStep, x.failedErr = st.Name, err
		}
		x.cancel(err) // siblings stop: the run fails (or was stolen)
		return
	}
	x.schedule()
}

func (x *runExec) runStep(st *workflow.Step) {
	if st.Uses == "wait" {
		x.runWait(st)
		return
	}
	if st.Foreach != "" {
		x.runForeach(st)
		return
	}
	x.note(checkpoint.Entry{Kind: checkpoint.KindStart, Step: st.Name, Item: checkpoint.ItemWhole})
	x.attempt(st, checkpoint.ItemWhole, 1, func(err error) {
		if err != nil {
			x.stepDone(st, err)
			return
		}
		out, _ := json.Marshal(map[string]any{"by": x.n().name, "epoch": x.epoch})
		x.commit(st, out)
	})
}

// commit writes a whole step's checkpoint, with the run's completion when it is the last.
func (x *runExec) commit(st *workflow.Step, out json.RawMessage) {
	entries := []checkpoint.Entry{{Kind: checkpoint.KindCommit, Step: st.Name, Item: checkpoint.ItemWhole, Output: out}}
	last := true
	for _, s := range x.wf.Steps {
		if s.Name != st.Name && !x.done[s.Name] {
			last = false
		}
	}
	if last {
		entries = append(entries, checkpoint.Entry{Kind: checkpoint.KindComplete, Status: checkpoint.StatusSucceeded})
	}
	x.write(entries, func(errs []error) {
		if last && errs[0] == nil && errs[1] == nil {
			x.completed = true
		}
		x.stepDone(st, errs[0])
	})
}

// attempt runs a step (or an item) with its retry policy; done gets nil or the error.
// The attempt is a process: it takes a random time and does its side effect at a
// random moment of it; it is killed with its epoch's context, with its node, and by its
// containment watchdog at the lease's trust deadline (which only the node moves, by
// renewing: a paused node's process dies at the deadline it had). What follows its end
// is worker.DecideAttempt's, as in flowd.
func (x *runExec) attempt(st *workflow.Step, item, k int, done func(error)) {
	x.attemptAgain(st, item, k, 0, done)
}

// attemptAgain is attempt after restarts uncounted restarts (a watchdog's stop the lease
// outlived).
func (x *runExec) attemptAgain(st *workflow.Step, item, k, restarts int, done func(error)) {
	n := x.n()
	s := n.s
	if x.cause != nil {
		done(x.cause)
		return
	}
	if err := x.lease.check(); err != nil {
		done(x.steal(err))
		return
	}
	d := time.Duration(s.rng.Int64N(int64(s.cfg.StepMax))) + time.Millisecond
	side := time.Duration(s.rng.Int64N(int64(d)))
	fails := s.rng.Float64() < s.cfg.StepFail
	start := s.now
	watchdog := !s.cfg.Switches.NoWatchdog && !s.cfg.Switches.hooks().NoKillSwitch
	exited := false
	exit := func(err error) { // the node learns the process ended
		if exited {
			return
		}
		exited = true
		if err == nil && fails {
			err = errBoom
		}
		state := worker.AttemptState{Err: err, Attempt: k, Max: max(st.Retry.MaxAttempts, 1), EpochEnded: x.cause != nil, Restarts: restarts}
		if errors.Is(err, steps.ErrTrustDeadline) {
			state.LeaseErr = x.lease.check()
		}
		switch d := worker.DecideAttempt(state); d.Action {
		case worker.AttemptDone:
			done(nil)
		case worker.AttemptEpochEnded:
			done(x.cause)
		case worker.AttemptSteal:
			done(x.steal(d.Cause))
		case worker.AttemptAgain:
			x.attemptAgain(st, item, k, restarts+1, done)
		case worker.AttemptRetry:
			x.note(checkpoint.Entry{Kind: checkpoint.KindFail, Step: st.Name, Item: item, Error: err.Error(), Attempt: k})
			n.on(time.Duration(st.Retry.InitialInterval), func() { x.attempt(st, item, k+1, done) })
		default:
			x.failStep(st, item, k, done)
		}
	}
	pr := &proc{alive: true}
	pr.kill = func(cause error) {
		pr.alive = false
		n.on(0, func() { exit(cause) })
	}
	x.procs = append(x.procs, pr)
	// dead: the process was killed, or its watchdog kills it now, past the deadline.
	dead := func() bool {
		if pr.alive && watchdog && !s.now.Before(x.lease.deadline()) {
			pr.alive = false
			n.on(0, func() { exit(fmt.Errorf("signal: terminated (%w)", steps.ErrTrustDeadline)) })
		}
		return !pr.alive
	}
	n.onProc(start.Add(side), func() {
		if !dead() {
			s.sideEffect(n, x.run.ID, st.Name, item, x.epoch)
		}
	})
	n.onProc(start.Add(d), func() {
		if dead() {
			return
		}
		pr.alive = false
		for i, q := range x.procs {
			if q == pr {
				x.procs = append(x.procs[:i:i], x.procs[i+1:]...)
				break
			}
		}
		n.on(0, func() { exit(nil) }) // the node learns of the exit when it runs
	})
}

// failStep records a step's final failure (runExec.failStep).
func (x *runExec) failStep(st *workflow.Step, item, attempts int, done func(error)) {
	if x.stolen {
		done(errStolen)
		return
	}
	if x.cause != nil {
		done(x.cause)
		return
	}
	x.write([]checkpoint.Entry{{Kind: checkpoint.KindFail, Step: st.Name, Item: item, Error: "boom", Final: true, Attempt: attempts}}, func(errs []error) {
		if errs[0] != nil {
			done(errs[0])
			return
		}
		done(fmt.Errorf("step %s: boom", st.Name))
	})
}

// runForeach runs the items that have no checkpoint yet, each checkpointed on its own,
// then checkpoints the step with the list of their outputs.
func (x *runExec) runForeach(st *workflow.Step) {
	n := x.n()
	var inputs map[string]any
	_ = json.Unmarshal(x.run.Inputs, &inputs)
	items, _ := inputs["items"].([]any)
	x.note(checkpoint.Entry{Kind: checkpoint.KindStart, Step: st.Name, Item: checkpoint.ItemWhole, Items: len(items)})
	have, err := n.store.Items(x.run.ID, st.Name)
	if err != nil {
		n.s.fail("sim", "%s: items: %v", n.name, err)
		return
	}
	doneItems := map[int]bool{}
	for _, it := range have {
		doneItems[it.Index] = true
	}
	var todo []int
	for i := range items {
		if !doneItems[i] {
			todo = append(todo, i)
		}
	}
	par := max(st.Parallelism, 1)
	running := 0
	var failed error
	var next func()
	next = func() {
		for running < par && len(todo) > 0 && failed == nil && x.cause == nil {
			i := todo[0]
			todo = todo[1:]
			running++
			x.attempt(st, i, 1, func(err error) {
				if err != nil {
					running--
					if failed == nil {
						failed = err
					}
					next()
					return
				}
				out, _ := json.Marshal(map[string]any{"item": i, "epoch": x.epoch})
				x.write([]checkpoint.Entry{{Kind: checkpoint.KindCommit, Step: st.Name, Item: i, Output: out}}, func(errs []error) {
					running--
					if errs[0] != nil && failed == nil {
						failed = errs[0]
					}
					next()
				})
			})
		}
		if running > 0 {
			return
		}
		switch {
		case failed != nil:
			x.stepDone(st, failed)
		case x.cause != nil:
			x.stepDone(st, x.cause)
		case len(todo) > 0:
		default:
			all, err := n.store.Items(x.run.ID, st.Name)
			if err != nil {
				n.s.fail("sim", "%s: items: %v", n.name, err)
				return
			}
			outs := make([]json.RawMessage, len(all))
			for i, it := range all {
				outs[i] = it.Output
			}
			agg, _ := json.Marshal(outs)
			x.commit(st, agg)
		}
	}
	next()
}

// finish is what the epoch does once no step runs (worker.DecideEnd), and then the
// lease goes back and the slot is free.
func (x *runExec) finish() {
	if x.finished {
		return
	}
	x.finished = true
	n := x.n()
	end := worker.EndState{Stolen: x.stolen, Completed: x.completed, Ended: x.ended, Cause: x.cause,
		LeaseCause: x.leaseCause, FailedStep: x.failedStep, FailedErr: x.failedErr, Done: len(x.done), Total: len(x.wf.Steps),
		Parked: x.park != nil}
	d := worker.DecideEnd(end)
	release := func() {
		x.lease.release()
		if x.p.runs[x.run.ID] == x {
			delete(x.p.runs, x.run.ID)
		}
		x.p.slotFree()
	}
	switch d.Action {
	case worker.EndSteal:
		_ = x.steal(d.Cause)
	case worker.EndHandBack:
		// runExec.handBack: a requeue (the next epoch is not counted), then the lease.
		if x.lease.check() == nil {
			e := checkpoint.Entry{Kind: checkpoint.KindRequeue, Run: x.run.ID, Epoch: x.epoch, Owner: n.name}
			n.write([]checkpoint.Entry{e}, func(uint64, []error) { release() })
			return
		}
	case worker.EndPark:
		// runExec.park: one park entry of the epoch; the lease goes back either way.
		x.write([]checkpoint.Entry{{Kind: checkpoint.KindPark, Step: x.parkStep, Item: checkpoint.ItemWhole, Wait: x.park}}, func(errs []error) {
			if errs[0] == nil {
				n.s.tracef(n.name, "%s epoch %d: parked on %s", x.run.ID, x.epoch, x.parkStep)
			}
			release()
		})
		return
	case worker.EndFailed, worker.EndSucceeded:
		x.write([]checkpoint.Entry{{Kind: checkpoint.KindComplete, Status: d.Status(), Step: d.Step, Error: d.Msg}}, func([]error) {
			release()
		})
		return
	}
	if x.completed && !x.stolen {
		n.s.tracef(n.name, "%s epoch %d: finished", x.run.ID, x.epoch)
	}
	release()
}

// runWait is worker/wait.go's wait step: the node's state has a signal for it (commit,
// consuming it), its timer fired (commit as timed out: on_timeout continue), or it parks.
func (x *runExec) runWait(st *workflow.Step) {
	n := x.n()
	r := x.p.read(x.run.ID)
	if r == nil {
		x.stepDone(st, fmt.Errorf("%s: no run %s in its state", n.name, x.run.ID))
		return
	}
	name, _ := st.With["signal"].(string)
	var consume uint64
	var out json.RawMessage
	switch sig := r.NextSignal(name); {
	case sig != nil:
		consume = sig.Seq
		out, _ = json.Marshal(map[string]any{"signal": name, "seq": sig.Seq, "epoch": x.epoch})
	case r.TimerFired(st.Name):
		out, _ = json.Marshal(map[string]any{"signal": name, "timed_out": true})
	default:
		timeout, _ := time.ParseDuration(fmt.Sprint(st.With["timeout"]))
		if x.park == nil {
			x.park, x.parkStep = &checkpoint.Wait{Kind: checkpoint.WaitSignal, Name: name, Until: n.s.now.Add(timeout)}, st.Name
		}
		delete(x.active, st.Name)
		if len(x.active) == 0 {
			x.finish()
		}
		return
	}
	entries := []checkpoint.Entry{{Kind: checkpoint.KindCommit, Step: st.Name, Item: checkpoint.ItemWhole, Output: out, Consume: consume}}
	x.write(entries, func(errs []error) { x.stepDone(st, errs[0]) })
}
