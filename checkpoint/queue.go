package checkpoint

import (
	"cmp"
	"container/heap"
	"errors"
	"slices"
	"sync"
)

// runQueue is what the scheduler's admission needs of the state, kept in memory by the
// applier after each commit (noteQueue) and rebuilt at open:
//
//   - the runs that need an assign (Run.NeedsAssign), in submission order (CreatedSeq)
//     per workflow, so that the leader assigns the oldest first and stops after a few,
//     whatever the backlog: a million pending runs cost a pass nothing; and a workflow
//     whose concurrency limit holds its runs back is passed over in one step, not run by
//     run (EachQueued);
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
	lines map[string]*line     // per workflow: its queued runs in order
	held  map[string]heldRun
	// parked are the runs parked in a wait (StatusWaiting), by workflow: they hold no
	// epoch, but they hold their concurrency keys' slots (KeyHolders).
	parked map[string]string
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
}

// line is one workflow's queued runs, sorted by (seq, id); entries absent from the
// queue's seq map (or there with another workflow or seq) are stale.
type line struct {
	order []queued
	stale int
}

type queued struct {
	seq uint64
	id  string
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
	q.lines = map[string]*line{}
	q.held = map[string]heldRun{}
	q.parked = map[string]string{}
}

// note records r's state after a change.
func (q *runQueue) note(r *Run) {
	q.mu.Lock()
	defer q.mu.Unlock()
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
	at := queuedRun{r.CreatedSeq, r.Workflow}
	old, waiting := q.seq[r.ID]
	if waiting && (!r.NeedsAssign() || old != at) { // leaves its line (old != at cannot happen: a run's workflow and CreatedSeq never change; stay correct anyway)
		delete(q.seq, r.ID)
		l := q.lines[old.workflow]
		l.stale++
		q.compact(old.workflow, l)
		waiting = false
	}
	if !r.NeedsAssign() || waiting {
		return
	}
	q.seq[r.ID] = at
	l := q.lines[r.Workflow]
	if l == nil {
		l = &line{}
		q.lines[r.Workflow] = l
	}
	e := queued{r.CreatedSeq, r.ID}
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

// live reports whether an entry of workflow's line is a queued run (lock held).
func (q *runQueue) live(workflow string, e queued) bool {
	at, ok := q.seq[e.id]
	return ok && at == queuedRun{e.seq, workflow}
}

// compact drops stale entries at the head of a line, and all of them once they are
// most of it; an empty line is forgotten (lock held).
func (q *runQueue) compact(workflow string, l *line) {
	i := 0
	for i < len(l.order) && !q.live(workflow, l.order[i]) {
		i++
	}
	if i > 0 {
		l.order = l.order[i:]
		l.stale -= i
	}
	if len(l.order) == 0 {
		delete(q.lines, workflow)
		return
	}
	if l.stale > 1024 && l.stale > len(l.order)/2 {
		out := make([]queued, 0, len(l.order)-l.stale)
		for _, e := range l.order {
			if q.live(workflow, e) {
				out = append(out, e)
			}
		}
		l.order, l.stale = out, 0
	}
}

// next returns workflow's first queued run after the entry after (nil: from the start).
func (q *runQueue) next(workflow string, after *queued) (queued, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.lines[workflow]
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
		if e := l.order[i]; q.live(workflow, e) {
			return e, true
		}
	}
	return queued{}, false
}

// workflows returns the workflows with queued runs.
func (q *runQueue) workflows() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	names := make([]string, 0, len(q.lines))
	for name := range q.lines {
		names = append(names, name)
	}
	return names
}

// heads is a heap of each workflow's next queued run: EachQueued's merge of the lines.
type heads []head

type head struct {
	workflow string
	at       queued
}

func (h heads) Len() int           { return len(h) }
func (h heads) Less(i, j int) bool { return cmpQueued(h[i].at, h[j].at) < 0 }
func (h heads) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *heads) Push(x any)        { *h = append(*h, x.(head)) }
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

// EachQueued calls fn for each run that needs an assign (Run.NeedsAssign), oldest
// submission (CreatedSeq, then ID) first across all workflows, until fn says stop. It
// reads only the runs fn is given: as many as fn takes, plus one per workflow it skips,
// however many are pending.
func (s *Store) EachQueued(fn func(*Run) QueueVerdict) error {
	var h heads
	for _, wf := range s.queue.workflows() {
		if at, ok := s.queue.next(wf, nil); ok {
			h = append(h, head{wf, at})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		top := heap.Pop(&h).(head)
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
			continue
		}
		if at, ok := s.queue.next(top.workflow, &top.at); ok {
			heap.Push(&h, head{top.workflow, at})
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
// those holding an epoch (Held) and those parked in a wait, of the given workflows
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
