package leader

import (
	"context"
	"errors"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/dlq"
	"github.com/flowrun/flow/engine/internal/tasks"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/logstream"
)

// termServices are the leader's services for one term: the assigner (assignment,
// reclaim of lapsed leases, reconcile) on the term's own goroutine, and cron, snapshots
// with compaction, and retention beside it. They all end with the term. Every entry
// they write carries the term, after the local trust check (write).
type termServices struct {
	s          *Service
	term       *epoch.Term
	watcher    *epoch.LeaseWatcher
	reconciler Reconciler
	delays     LockDelay
	event      epoch.LeaseEvent // the lease event next took
	// slots counts concurrency keys' slots (keys.go) from the releases since
	// releasedAt. wrote is the highest sequence the state must have applied before it
	// counts: the log's last at the term's start (tailRead once it was read: what the
	// last leader wrote), then this term's assigns.
	slots      *slotCounter
	releasedAt uint64
	wrote      uint64
	tailRead   bool
}

func newTermServices(s *Service, term *epoch.Term) *termServices {
	return &termServices{s: s, term: term, reconciler: Reconciler{TTL: s.cfg.TTL}, delays: LockDelay{Delay: s.cfg.LockDelay}}
}

func (t *termServices) run(parent context.Context) {
	s := t.s
	ctx, cancel := context.WithCancel(t.term.Context())
	defer cancel()
	stop := context.AfterFunc(parent, cancel)
	defer stop()
	// A run released before this cursor was read wrote its lease before the barrier, which
	// the watch made after it must pass (keys.go).
	t.releasedAt = s.cfg.State.ReleaseCursor()
	t.slots = newSlotCounter(s.clock.Now())
	w, err := s.cfg.Leases.Watch(ctx)
	if err != nil {
		s.log.Error("lease watcher", "err", err)
		return
	}
	defer w.Stop()
	t.watcher = w
	select {
	case <-w.Ready():
	case <-ctx.Done():
		return
	}
	t.reconcile(ctx)
	cronDone, snapDone, retireDone, timersDone := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { defer close(timersDone); t.runTimers(ctx) }()
	go func() { defer close(cronDone); t.runCron(ctx) }()
	go func() { defer close(snapDone); t.runSnapshots(ctx) }()
	go func() { defer close(retireDone); t.runRetention(ctx) }()
	gateDone := make(chan struct{})
	if s.cfg.Gate != nil {
		go func() { defer close(gateDone); t.runGate(ctx) }()
	} else {
		close(gateDone)
	}
	defer func() {
		cancel()
		<-cronDone
		<-snapDone
		<-retireDone
		<-timersDone
		<-gateDone
	}()
	reconcile := s.clock.NewTicker(s.cfg.ReconcileInterval)
	defer reconcile.Stop()
	for {
		if high := s.cfg.State.HighestTerm(); high > t.term.Term() {
			// Another term above ours was applied: every entry of ours is stale now.
			// Stop leading (and waking on our own rejections); the election decides.
			s.log.Error("a higher term than ours was applied: stepping down", "term", t.term.Term(), "highest_applied", high)
			return
		}
		changed := s.cfg.Log.Changed()
		seen := s.cfg.State.Applied()
		t.assignPending(ctx)
		s.hooks.ScheduledUpTo.Store(seen)
		switch t.next(ctx, w.Events(), reconcile.Chan(), changed) {
		case wakeStop:
			return
		case wakeLease:
			if ev := t.event; ev.Kind == epoch.LeaseLapsed {
				t.reclaim(ctx, Reclaim{Run: ev.Lease.Run, Epoch: ev.Lease.Epoch, Owner: ev.Lease.Owner, Reason: checkpoint.ReasonLeaseExpired})
			}
		case wakeReconcile:
			t.reconcile(ctx)
		}
	}
}

// What woke the assigner's loop.
const (
	wakeStop = iota
	wakeLease
	wakeReconcile
	wakeChanged
)

// next waits for the assigner's next work: the term's end, a lease event (kept in
// t.event), a reconcile tick, or the log applying more. When several are ready it takes
// them in that order, where a bare select would take one at random: the same state then
// meets the same work first on every node and in every replay of a simulation's seed.
func (t *termServices) next(ctx context.Context, events <-chan epoch.LeaseEvent, tick <-chan time.Time, changed <-chan struct{}) int {
	select {
	case <-ctx.Done():
		return wakeStop
	case <-t.s.failedApplier():
		return wakeStop // the state no longer follows the log: step down (run sits out)
	default:
	}
	select {
	case t.event = <-events:
		return wakeLease
	default:
	}
	select {
	case <-tick:
		return wakeReconcile
	default:
	}
	select {
	case <-ctx.Done():
		return wakeStop
	case <-t.s.failedApplier():
		return wakeStop
	case t.event = <-events:
		return wakeLease
	case <-tick:
		return wakeReconcile
	case <-changed:
		return wakeChanged
	}
}

// write appends scheduler entries in one message with the term, after the local trust
// check, and returns their future (nil if the term is no longer trusted).
func (t *termServices) write(ctx context.Context, entries ...checkpoint.Entry) *logstream.Future {
	if err := t.term.Check(); err != nil {
		return nil
	}
	for i := range entries {
		entries[i].Term, entries[i].Owner = t.term.Term(), t.s.cfg.Node
	}
	return t.s.cfg.Log.Write(ctx, entries...)
}

// assignPending assigns the oldest pending runs, as many as admission allows: the rest
// wait in the state without an epoch.
func (t *termServices) assignPending(ctx context.Context) {
	s := t.s
	t.readTail(ctx)
	// One count a pass, shared by the step slots' grants and the admission of runs with
	// keys: each sees what the other took.
	var counts KeyCounts
	counted, canCount := false, false
	count := func() (KeyCounts, bool) {
		if !counted {
			counted = true
			counts, canCount = t.countSlots()
		}
		return counts, canCount
	}
	t.grantSlots(ctx, count)
	assigned, _ := s.cfg.State.Held()
	room := s.cfg.Admission.Room(assigned)
	runs, err := PlanAssign(s.cfg.State, s.cfg.Specs, room, PlanOptions{Slots: count, Taken: t.slots.admitted, Placeable: s.cfg.Placeable,
		Now: s.clock.Now(), Aging: s.cfg.PriorityAging})
	if err != nil {
		s.log.Error("list pending runs", "err", err)
	}
	planned := len(runs)
	for len(runs) > 0 && ctx.Err() == nil {
		n := min(len(runs), logstream.DefaultMaxBatchEntries) // one log message
		t.assignAll(ctx, runs[:n])
		runs = runs[n:]
	}
	// Runs left when this pass ran out of room wait for it: the API's short path may not
	// pass them (Admission.Admit). Runs skipped for their concurrency limit do not count.
	// What it left queued: the runs it planned leave the queue when their assigns apply
	// (some may have already: then fewer are counted, and the short path waits for the
	// next pass, never the other way).
	queued := s.cfg.State.QueuedRuns()
	s.cfg.Admission.PassEnded(room-planned <= 0 && queued > 0, max(0, queued-planned))
}

// assignAll assigns runs together: the assigns share one log message (each judged on its
// own) and the tasks are published without waiting for each ack in turn.
func (t *termServices) assignAll(ctx context.Context, runs []*checkpoint.Run) {
	s := t.s
	assigns := make([]checkpoint.Entry, len(runs))
	for i, r := range runs {
		assigns[i] = AssignEntry(r.ID, r.Epoch, "")
	}
	// Counted as admitted until applied: the state counts them from then on.
	defer s.cfg.Admission.Writing(len(runs))()
	written := t.write(ctx, assigns...)
	if written == nil {
		return
	}
	defer func() {
		if seq := written.Seq(); seq > t.wrote {
			t.wrote = seq
		}
	}()
	var acks []port.Ack
	for i, err := range written.Results(ctx) {
		if err != nil {
			t.assignFailed(runs[i].ID, err)
			continue
		}
		t.traceAssign(runs[i], int64(written.Seq()), runs[i].Epoch, "", s.clock.Now())
		if f, err := s.cfg.Tasks.PublishAsync(tasks.Task{Run: runs[i].ID, Epoch: int64(written.Seq())}); err == nil {
			acks = append(acks, f)
		} else {
			s.log.Warn("task not queued; reconcile will retry", "run", runs[i].ID, "err", err)
		}
	}
	for _, f := range acks {
		if err := f.Wait(ctx); ctx.Err() != nil {
			return
		} else if err != nil {
			s.log.Warn("task not queued; reconcile will retry", "err", err)
		}
	}
}

func (t *termServices) assignFailed(run string, err error) {
	switch {
	case errors.Is(err, checkpoint.ErrDeadLettered):
		t.s.log.Warn("run dead-lettered: max_epochs exceeded", "run", run, "term", t.term.Term())
		if r, err := t.s.cfg.State.Run(run); err == nil {
			traceDeadLetter(r)
		}
		t.announceDeadLetter(run)
	case errors.Is(err, checkpoint.ErrConflict):
		// someone moved it on meanwhile
	default:
		t.s.log.Warn("assign failed", "run", run, "term", t.term.Term(), "err", err)
	}
}

// announceDeadLetter publishes a dead-lettered run on the DLQ stream (idempotent).
func (t *termServices) announceDeadLetter(run string) {
	r, err := t.s.cfg.State.Run(run)
	if err != nil || r.Status != checkpoint.StatusDeadLettered {
		return
	}
	owner := ""
	for i := len(r.Epochs) - 1; i >= 0 && owner == ""; i-- {
		owner = r.Epochs[i].Owner
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.s.cfg.DeadLetters(ctx, dlq.Message{Run: r.ID, Workflow: r.Workflow, Epoch: r.Epoch, EpochChanges: r.EpochChanges,
		MaxEpochs: r.MaxEpochs, Reason: r.DeadLetter, LastOwner: owner, At: r.UpdatedAt.UTC().Format(time.RFC3339)}); err != nil {
		t.s.log.Warn("DLQ notice not published; the next reconcile retries", "run", run, "err", err)
	}
}

// reclaim gives a new epoch to a running run whose lease for rc.Epoch ended, after the
// lock delay if one is set.
func (t *termServices) reclaim(ctx context.Context, rc Reclaim) {
	s := t.s
	r, err := s.cfg.State.Run(rc.Run)
	if s.hooks.LapseIgnoresOwner.Load() {
		rc.Owner = "" // the control: a lapse takes the epoch whoever owns it now
	}
	if err != nil || !Reclaimable(r, rc) {
		return // finished, handed back, or already moved on
	}
	due, first := t.delays.Due(rc.Run, s.clock.Now())
	if !due {
		if first {
			s.log.Info("lease ended; reclaim after the lock delay", "run", rc.Run, "epoch", rc.Epoch, "delay", s.cfg.LockDelay)
		}
		return
	}
	// The state shows the run claimed at the epoch, so the claim's lease was created
	// before this read: a live lease of the epoch now is its owner's, whatever lapsed (an
	// earlier lease of the same epoch that was never claimed, handled late; or a watch
	// that lags). The deterministic simulation found both (engine/internal/sim, seeds 192
	// and 1255 before the fix).
	if s.hooks.NoLeaseRead.Load() { // the control: the reclaim trusts what lapsed
	} else if held, ok, err := s.cfg.Leases.Holder(ctx, rc.Run); err != nil {
		s.log.Warn("reclaim: the lease could not be read; the next reconcile looks again", "run", rc.Run, "err", err)
		return
	} else if ok && held.Epoch == rc.Epoch {
		s.log.Info("reclaim: the epoch's lease is held again; no reclaim", "run", rc.Run, "epoch", rc.Epoch, "holder", held.Owner)
		return
	}
	s.log.Info("reclaiming run", "run", rc.Run, "epoch", rc.Epoch, "owner", r.Owner, "reason", rc.Reason, "term", t.term.Term())
	f := t.write(ctx, AssignEntry(rc.Run, rc.Epoch, rc.Reason))
	if f == nil {
		return
	}
	if err := f.Await(ctx); err != nil {
		t.assignFailed(rc.Run, err)
		return
	}
	t.traceAssign(r, int64(f.Seq()), rc.Epoch, rc.Reason, s.clock.Now())
	if err := s.cfg.Tasks.Publish(ctx, tasks.Task{Run: rc.Run, Epoch: int64(f.Seq())}); err != nil {
		s.log.Warn("task not queued; reconcile will retry", "run", rc.Run, "err", err)
	}
}

// reconcile carries out one Reconciler.Pass: DLQ notices again, reclaims of running runs
// without a live lease, and tasks of unclaimed epochs queued again. The task stream's
// duplicate window makes a re-queue within a minute of the last one a no-op, so this is
// for lost tasks only: a worker that meets a held lease puts its task back itself.
func (t *termServices) reconcile(ctx context.Context) {
	s := t.s
	if s.hooks.NoReconcile.Load() { // the control: lost tasks and dead owners are never found
		return
	}
	live := func(run string) (int64, bool) {
		l, ok := t.watcher.Live(run)
		return l.Epoch, ok
	}
	p, err := t.reconciler.Pass(s.cfg.State, live, s.clock.Now())
	if err != nil {
		s.log.Warn("reconcile", "err", err)
	}
	if len(p.Reclaim) > 0 && !t.watcher.Current() && !s.hooks.ReconcileOnStaleWatch.Load() {
		// A watch that lags cannot tell a lapsed lease from one it has not heard of yet: a
		// run claimed since it fell behind, whose run record has not changed for a TTL
		// (step commits do not change it), would be taken from its live owner. The
		// reclaims wait for a pass on a current watch (the supervisor replaces a silent
		// one); lapse events still reclaim meanwhile.
		s.log.Warn("reconcile: the lease watch is not current; reclaims wait", "runs", len(p.Reclaim))
		p.Reclaim = nil
	}
	for _, id := range p.Announce {
		if ctx.Err() != nil {
			return
		}
		t.announceDeadLetter(id)
	}
	for _, rc := range p.Reclaim {
		if ctx.Err() != nil {
			return
		}
		t.reclaim(ctx, rc)
	}
	for _, rq := range p.Requeue {
		if ctx.Err() != nil {
			return
		}
		_ = s.cfg.Tasks.Publish(ctx, tasks.Task{Run: rq.Run, Epoch: rq.Epoch})
	}
}

// runCron fires due ticks until ctx ends, waking at the next fire time or when the
// log changes (a workflow applied).
func (t *termServices) runCron(ctx context.Context) {
	s := t.s
	retry := backoff.Policy{Base: 500 * time.Millisecond, Cap: 30 * time.Second}
	failures := 0
	for ctx.Err() == nil {
		changed := s.cfg.State.ScheduleChanged()
		next, ok := t.cronOnce(ctx)
		wait := time.Minute
		if !next.IsZero() {
			wait = next.Sub(s.clock.Now())
		}
		// A tick that could not be recorded (the log unreachable) wakes nothing: the
		// planner retries on its own, with backoff, rather than at the next fire time.
		if ok {
			failures = 0
		} else {
			wait = min(wait, retry.Ceiling(failures))
			failures++
		}
		timer := s.clock.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
		case <-timer.Chan():
		case <-changed:
		}
		timer.Stop()
	}
}

// cronOnce records every due tick and returns the next fire time, and false if a tick
// could not be recorded (the planner then retries soon instead of at the next fire time).
func (t *termServices) cronOnce(ctx context.Context) (time.Time, bool) {
	s := t.s
	now := s.clock.Now()
	var st State = s.cfg.State
	if s.hooks.IgnorePause.Load() {
		st = ignorePause{st} // the control: a pause changes nothing
	}
	plans, next, err := CronDue(st, s.cfg.Specs, now)
	if err != nil {
		s.log.Warn("cron", "err", err)
		return next, false
	}
	ok := true
	for _, p := range plans {
		entries, warn := PlanTicks(p, now, s.cfg.CronGrace, WorkflowActive(s.cfg.State, p.Workflow.Name))
		if warn != nil {
			s.log.Warn("cron: a tick cannot fire", "workflow", p.Workflow.Name, "err", warn)
		}
		for _, e := range entries {
			if e.Submit != nil {
				e.Submit.KeyScheme = checkpoint.KeySchemeFor(s.cfg.State.ClusterVersion())
			}
			// One message per tick, in order: a tick's outcome follows the one before.
			f := t.write(ctx, e)
			if f == nil {
				return next, false
			}
			if err := f.Await(ctx); err != nil && !errors.Is(err, checkpoint.ErrTickExists) {
				s.log.Warn("cron tick not recorded; retrying", "workflow", e.Tick.Workflow, "tick", e.Tick.At, "err", err)
				ok = false
				break
			}
			s.log.Info("cron tick", "workflow", e.Tick.Workflow, "tick", e.Tick.At, "outcome", e.Tick.Outcome, "run", e.Run, "term", t.term.Term())
		}
	}
	return next, ok
}

// runSnapshots is the leader's snapshot duty: every SnapshotEvery applied messages it
// takes a snapshot and compacts the log; between snapshots it compacts again as the
// nodes' reports move (a node that was behind caught up), until ctx (the term) ends.
func (t *termServices) runSnapshots(ctx context.Context) {
	s := t.s
	last := uint64(0)
	if snaps, err := s.cfg.Snapshots.List(ctx); err == nil && len(snaps) > 0 {
		last = snaps[len(snaps)-1].Seq
	}
	tick := s.clock.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		changed := s.cfg.Log.Changed()
		if SnapshotDue(s.cfg.State.Applied(), last, s.cfg.SnapshotEvery) {
			snap, err := s.cfg.Snapshots.Take(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.log.Error("snapshot failed; trying again in a minute", "err", err)
				pause := s.clock.NewTimer(time.Minute) // so that a failing snapshot is not retried on every message
				select {
				case <-ctx.Done():
					pause.Stop()
					return
				case <-pause.Chan():
				}
				continue
			}
			last = snap.Seq
			t.compact(ctx, last)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.Chan():
			if last > 0 {
				t.compact(ctx, last)
			}
		}
	}
}

// compact purges the log below KeepFrom: never what a live node still needs, never
// past the newest snapshot.
func (t *termServices) compact(ctx context.Context, snapshotSeq uint64) {
	s := t.s
	fail := func(err error) {
		if ctx.Err() == nil {
			s.log.Error("compaction failed; trying again later", "err", err)
		}
	}
	low, anyLive, err := s.cfg.Compactor.LiveApplied(ctx)
	if err != nil {
		fail(err)
		return
	}
	if s.hooks.CompactPastLive.Load() { // the control: as if no other node were live
		anyLive = false
	}
	keep := KeepFrom(snapshotSeq, low, anyLive, s.cfg.State.Applied())
	first, err := s.cfg.Compactor.FirstSeq(ctx)
	if err != nil {
		fail(err)
		return
	}
	if keep <= first {
		return
	}
	if err := s.cfg.Compactor.Purge(ctx, keep); err != nil {
		fail(err)
		return
	}
	s.log.Info("log compacted", "first_seq", keep, "snapshot_seq", snapshotSeq)
}

// runRetention is the leader's retention duty: it writes, through the log, a retire
// entry for every run that ended longer than Retention ago, so that every node removes
// the same runs with their history.
func (t *termServices) runRetention(ctx context.Context) {
	tick := t.s.clock.NewTicker(RetentionEvery(t.s.cfg.Retention))
	defer tick.Stop()
	for {
		for t.retireOnce(ctx) == RetireBatch { // a full pass: there may be more now
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.Chan():
		}
	}
}

// retireOnce retires up to RetireBatch runs whose end is older than the retention and
// returns how many it asked to retire.
func (t *termServices) retireOnce(ctx context.Context) int {
	s := t.s
	cutoff := s.clock.Now().Add(-s.cfg.Retention)
	entries, err := RetireDue(s.cfg.State, cutoff, RetireBatch)
	if err != nil {
		s.log.Error("retention: list ended runs", "err", err)
	}
	asked := len(entries)
	for len(entries) > 0 && ctx.Err() == nil {
		n := min(len(entries), logstream.DefaultMaxBatchEntries)
		f := t.write(ctx, entries[:n]...)
		if f == nil {
			return 0
		}
		if err := f.Await(ctx); err != nil && !errors.Is(err, checkpoint.ErrConflict) && !errors.Is(err, checkpoint.ErrNotFound) {
			s.log.Error("retention: retire runs", "err", err)
			return 0
		}
		if s.cfg.Retired != nil {
			runs := make([]string, 0, n)
			for _, e := range entries[:n] {
				runs = append(runs, e.Run)
			}
			s.cfg.Retired(ctx, runs)
		}
		entries = entries[n:]
	}
	if asked > 0 {
		s.log.Info("retention: retired runs that ended before the cutoff", "runs", asked, "cutoff", cutoff)
	}
	return asked
}

// ignorePause is a State that says no schedule was ever paused (Hooks.IgnorePause).
type ignorePause struct{ State }

func (ignorePause) Schedule(string) (*checkpoint.ScheduleState, error) { return nil, nil }
