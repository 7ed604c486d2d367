package checkpoint

import (
	"cmp"
	"container/heap"
	"errors"
	"slices"
	"sync"
	"time"
)

// runQueue is what the scheduler's admission needs of the state, kept in memory by the
// applier after each commit (noteQueue) and rebuilt at open:
//
//   - the runs that need an assign (Run.NeedsAssign), in submission order (CreatedSeq)
//     per workflow and priority, so that the leader assigns the first by priority and
//     age and stops after a few, whatever the backlog: a million pending runs cost a
//     pass nothing; and a workflow whose concurrency limit holds its runs back is passed
//     over in one step per priority it uses, not run by run (EachQueued);
//   - the runs that hold an epoch and are not terminal: pending with a usable epoch
//     (assigned, waiting for a worker) or running. Their number is what the leader's
//     admission bounds (docs/operations.md).
//
// Deleting from the middle of an ordered slice would cost a copy of it per assign, so
// assigned runs only leave the map; their slice entries are skipped and dropped from
// the head as the head moves, and a line is compacted once most of it is stale.
type runQueue struct {
	mu    sync.Mutex
	seq   map[string]queuedRun // queued run -> where it waits
	lines map[lineKey]*line    // per workflow and priority: its queued runs in order
	held  map[string]heldRun
	// parked are the runs parked in a wait (StatusWaiting), by workflow: they hold no
	// epoch, but they hold their concurrency keys' slots (KeyHolders).
	parked map[string]string
	// slotted are the runs not ended that hold or drain step slots, by workflow;
	// slotWaits the runs parked for step slots (slots.go).
	slotted   map[string]slotted
	slotWaits map[string]SlotWaiter
	// released are the last runs that stopped holding (left held and parked), in apply
	// order: a ring of up to releasedCap, of which releases counts every one ever
	// (Released).
	released []string
	releases uint64
	// assigned and running count held's two kinds: the scheduler asks after every
	// applied message.
	assigned, running int
}

type queuedRun struct {
	seq      uint64
	workflow string
	priority int
}

// lineKey names a line: one workflow's queued runs of one priority.
type lineKey struct {
	workflow string
	priority int
}

// line is one workflow's queued runs of one priority, sorted by (seq, id); entries
// absent from the queue's seq map (or there with another workflow, priority or seq) are
// stale.
type line struct {
	order []queued
	stale int
}

// queued is a line's entry: the run, its submission and its creation time (UnixNano:
// its age raises its priority, EachQueuedAt).
type queued struct {
	seq     uint64
	id      string
	created int64
}

type heldRun struct {
	workflow string
	running  bool
}

func cmpQueued(a, b queued) int {
	if c := cmp.Compare(a.seq, b.seq); c != 0 {
		return c
	}
	return cmp.Compare(a.id, b.id)
}

func (q *runQueue) init() {
	q.seq = map[string]queuedRun{}
	q.lines = map[lineKey]*line{}
	q.held = map[string]heldRun{}
	q.parked = map[string]string{}
	q.slotted = map[string]slotted{}
	q.slotWaits = map[string]SlotWaiter{}
}

// note records r's state after a change.
func (q *runQueue) note(r *Run) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.noteSlots(r)
	_, wasHeld := q.held[r.ID]
	_, wasParked := q.parked[r.ID]
	defer func() {
		_, held := q.held[r.ID]
		_, parked := q.parked[r.ID]
		if (wasHeld || wasParked) && !held && !parked {
			q.release(r.ID)
		}
	}()
	if h, ok := q.held[r.ID]; ok {
		q.count(h, -1)
		delete(q.held, r.ID)
	}
	if r.Status == StatusWaiting {
		q.parked[r.ID] = r.Workflow
	} else {
		delete(q.parked, r.ID)
	}
	switch {
	case r.Status == StatusRunning:
		q.held[r.ID] = heldRun{workflow: r.Workflow, running: true}
		q.count(q.held[r.ID], 1)
	case r.Status == StatusPending && !r.NeedsAssign():
		q.held[r.ID] = heldRun{workflow: r.Workflow}
		q.count(q.held[r.ID], 1)
	}
	at := queuedRun{r.CreatedSeq, r.Workflow, r.Priority}
	old, waiting := q.seq[r.ID]
	if waiting && (!r.NeedsAssign() || old != at) { // leaves its line (old != at cannot happen: a run's workflow, priority and CreatedSeq never change; stay correct anyway)
		delete(q.seq, r.ID)
		k := lineKey{old.workflow, old.priority}
		l := q.lines[k]
		l.stale++
		q.compact(k, l)
		waiting = false
	}
	if !r.NeedsAssign() || waiting {
		return
	}
	q.seq[r.ID] = at
	k := lineKey{r.Workflow, r.Priority}
	l := q.lines[k]
	if l == nil {
		l = &line{}
		q.lines[k] = l
	}
	e := queued{r.CreatedSeq, r.ID, r.CreatedAt.UnixNano()}
	// New submits come in log order and append; a run handed back or retried goes back
	// to its place among the older ones.
	if n := len(l.order); n == 0 || cmpQueued(l.order[n-1], e) < 0 {
		l.order = append(l.order, e)
		return
	}
	i, found := slices.BinarySearchFunc(l.order, e, cmpQueued)
	if found { // its stale entry of an earlier wait: live again
		l.stale--
		return
	}
	l.order = slices.Insert(l.order, i, e)
}

func (q *runQueue) count(h heldRun, d int) {
	if h.running {
		q.running += d
	} else {
		q.assigned += d
	}
}

// live reports whether an entry of line k is a queued run (lock held).
func (q *runQueue) live(k lineKey, e queued) bool {
	at, ok := q.seq[e.id]
	return ok && at == queuedRun{e.seq, k.workflow, k.priority}
}

// compact drops stale entries at the head of a line, and all of them once they are
// most of it; an empty line is forgotten (lock held).
func (q *runQueue) compact(k lineKey, l *line) {
	i := 0
	for i < len(l.order) && !q.live(k, l.order[i]) {
		i++
	}
	if i > 0 {
		l.order = l.order[i:]
		l.stale -= i
	}
	if len(l.order) == 0 {
		delete(q.lines, k)
		return
	}
	if l.stale > 1024 && l.stale > len(l.order)/2 {
		out := make([]queued, 0, len(l.order)-l.stale)
		for _, e := range l.order {
			if q.live(k, e) {
				out = append(out, e)
			}
		}
		l.order, l.stale = out, 0
	}
}

// next returns line k's first queued run after the entry after (nil: from the start).
func (q *runQueue) next(k lineKey, after *queued) (queued, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.lines[k]
	if l == nil {
		return queued{}, false
	}
	i := 0
	if after != nil {
		i, _ = slices.BinarySearchFunc(l.order, *after, cmpQueued)
		if i < len(l.order) && cmpQueued(l.order[i], *after) == 0 {
			i++
		}
	}
	for ; i < len(l.order); i++ {
		if e := l.order[i]; q.live(k, e) {
			return e, true
		}
	}
	return queued{}, false
}

// keys returns the lines with queued runs.
func (q *runQueue) keys() []lineKey {
	q.mu.Lock()
	defer q.mu.Unlock()
	keys := make([]lineKey, 0, len(q.lines))
	for k := range q.lines {
		keys = append(keys, k)
	}
	return keys
}

// heads is a heap of each line's next queued run: EachQueuedAt's merge of the lines,
// the highest effective priority first (Effective), then the oldest submission.
type heads []head

type head struct {
	line lineKey
	at   queued
	eff  int64 // its effective priority, fixed for the walk (its now)
}

func (h heads) Len() int { return len(h) }
func (h heads) Less(i, j int) bool {
	if h[i].eff != h[j].eff {
		return h[i].eff > h[j].eff
	}
	return cmpQueued(h[i].at, h[j].at) < 0
}
func (h heads) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *heads) Push(x any)   { *h = append(*h, x.(head)) }
func (h *heads) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// QueueVerdict is what EachQueued's caller makes of a run.
type QueueVerdict int

const (
	// QueueNext goes on with the next queued run.
	QueueNext QueueVerdict = iota
	// QueueSkipWorkflow passes over the rest of this run's workflow (its concurrency
	// limit is reached: none of its later runs can be assigned either) without reading
	// them, and goes on with the other workflows.
	QueueSkipWorkflow
	// QueueStop ends the walk.
	QueueStop
)

// EachQueued calls fn for each run that needs an assign (Run.NeedsAssign), the
// highest priority first and, within a priority, the oldest submission (CreatedSeq, then
// ID) first across all workflows, until fn says stop (EachQueuedAt without aging).
func (s *Store) EachQueued(fn func(*Run) QueueVerdict) error {
	return s.EachQueuedAt(time.Time{}, 0, fn)
}

// Effective is a queued run's priority at now: its priority, raised by one for each
// aging its creation is older than now (none when aging is 0, or for a creation after
// now), so that a run of low priority waits behind runs of higher ones for at most
// aging times the difference (the leader's starvation bound: docs/workflow-spec.md,
// "Priorities"). Creation times are the submitting node's clock: a skew moves a run's
// place by as much, never its admission's rules.
func Effective(priority int, created, now time.Time, aging time.Duration) int64 {
	eff := int64(priority)
	if aging > 0 && !now.IsZero() && now.After(created) {
		eff += int64(now.Sub(created) / aging)
	}
	return eff
}

// EachQueuedAt calls fn for each run that needs an assign (Run.NeedsAssign), in order
// of effective priority at now (Effective, with aging), then of submission (CreatedSeq,
// then ID) across all workflows, until fn says stop. It reads only the runs fn is given:
// as many as fn takes, plus one per workflow and priority it skips, however many are
// pending. The order is fixed for the walk: now does not move within it.
func (s *Store) EachQueuedAt(now time.Time, aging time.Duration, fn func(*Run) QueueVerdict) error {
	var h heads
	push := func(k lineKey, at queued) {
		h = append(h, head{k, at, Effective(k.priority, time.Unix(0, at.created), now, aging)})
	}
	for _, k := range s.queue.keys() {
		if at, ok := s.queue.next(k, nil); ok {
			push(k, at)
		}
	}
	heap.Init(&h)
	skipped := map[string]bool{}
	for h.Len() > 0 {
		top := heap.Pop(&h).(head)
		if skipped[top.line.workflow] {
			continue
		}
		verdict := QueueNext
		r, err := s.Run(top.at.id)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return err
		case r.NeedsAssign(): // else assigned since its entry was read
			verdict = fn(r)
		}
		switch verdict {
		case QueueStop:
			return nil
		case QueueSkipWorkflow:
			skipped[top.line.workflow] = true
			continue
		}
		if at, ok := s.queue.next(top.line, &top.at); ok {
			eff := Effective(top.line.priority, time.Unix(0, at.created), now, aging)
			heap.Push(&h, head{top.line, at, eff})
		}
	}
	return nil
}

// QueuedRuns is how many runs need an assign.
func (s *Store) QueuedRuns() int {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	return len(s.queue.seq)
}

// Held counts the runs that hold an epoch and are not terminal: assigned and waiting
// for a worker (pending with a usable epoch), and running.
func (s *Store) Held() (assigned, running int) {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	return s.queue.assigned, s.queue.running
}

// HeldByWorkflow counts the runs holding an epoch (Held), per workflow.
func (s *Store) HeldByWorkflow() map[string]int {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	n := map[string]int{}
	for _, h := range s.queue.held {
		n[h.workflow]++
	}
	return n
}

// AssignedRuns are the IDs of the runs assigned an epoch and not yet claimed (pending
// with a usable epoch), sorted.
func (s *Store) AssignedRuns() []string {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	var ids []string
	for id, h := range s.queue.held {
		if !h.running {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids) // callers act on them in turn: the same order on every node and replay
	return ids
}

// KeyHolders are the runs that hold their concurrency keys' slots by their state, sorted:
// those holding an epoch (Held), those parked in a wait, and those woken with their
// step's slots (slots.go), of the given workflows
// (engine/internal/leader keys.go; docs/checkpoint.md "Concurrency keys"); nil: of every
// workflow.
func (s *Store) KeyHolders(workflows map[string]bool) []string {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	var ids []string
	for id, h := range s.queue.held {
		if workflows == nil || workflows[h.workflow] {
			ids = append(ids, id)
		}
	}
	for id, wf := range s.queue.parked {
		if workflows == nil || workflows[wf] {
			ids = append(ids, id)
		}
	}
	// A run woken with its step's slots (slots.go) keeps its workflow keys' slots too,
	// while it waits for its next epoch: it held them parked, and the admission takes it
	// without a key check (leader.PlanAssign). Giving them up there would let runs that
	// hold them wait for its step's slots while it waits for theirs.
	for id, rec := range s.queue.slotted {
		_, held := s.queue.held[id]
		_, parked := s.queue.parked[id]
		if rec.holds && !held && !parked && (workflows == nil || workflows[rec.workflow]) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// releasedCap is how many releases the ring keeps: a leader that falls further behind
// counts nothing until its watch catches up past the moment it noticed (Released).
const releasedCap = 1 << 14

// release records that run stopped holding (lock held).
func (q *runQueue) release(run string) {
	if len(q.released) < releasedCap {
		q.released = append(q.released, run)
	} else {
		q.released[q.releases%releasedCap] = run
	}
	q.releases++
}

// ReleaseCursor is where Released would start now: the releases counted so far.
func (s *Store) ReleaseCursor() uint64 {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	return s.queue.releases
}

// Released gives the runs that stopped holding their concurrency keys' slots (left held
// and parked: ended, requeued or handed back) since cursor (a ReleaseCursor), in apply
// order, and the cursor to ask from next time; complete is false when some of them are
// no longer kept (more than a ring's worth since cursor).
func (s *Store) Released(cursor uint64) (runs []string, next uint64, complete bool) {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	q := &s.queue
	if cursor > q.releases || q.releases-cursor > uint64(len(q.released)) {
		return nil, q.releases, false
	}
	for i := cursor; i < q.releases; i++ {
		runs = append(runs, q.released[i%releasedCap])
	}
	return runs, q.releases, true
}
