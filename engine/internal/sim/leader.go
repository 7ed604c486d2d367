package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/leader"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/epoch"
)

// leaderRole is a node's election and, while it holds a term, the term's services
// (engine/internal/leader's Service and termServices), carried out deterministically:
// the decisions are the leader package's own (PlanAssign under Admission, Reconciler,
// LockDelay, Reclaimable, CronDue and PlanTicks); every entry carries the term and is
// written only while the term's trust is open.
type leaderRole struct {
	n       *node
	attempt int
	term    *holder
	svc     *termSvc
}

func newLeaderRole(n *node) *leaderRole { return &leaderRole{n: n} }

// campaign bids for the leader key (Elector.Campaign): Create, and on a refusal or no
// answer, again after a capped backoff with full jitter.
func (r *leaderRole) campaign() {
	n := r.n
	if r.term != nil {
		return
	}
	sent := n.s.now
	b := n.s.srv.kv[leaderBucket]
	val, _ := json.Marshal(map[string]string{"node": n.name})
	n.call(time.Second, func(reply func(any)) {
		rev, err := b.create(leaderKey, val)
		reply(renewReply{rev: rev, err: err})
	}, func(v any, err error) {
		if r.term != nil {
			return
		}
		if err == nil {
			rr := v.(renewReply)
			if rr.err == nil {
				r.won(rr.rev, val, sent)
				return
			}
		}
		r.attempt++
		n.on(backoffDelay(n.s, min(r.attempt, 8), 50*time.Millisecond, 2*time.Second), r.campaign)
	})
}

func (r *leaderRole) won(rev uint64, val []byte, sent time.Time) {
	n := r.n
	r.attempt = 0
	term := int64(rev)
	n.s.stats.Terms++
	n.s.tracef(n.name, "won term %d", term)
	var h *holder
	h = newHolder(n, n.s.srv.kv[leaderBucket], leaderKey, val, rev, sent, fmt.Sprintf("term %d", term), true, func(error) {
		r.stepDown(h)
	})
	r.term = h
	if high := n.store.HighestTerm(); term < high {
		// Every entry of this term would be stale (the bucket was reset); flowd raises
		// the bucket's terms. The simulated bucket never goes back, so this is a bug.
		n.s.fail("sim", "%s won term %d below the applied term %d", n.name, term, high)
		return
	}
	if h.check() != nil { // its create answered after its window: lost at once
		return
	}
	r.svc = newTermSvc(r, h, term)
	r.svc.start()
}

// stepDown ends the term's services and campaigns again.
func (r *leaderRole) stepDown(h *holder) {
	if r.term != h {
		return
	}
	h.release()
	if r.svc != nil {
		r.svc.stopped = true
		r.svc = nil
	}
	r.term = nil
	r.n.on(backoffDelay(r.n.s, 2, 50*time.Millisecond, 2*time.Second), r.campaign)
}

// watched is a lease the term's watcher believes held, and when it last saw it written.
type watched struct {
	value epoch.LeaseValue
	seen  time.Time
}

// termSvc is one term's services: the assigner's loop (assign, reclaim on lapse
// events, reconcile on its timer), the lease watcher, and cron.
type termSvc struct {
	r          *leaderRole
	h          *holder
	term       int64
	adm        *leader.Admission
	reconciler leader.Reconciler
	delays     leader.LockDelay
	stopped    bool

	// the lease watcher (epoch.LeaseWatcher)
	ready   bool
	live    map[string]watched
	seenRev uint64
	current time.Time
	lapses  []epoch.LeaseValue

	// the assigner's loop: one action at a time, as term.go's goroutine
	busy, dirty, reconcileDue, waitChange bool

	cronBusy bool
	cronGen  int
	sched    <-chan struct{}
}

func newTermSvc(r *leaderRole, h *holder, term int64) *termSvc {
	cfg := r.n.s.cfg
	return &termSvc{r: r, h: h, term: term, adm: r.n.newAdmission(),
		reconciler: leader.Reconciler{TTL: cfg.TTL}, delays: leader.LockDelay{Delay: cfg.LockDelay},
		live: map[string]watched{}}
}

func (t *termSvc) n() *node { return t.r.n }

// on schedules fn for while this term's services run.
func (t *termSvc) on(d time.Duration, fn func()) {
	t.n().on(d, func() {
		if !t.stopped {
			fn()
		}
	})
}

// start opens the lease watcher; once it has the initial values, the services start
// with a reconcile pass (term.go).
func (t *termSvc) start() {
	n := t.n()
	b := n.s.srv.kv[leaseBucket]
	n.call(time.Second, func(reply func(any)) { reply(b.snapshot()) }, func(v any, err error) {
		if t.stopped {
			return
		}
		if err != nil {
			t.on(100*time.Millisecond, t.start)
			return
		}
		wr := v.(watchReply)
		now := n.s.now
		for _, ev := range wr.events {
			t.seen(ev, now)
		}
		t.seenRev, t.current, t.ready = wr.last, now, true
		t.watch()
		t.sweepLoop()
		t.reconcileDue = true
		t.kick()
		t.reconcileLoop()
		t.cronKick()
		t.timersLoop()
	})
}

// timersLoop is term.go's runTimers: every leader.TimerPass, the wakes of the parked
// runs whose timer is due (leader.PlanWakes).
func (t *termSvc) timersLoop() {
	t.on(leader.TimerPass, func() {
		n := t.n()
		entries, _, err := leader.PlanWakes(n.store, n.s.now, leader.TimerBatch)
		if err != nil {
			n.s.fail("sim", "%s: timers: %v", n.name, err)
			return
		}
		if len(entries) == 0 {
			t.timersLoop()
			return
		}
		t.write(entries, func(uint64, []error) { t.timersLoop() })
	})
}

func (t *termSvc) seen(ev kvEvent, now time.Time) {
	switch ev.op {
	case opPut:
		var v epoch.LeaseValue
		if json.Unmarshal(ev.value, &v) == nil {
			t.live[ev.key] = watched{value: v, seen: now}
		}
	case opDelete:
		t.end(ev.key, false)
	case opPurge:
		t.end(ev.key, true)
	}
}

// end reports a lease that ended: a lapse is a reclaim for the assigner's loop.
func (t *termSvc) end(run string, lapsed bool) {
	w, ok := t.live[run]
	if !ok {
		return
	}
	delete(t.live, run)
	if lapsed {
		t.n().s.tracef(t.n().name, "watcher: lease of %s epoch %d lapsed", run, w.value.Epoch)
		t.lapses = append(t.lapses, w.value)
		t.kick()
	}
}

// watch is the watcher's KV watch: events after the last seen revision, in order.
func (t *termSvc) watch() {
	n := t.n()
	b := n.s.srv.kv[leaseBucket]
	from := t.seenRev
	n.call(pollWait+time.Second, func(reply func(any)) { b.watch(from, pollWait, reply) }, func(v any, err error) {
		if t.stopped {
			return
		}
		if err == nil {
			wr := v.(watchReply)
			now := n.s.now
			for _, ev := range wr.events {
				if ev.rev > t.seenRev {
					t.seen(ev, now)
					t.seenRev = ev.rev
				}
			}
			if t.seenRev >= wr.last {
				t.current = now
			}
		}
		t.watch()
	})
}

// watchCurrent: the watch showed within a renewal interval that it is caught up with
// the bucket (LeaseWatcher.Current).
func (t *termSvc) watchCurrent() bool {
	return t.ready && t.n().s.now.Sub(t.current) <= t.n().s.lc.RenewInterval()
}

// sweepLoop is the watcher's own-clock rule: while its watch is current, a lease not
// seen renewed for LapseAfter has lapsed (LeaseWatcher.sweep).
func (t *termSvc) sweepLoop() {
	n := t.n()
	lc := n.s.lc
	every := max(lc.TTL()/4, 10*time.Millisecond)
	t.on(every, func() {
		b := n.s.srv.kv[leaseBucket]
		n.call(max(lc.TTL()/4, 100*time.Millisecond), func(reply func(any)) { reply(b.rev) }, func(v any, err error) {
			if t.stopped {
				return
			}
			now := n.s.now
			if err == nil && v.(uint64) <= t.seenRev {
				t.current = now
			}
			if t.watchCurrent() {
				var lapsed []string
				for run, w := range t.live {
					if now.Sub(w.seen) > lc.LapseAfter() {
						lapsed = append(lapsed, run)
					}
				}
				slices.Sort(lapsed)
				for _, run := range lapsed {
					t.end(run, true)
				}
			}
		})
		t.sweepLoop()
	})
}

func (t *termSvc) reconcileLoop() {
	t.on(t.n().s.cfg.ReconcileInterval, func() {
		t.reconcileDue = true
		t.kick()
		t.reconcileLoop()
	})
}

// kick wakes the assigner's loop: it runs one action at a time, and looks again once
// it is done if something changed meanwhile.
func (t *termSvc) kick() {
	if t.stopped {
		return
	}
	if t.busy {
		t.dirty = true
		return
	}
	t.busy = true
	t.loop()
}

// loop is one turn of term.go's loop: step down below a higher applied term, assign
// what admission allows, then one input: a lapse, a reconcile, or a change.
func (t *termSvc) loop() {
	n := t.n()
	if t.stopped {
		return
	}
	if high := n.store.HighestTerm(); high > t.term {
		n.s.tracef(n.name, "term %d: a higher term (%d) was applied: stepping down", t.term, high)
		t.r.stepDown(t.h)
		return
	}
	t.dirty = false
	if !t.waitChange {
		t.waitChange = true
		n.onChange(func() {
			t.waitChange = false
			t.kick()
		})
	}
	t.assignPending(t.next)
}

func (t *termSvc) next() {
	if t.stopped {
		return
	}
	switch {
	case len(t.lapses) > 0:
		l := t.lapses[0]
		t.lapses = t.lapses[1:]
		rc := leader.Reclaim{Run: l.Run, Epoch: l.Epoch, Owner: l.Owner, Reason: checkpoint.ReasonLeaseExpired}
		if n := t.n(); n.s.cfg.Switches.LapseIgnoresOwner {
			rc.Owner = "" // the rule before the fix: any lapse of the epoch reclaims it
		}
		t.reclaim(rc, t.next)
	case t.reconcileDue:
		t.reconcileDue = false
		t.reconcile(t.next)
	case t.dirty:
		t.loop()
	default:
		t.busy = false
	}
}

// write appends scheduler entries in one message with the term, after the local trust
// check (termServices.write); done gets the sequence and the verdicts, or nothing when
// the term is no longer trusted.
func (t *termSvc) write(entries []checkpoint.Entry, done func(seq uint64, errs []error)) {
	if t.stopped || t.h.check() != nil {
		done(0, nil)
		return
	}
	for i := range entries {
		entries[i].Term, entries[i].Owner = t.term, t.n().name
	}
	t.n().write(entries, func(seq uint64, errs []error) {
		if t.stopped {
			return
		}
		done(seq, errs)
	})
}

func (t *termSvc) assignPending(done func()) {
	n := t.n()
	assigned, _ := n.store.Held()
	room := t.adm.Room(assigned)
	runs, err := leader.PlanAssign(n.store, n.specs, room)
	if err != nil {
		n.s.fail("sim", "%s: plan assign: %v", n.name, err)
		return
	}
	t.adm.SetBacklogged(room-len(runs) <= 0 && n.store.QueuedRuns() > 0)
	if len(runs) == 0 {
		done()
		return
	}
	entries := make([]checkpoint.Entry, len(runs))
	for i, r := range runs {
		entries[i] = leader.AssignEntry(r.ID, r.Epoch, "")
	}
	written := t.adm.Writing(len(runs))
	t.write(entries, func(seq uint64, errs []error) {
		written()
		for i, err := range errs {
			if err == nil {
				t.publishTask(tasks.Task{Run: runs[i].ID, Epoch: int64(seq)})
			}
		}
		done()
	})
}

// publishTask queues a task; one lost is queued again by a reconcile.
func (t *termSvc) publishTask(task tasks.Task) {
	q := t.n().s.srv.tasks
	t.n().call(time.Second, func(reply func(any)) { reply(q.publish(task)) }, func(any, error) {})
}

// reclaim gives a new epoch to a running run whose lease for rc.Epoch ended, after the
// lock delay (termServices.reclaim).
func (t *termSvc) reclaim(rc leader.Reclaim, done func()) {
	n := t.n()
	r, err := n.store.Run(rc.Run)
	if err != nil || !leader.Reclaimable(r, rc) {
		done()
		return
	}
	if due, _ := t.delays.Due(rc.Run, n.s.now); !due {
		done()
		return
	}
	write := func() {
		t.write([]checkpoint.Entry{leader.AssignEntry(rc.Run, rc.Epoch, rc.Reason)}, func(seq uint64, errs []error) {
			if errs != nil && errs[0] == nil {
				t.publishTask(tasks.Task{Run: rc.Run, Epoch: int64(seq)})
			}
			done()
		})
	}
	if n.s.cfg.Switches.NoLeaseRead {
		write()
		return
	}
	// The state showed the run claimed at the epoch, so the claim's lease was created
	// before this read: a live lease of the epoch now is its owner's (Leases.Holder).
	b := n.s.srv.kv[leaseBucket]
	n.call(time.Second, func(reply func(any)) { reply(b.latest(rc.Run)) }, func(v any, err error) {
		if t.stopped {
			return
		}
		if err != nil {
			done() // unknown: the next reconcile looks again
			return
		}
		if l := v.(latest); l.live {
			var held epoch.LeaseValue
			if json.Unmarshal(l.value, &held) == nil && held.Epoch == rc.Epoch {
				n.s.tracef(n.name, "reclaim of %s epoch %d: %s holds its lease now; none", rc.Run, rc.Epoch, held.Owner)
				done()
				return
			}
		}
		write()
	})
}

// reconcile carries out one Reconciler.Pass.
func (t *termSvc) reconcile(done func()) {
	n := t.n()
	if n.s.cfg.Switches.NoReconcile {
		done()
		return
	}
	live := func(run string) (int64, bool) {
		w, ok := t.live[run]
		return w.value.Epoch, ok
	}
	if n.s.trace != nil {
		var ids []string
		for id, w := range t.live {
			ids = append(ids, fmt.Sprintf("%s@%d", id, w.value.Epoch))
		}
		slices.Sort(ids)
		n.s.tracef(n.name, "reconcile: live %v, seen rev %d", ids, t.seenRev)
	}
	p, err := t.reconciler.Pass(n.store, live, n.s.now)
	if err != nil {
		n.s.fail("sim", "%s: reconcile: %v", n.name, err)
		return
	}
	if !t.watchCurrent() && !n.s.cfg.Switches.ReconcileOnStaleWatch {
		// A watch that lags cannot tell a lapsed lease from one it has not heard of yet
		// (LeaseWatcher.Current): no reclaim on its word.
		if len(p.Reclaim) > 0 {
			n.s.tracef(n.name, "reconcile: the lease watch is not current; %d reclaims wait", len(p.Reclaim))
		}
		p.Reclaim = nil
	}
	for _, rq := range p.Requeue {
		t.publishTask(tasks.Task{Run: rq.Run, Epoch: rq.Epoch})
	}
	var each func(i int)
	each = func(i int) {
		if i == len(p.Reclaim) || t.stopped {
			done()
			return
		}
		t.reclaim(p.Reclaim[i], func() { each(i + 1) })
	}
	each(0)
}

// cronKick runs the cron planner now, unless it is busy (termServices.runCron).
func (t *termSvc) cronKick() {
	if t.stopped || t.cronBusy {
		return
	}
	t.cronBusy = true
	t.cronGen++
	n := t.n()
	t.sched = n.store.ScheduleChanged()
	now := n.s.now
	plans, next, err := leader.CronDue(n.store, n.specs, now)
	if err != nil {
		n.s.fail("sim", "%s: cron: %v", n.name, err)
		return
	}
	var entries []checkpoint.Entry
	for _, p := range plans {
		es, _ := leader.PlanTicks(p, now, 30*time.Second, leader.WorkflowActive(n.store, p.Workflow.Name))
		entries = append(entries, es...)
	}
	wait := time.Minute
	if !next.IsZero() {
		wait = next.Sub(now)
	}
	var each func(i int)
	each = func(i int) {
		if t.stopped {
			return
		}
		if i == len(entries) {
			t.cronBusy = false
			gen := t.cronGen
			t.on(max(wait-n.s.now.Sub(now), time.Millisecond), func() {
				if gen == t.cronGen {
					t.cronKick()
				}
			})
			return
		}
		// One message per tick, in order: a tick's outcome follows the one before.
		t.write([]checkpoint.Entry{entries[i]}, func(_ uint64, errs []error) {
			if errs == nil || (errs[0] != nil && !errors.Is(errs[0], checkpoint.ErrTickExists)) {
				t.cronBusy = false // not recorded: the planner tries again soon
				t.on(500*time.Millisecond, t.cronKick)
				return
			}
			each(i + 1)
		})
	}
	each(0)
}

// scheduleChanged wakes cron when a workflow version or a tick was applied.
func (t *termSvc) scheduleChanged() {
	if t.sched == nil {
		return
	}
	select {
	case <-t.sched:
		t.sched = nil
		t.cronKick()
	default:
	}
}
