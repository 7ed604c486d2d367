package checkpoint

import (
	"cmp"
	"errors"
	"slices"
	"sync"
)

// runQueue is what the scheduler's admission needs of the state, kept in memory by the
// applier after each commit (noteUnassigned) and rebuilt at open:
//
//   - the runs that need an assign (Run.NeedsAssign), in submission order (CreatedSeq),
//     so that the leader assigns the oldest first and stops after a few, whatever the
//     backlog: a million pending runs cost a pass nothing;
//   - the runs that hold an epoch and are not terminal: pending with a usable epoch
//     (assigned, waiting for a worker) or running. Their number is what the leader's
//     admission bounds (docs/operations.md).
//
// Deleting from the middle of the ordered slice would cost a copy of it per assign, so
// assigned runs only leave the map; their slice entries are skipped and dropped from
// the head as the head moves, and the slice is compacted once most of it is stale.
type runQueue struct {
	mu    sync.Mutex
	seq   map[string]uint64 // queued run -> its CreatedSeq
	order []queued          // sorted by (seq, id); entries absent from seq are stale
	stale int               // entries of order absent from seq
	held  map[string]heldRun
	// assigned and running count held's two kinds: the scheduler asks after every
	// applied message.
	assigned, running int
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
	q.seq = map[string]uint64{}
	q.held = map[string]heldRun{}
}

// note records r's state after a change.
func (q *runQueue) note(r *Run) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if h, ok := q.held[r.ID]; ok {
		q.count(h, -1)
		delete(q.held, r.ID)
	}
	switch {
	case r.Status == StatusRunning:
		q.held[r.ID] = heldRun{workflow: r.Workflow, running: true}
		q.count(q.held[r.ID], 1)
	case r.Status == StatusPending && !r.NeedsAssign():
		q.held[r.ID] = heldRun{workflow: r.Workflow}
		q.count(q.held[r.ID], 1)
	}
	if !r.NeedsAssign() {
		if _, ok := q.seq[r.ID]; ok {
			delete(q.seq, r.ID)
			q.stale++
			q.compact()
		}
		return
	}
	if s, ok := q.seq[r.ID]; ok && s == r.CreatedSeq {
		return
	}
	if _, ok := q.seq[r.ID]; ok { // cannot happen (CreatedSeq never changes); stay correct anyway
		q.stale++
	}
	q.seq[r.ID] = r.CreatedSeq
	e := queued{r.CreatedSeq, r.ID}
	// New submits come in log order and append; a run handed back or retried goes back
	// to its place among the older ones.
	if n := len(q.order); n == 0 || cmpQueued(q.order[n-1], e) < 0 {
		q.order = append(q.order, e)
		return
	}
	i, found := slices.BinarySearchFunc(q.order, e, cmpQueued)
	if found { // its stale entry of an earlier wait: live again
		q.stale--
		return
	}
	q.order = slices.Insert(q.order, i, e)
}

func (q *runQueue) count(h heldRun, d int) {
	if h.running {
		q.running += d
	} else {
		q.assigned += d
	}
}

// live reports whether an entry of order is a queued run (lock held).
func (q *runQueue) live(e queued) bool {
	s, ok := q.seq[e.id]
	return ok && s == e.seq
}

// compact drops stale entries at the head, and all of them once they are most of the
// slice (lock held).
func (q *runQueue) compact() {
	i := 0
	for i < len(q.order) && !q.live(q.order[i]) {
		i++
	}
	if i > 0 {
		q.order = q.order[i:]
		q.stale -= i
	}
	if q.stale > 1024 && q.stale > len(q.order)/2 {
		out := make([]queued, 0, len(q.seq))
		for _, e := range q.order {
			if q.live(e) {
				out = append(out, e)
			}
		}
		q.order, q.stale = out, 0
	}
}

// page returns up to n queued run IDs after the entry after (nil: from the start), in
// submission order, and the last entry returned.
func (q *runQueue) page(after *queued, n int) ([]string, queued) {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := 0
	if after != nil {
		i, _ = slices.BinarySearchFunc(q.order, *after, cmpQueued)
		if i < len(q.order) && cmpQueued(q.order[i], *after) == 0 {
			i++
		}
	}
	var ids []string
	var last queued
	for ; i < len(q.order) && len(ids) < n; i++ {
		if e := q.order[i]; q.live(e) {
			ids = append(ids, e.id)
			last = e
		}
	}
	return ids, last
}

// EachQueued calls fn for each run that needs an assign (Run.NeedsAssign), oldest
// submission (CreatedSeq) first, until fn returns false. It reads only as many runs as
// fn asks for, however many are pending.
func (s *Store) EachQueued(fn func(*Run) bool) error {
	var after *queued
	for {
		ids, last := s.queue.page(after, 64)
		if len(ids) == 0 {
			return nil
		}
		for _, id := range ids {
			r, err := s.Run(id)
			if err != nil {
				if errors.Is(err, ErrNotFound) {
					continue
				}
				return err
			}
			if !r.NeedsAssign() { // assigned since the IDs were taken
				continue
			}
			if !fn(r) {
				return nil
			}
		}
		after = &last
	}
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
// with a usable epoch), in no particular order.
func (s *Store) AssignedRuns() []string {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	var ids []string
	for id, h := range s.queue.held {
		if !h.running {
			ids = append(ids, id)
		}
	}
	return ids
}
