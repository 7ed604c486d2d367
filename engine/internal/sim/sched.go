package sim

import (
	"cmp"
	"container/heap"
	"slices"
	"sync"
	"testing/synctest"
	"time"
)

// The scheduler. The cluster's goroutines (the real engines' services, the step
// processes' stand-ins, the client's calls) run inside one synctest bubble with the
// simulation's own goroutine, the loop. They reach the simulated world only by
// submitting what they want to it (submit: a port call, a clock timer that fired, a
// process to start, a client's outcome) and blocking until it answers. The loop waits
// until every other goroutine of the bubble is durably blocked (synctest.Wait), takes
// what was submitted meanwhile, sorts it by what it is (not by which goroutine got there
// first), and handles it; then it runs the next event of its queue, whose time is the
// bubble's: it sleeps until then, so the time every goroutine reads (time.Now, the
// engines' clocks, their contexts' deadlines) is the simulation's.
//
// Every random choice is the loop's, from one generator seeded by the seed, made in
// that sorted order: what the goroutines did between two quiet moments is a set, and
// the loop's answers do not depend on how the Go scheduler interleaved them.

// event is something that happens at a time on the loop: a message arriving, a reply
// delivered, a fault, a process acting.
type event struct {
	at  time.Time
	seq uint64 // insertion order breaks ties: the order is total
	fn  func()
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return e
}

// maxSpins bounds the rounds of submissions at one moment: past it the cluster spins
// (something answers itself at once, forever).
const maxSpins = 20000

// submission is what a goroutine of the cluster hands the loop.
type submission struct {
	at   time.Time // when it was submitted (the bubble's time)
	node string    // whose ("" for the world's)
	key  string    // what it is: the order within a quiet moment
	fn   func()    // what the loop does with it
	// alone: what fn wakes runs until it is quiet again before the next submission is
	// handled (writers let into the log's writer one at a time).
	alone bool
}

// inbox is where goroutines leave submissions; the loop takes them.
type inbox struct {
	mu   sync.Mutex
	subs []submission
	kick chan struct{} // cap 1: wakes the loop from its sleep
}

// submit hands fn to the loop, keyed by what it is (node, key). Safe from any goroutine
// of the bubble.
func (s *Sim) submit(node, key string, fn func()) {
	s.submitSub(submission{node: node, key: key, fn: fn})
}

// submitAlone is submit for a submission whose handling wakes a goroutine that must run
// alone until it blocks again (submission.alone).
func (s *Sim) submitAlone(node, key string, fn func()) {
	s.submitSub(submission{node: node, key: key, fn: fn, alone: true})
}

func (s *Sim) submitSub(sub submission) {
	sub.at = time.Now()
	s.in.mu.Lock()
	s.in.subs = append(s.in.subs, sub)
	s.in.mu.Unlock()
	select {
	case s.in.kick <- struct{}{}:
	default:
	}
}

// collect handles what was submitted since the last quiet moment, in the order of
// (time, node, key): the same set gives the same order, however it arrived. It reports
// whether there was anything.
func (s *Sim) collect() bool {
	select { // a kick for what is taken now
	case <-s.in.kick:
	default:
	}
	s.in.mu.Lock()
	subs := s.in.subs
	s.in.subs = nil
	s.in.mu.Unlock()
	if len(subs) == 0 {
		return false
	}
	slices.SortStableFunc(subs, func(a, b submission) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		if c := cmp.Compare(a.node, b.node); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
	if s.now.Equal(s.spinAt) {
		if s.spins++; s.spins > maxSpins {
			keys := make([]string, 0, min(len(subs), 8))
			for _, sub := range subs[:min(len(subs), 8)] {
				keys = append(keys, sub.node+" "+sub.key)
			}
			s.fail("sim", "more than %d rounds at %s without time moving (a spin): the last ones were %v", maxSpins, s.now.Sub(T0), keys)
			return false
		}
	} else {
		s.spinAt, s.spins = s.now, 0
	}
	for _, sub := range subs {
		s.now = time.Now()
		if s.traceCalls {
			s.tracef("sub", "%s %s", sub.node, sub.key)
		}
		sub.fn()
		if sub.alone {
			synctest.Wait()
		}
	}
	return true
}

// at schedules fn at t (not before now) on the loop.
func (s *Sim) at(t time.Time, fn func()) {
	if t.Before(s.now) {
		t = s.now
	}
	s.qseq++
	heap.Push(&s.q, &event{at: t, seq: s.qseq, fn: fn})
}

func (s *Sim) after(d time.Duration, fn func()) { s.at(s.now.Add(d), fn) }

// loop runs the simulation until it finishes, fails or stalls. It runs in the bubble.
func (s *Sim) loop() {
	for s.failure == nil && !s.finished {
		synctest.Wait()
		s.now = time.Now()
		if s.collect() {
			continue // what the handling started may submit more at this same moment
		}
		if len(s.q) == 0 {
			s.fail("sim", "no events left and nothing submitted: the simulation stalled")
			return
		}
		next := s.q[0]
		if wait := next.at.Sub(s.now); wait > 0 {
			// Sleep until the next event, or until a goroutine submits something because
			// a timer of its own (a context's deadline) fired first.
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-s.in.kick:
			}
			t.Stop()
			continue
		}
		heap.Pop(&s.q)
		s.steps++
		if s.steps > maxEvents {
			s.fail("sim", "more than %d events: a loop in the simulation (at %s)", maxEvents, s.now.Sub(T0))
			return
		}
		next.fn()
	}
}

// serve handles what one node's ports ask of the server until done is closed, with no
// workload and no faults: the conformance suite's loop (TestServerConforms), in the
// caller's bubble.
func (s *Sim) serve(done <-chan struct{}) {
	for {
		synctest.Wait()
		s.now = time.Now()
		if s.collect() {
			continue
		}
		if len(s.q) > 0 && !s.q[0].at.After(s.now) {
			next := heap.Pop(&s.q).(*event)
			next.fn()
			continue
		}
		var due <-chan time.Time
		if len(s.q) > 0 {
			t := time.NewTimer(s.q[0].at.Sub(s.now))
			defer t.Stop()
			due = t.C
		}
		select {
		case <-due:
		case <-s.in.kick:
		case <-done:
			return
		}
	}
}
