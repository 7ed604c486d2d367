package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/leader"
	"github.com/flowrun/flow/engine/internal/specs"
	"github.com/flowrun/flow/logstream"
)

// A node is one flowd: its Pebble store (which a kill keeps), and the in-memory parts
// a kill loses: the applier, the log writer, the leader role and the worker pool. Its
// events carry its incarnation, so that a killed node's timers and answers are dropped,
// and are held while it is paused (SIGSTOP): on resume they run late, at the time of
// the resume, as a stopped process's timers do.

const (
	pollWait        = 500 * time.Millisecond          // a long poll's wait on the server
	publishAttempt  = 300 * time.Millisecond          // one publish attempt's wait for its ack
	publishTimeout  = logstream.DefaultPublishTimeout // a write's publish gives up then: outcome unknown
	awaitTimeout    = 5 * time.Second                 // a write's wait for its own node's apply
	maxBatchEntries = logstream.DefaultMaxBatchEntries
)

// errUncertain: the write's outcome is unknown (logstream.ErrAppendUncertain).
var errUncertain = logstream.ErrAppendUncertain

type node struct {
	s    *Sim
	id   int
	name string
	fs   vfs.FS
	inc  int // incarnation: a restart makes a new one

	alive, paused bool
	partitioned   bool
	held          []*event // events that came while paused

	// in memory: lost by a kill
	store    *checkpoint.Store
	specs    *specs.Cache
	pending  map[uint64]func(any, error) // requests awaiting an answer
	reqSeq   uint64
	verdicts map[uint64][]error // what this incarnation applied, by sequence
	waiters  map[uint64][]func([]error)
	changed  []func() // called once after the next applied message
	fetching bool
	writer   *writer
	lead     *leaderRole
	pool     *pool
}

func newNode(s *Sim, i int) *node {
	return &node{s: s, id: i, name: fmt.Sprintf("n%d", i+1), fs: vfs.NewMem()}
}

// boot starts an incarnation: the store is opened (replaying nothing: Pebble kept what
// it applied), and the applier, writer, election and workers start.
func (n *node) boot() error {
	n.inc++
	st, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: n.fs, Hooks: n.s.cfg.Switches.Hooks,
		OnStatus: func(run string, status checkpoint.RunStatus) {
			if n.pool != nil {
				n.pool.runEnded(run, status)
			}
		}})
	if err != nil {
		return fmt.Errorf("%s: open store: %w", n.name, err)
	}
	n.store, n.specs = st, specs.New(st)
	n.alive, n.paused, n.held = true, false, nil
	n.pending, n.verdicts, n.waiters, n.changed = map[uint64]func(any, error){}, map[uint64][]error{}, map[uint64][]func([]error){}, nil
	n.fetching = false
	n.writer = &writer{n: n}
	n.lead = newLeaderRole(n)
	n.pool = newPool(n)
	n.s.tracef(n.name, "boot (incarnation %d, applied %d)", n.inc, st.Applied())
	n.pollLog()
	n.lead.campaign()
	n.pool.start()
	return nil
}

func (n *node) closeStore() {
	if n.store != nil {
		_ = n.store.Close()
		n.store = nil
	}
}

// kill ends the incarnation at once: its timers, requests, leases and step processes
// die with it (the kernel kills a dead flowd's step processes); its store stays.
func (n *node) kill() {
	if !n.alive {
		return
	}
	n.s.tracef(n.name, "KILL")
	n.s.stats.Kills++
	n.pool.killAll()
	n.alive, n.paused, n.held = false, false, nil
	n.inc++ // everything scheduled so far is dropped
	n.closeStore()
	n.lead, n.pool, n.writer = nil, nil, nil
}

// drain stops the node cleanly (SIGTERM): its runs are handed back, its term resigned,
// then it stops; restart brings it back.
func (n *node) drain() {
	if !n.alive || n.pool.stopping {
		return
	}
	n.s.tracef(n.name, "DRAIN")
	n.s.stats.Drains++
	n.pool.drain(func() {
		if n.lead.term != nil {
			n.lead.stepDown(n.lead.term)
		}
		n.s.tracef(n.name, "stopped after the drain")
		n.alive = false
		n.inc++
		n.closeStore()
		n.lead, n.pool, n.writer = nil, nil, nil
	})
}

func (n *node) restart() {
	if n.alive {
		return
	}
	if err := n.boot(); err != nil {
		n.s.fail("sim", "%v", err)
	}
}

func (n *node) pause() {
	if !n.alive || n.paused {
		return
	}
	n.s.tracef(n.name, "PAUSE")
	n.s.stats.Pauses++
	n.paused = true
}

// resume runs what came while paused, at the time of the resume, in the order it came.
func (n *node) resume() {
	if !n.alive || !n.paused {
		return
	}
	n.s.tracef(n.name, "RESUME (%d held events)", len(n.held))
	n.paused = false
	held := n.held
	n.held = nil
	for _, e := range held {
		e.at = n.s.now
		n.s.push(e)
	}
}

// on schedules fn as this incarnation's event after d.
func (n *node) on(d time.Duration, fn func()) {
	n.s.push(&event{at: n.s.now.Add(d), node: n, inc: n.inc, fn: fn})
}

// onProc schedules fn as a step process's event: a pause does not hold it, a kill drops it.
func (n *node) onProc(at time.Time, fn func()) {
	n.s.push(&event{at: at, node: n, inc: n.inc, proc: true, fn: fn})
}

// call sends a request to the server over this node's link. handle runs on the server
// when (if) it arrives, and answers through reply, at once or later (a long poll); the
// answer travels back over the link. done gets the answer, or errTimeout once timeout
// passed without one: then the request may or may not have been carried out.
func (n *node) call(timeout time.Duration, handle func(reply func(any)), done func(v any, err error)) {
	n.reqSeq++
	id := n.reqSeq
	n.pending[id] = done
	n.on(timeout, func() {
		if cb, ok := n.pending[id]; ok {
			delete(n.pending, id)
			cb(nil, errTimeout)
		}
	})
	s := n.s
	inc := n.inc
	if !s.link(n) {
		return
	}
	s.after(s.delay(), func() {
		if !s.linkUp(n) || n.inc != inc {
			s.stats.Lost++
			return
		}
		once := false
		handle(func(v any) {
			if once {
				return
			}
			once = true
			if !s.link(n) {
				return
			}
			n.s.push(&event{at: s.now.Add(s.delay()), node: n, inc: inc, fn: func() {
				if !s.linkUp(n) {
					s.stats.Lost++
					return
				}
				if cb, ok := n.pending[id]; ok {
					delete(n.pending, id)
					cb(v, nil)
				}
			}})
		})
	})
}

// pollLog is the applier's consumer: it asks for the messages after the applied one and
// applies them in order, and asks again.
func (n *node) pollLog() {
	if n.fetching {
		return
	}
	n.fetching = true
	from := n.store.Applied() + 1
	srv := n.s.srv
	n.call(pollWait+time.Second, func(reply func(any)) {
		srv.fetchLog(from, 64, pollWait, reply)
	}, func(v any, err error) {
		n.fetching = false
		if err == nil {
			for _, m := range v.([]logMsg) {
				n.apply(m.seq, m.data)
			}
		}
		n.pollLog()
	})
}

// apply applies message seq if it is the next one, compares its verdicts with the
// reference's (invariant 9), and tells whoever waits for it.
func (n *node) apply(seq uint64, data []byte) {
	if seq != n.store.Applied()+1 {
		return
	}
	verdicts, err := n.store.Apply(seq, data)
	if err != nil {
		n.s.fail("9", "%s cannot apply message %d: %v", n.name, seq, err)
		return
	}
	ref := n.s.refVerd[seq]
	if len(ref) != len(verdicts) {
		n.s.fail("9", "%s: message %d has %d verdicts here, %d in the reference", n.name, seq, len(verdicts), len(ref))
		return
	}
	for i, v := range verdicts {
		if verdictText(v) != ref[i] {
			n.s.fail("9", "%s: message %d entry %d: %q here, %q in the reference", n.name, seq, i, verdictText(v), ref[i])
			return
		}
	}
	n.verdicts[seq] = verdicts
	for _, w := range n.waiters[seq] {
		w(verdicts)
	}
	delete(n.waiters, seq)
	changed := n.changed
	n.changed = nil
	for _, fn := range changed {
		fn()
	}
	if n.lead != nil && n.lead.svc != nil {
		n.lead.svc.scheduleChanged()
	}
}

// onChange calls fn once, after the next message this node applies.
func (n *node) onChange(fn func()) { n.changed = append(n.changed, fn) }

// awaitApplied calls fn with message seq's verdicts once this node applied it.
func (n *node) awaitApplied(seq uint64, fn func([]error)) {
	if v, ok := n.verdicts[seq]; ok {
		fn(v)
		return
	}
	if seq <= n.store.Applied() {
		// Applied by an earlier incarnation: its verdicts are not in memory (never
		// happens to a write of this incarnation, which starts after the boot).
		fn(nil)
		return
	}
	n.waiters[seq] = append(n.waiters[seq], fn)
}

// writer is the node's log writer (logstream.Writer): writes queue, one publish is in
// flight at a time and carries everything queued (group commit), a publish is retried
// with the same message ID until publishTimeout, and a write's outcome is its entries'
// verdicts once this node applied the message.
type writer struct {
	n        *node
	queue    []*write
	inFlight bool
	count    int
}

type write struct {
	entries []checkpoint.Entry
	done    func(uint64, []error) // nil: a note (no one waits)
	assigns []string
}

// write queues entries as one write; done gets the message's sequence and one outcome
// per entry: nil, the verdict, or errUncertain (and sequence 0).
func (n *node) write(entries []checkpoint.Entry, done func(seq uint64, errs []error)) {
	w := &write{entries: entries, done: done}
	for i := range entries {
		entries[i].At = n.s.now
		if entries[i].Kind == checkpoint.KindAssign {
			w.assigns = append(w.assigns, entries[i].Run)
		}
	}
	n.writer.queue = append(n.writer.queue, w)
	n.writer.flush()
}

// flush publishes what is queued, if nothing is in flight.
func (wr *writer) flush() {
	if wr.inFlight || len(wr.queue) == 0 {
		return
	}
	n := wr.n
	var batch []*write
	var entries []checkpoint.Entry
	assigned := map[string]bool{}
	for len(wr.queue) > 0 {
		w := wr.queue[0]
		if len(batch) > 0 && len(entries)+len(w.entries) > maxBatchEntries {
			break
		}
		clash := false
		for _, r := range w.assigns {
			clash = clash || assigned[r]
		}
		if clash && len(batch) > 0 {
			break // two assigns of one run in one message would share an epoch
		}
		for _, r := range w.assigns {
			assigned[r] = true
		}
		batch = append(batch, w)
		entries = append(entries, w.entries...)
		wr.queue = wr.queue[1:]
	}
	data, err := checkpoint.EncodeMessage(n.name, entries...)
	if err != nil {
		n.s.fail("sim", "%s: encode: %v", n.name, err)
		return
	}
	wr.count++
	msgID := fmt.Sprintf("%s.%d.%d", n.name, n.inc, wr.count)
	wr.inFlight = true
	start := n.s.now
	srv := n.s.srv
	var attempt func(int)
	settle := func(seq uint64, errs []error) {
		off := 0
		for _, w := range batch {
			if w.done != nil {
				part := make([]error, len(w.entries))
				if errs == nil {
					seq = 0
					for i := range part {
						part[i] = errUncertain
					}
				} else {
					copy(part, errs[off:off+len(w.entries)])
				}
				w.done(seq, part)
			}
			off += len(w.entries)
		}
	}
	attempt = func(i int) {
		n.call(publishAttempt, func(reply func(any)) {
			seq, dup := srv.publish(n.name, msgID, data)
			reply(pubAck{seq: seq, dup: dup})
		}, func(v any, err error) {
			if err != nil {
				if n.s.now.Sub(start) >= publishTimeout {
					n.s.tracef(n.name, "publish %s: outcome unknown", msgID)
					wr.inFlight = false
					settle(0, nil)
					wr.flush()
					return
				}
				n.on(backoffDelay(n.s, i, 20*time.Millisecond, time.Second), func() { attempt(i + 1) })
				return
			}
			ack := v.(pubAck)
			wr.inFlight = false
			// The writer applies its own message from memory when it is the next one;
			// the consumer does otherwise.
			if ack.seq == n.store.Applied()+1 {
				n.apply(ack.seq, data)
			}
			n.on(awaitTimeout, func() {
				if _, ok := n.waiters[ack.seq]; ok {
					delete(n.waiters, ack.seq)
					settle(0, nil)
				}
			})
			n.awaitApplied(ack.seq, func(v []error) { settle(ack.seq, v) })
			wr.flush()
		})
	}
	attempt(0)
}

type pubAck struct {
	seq uint64
	dup bool
}

// backoffDelay is a capped exponential backoff with full jitter from the seed's
// generator (internal/backoff's policy).
func backoffDelay(s *Sim, attempt int, base, ceiling time.Duration) time.Duration {
	d := base << min(attempt, 16)
	if d > ceiling || d <= 0 {
		d = ceiling
	}
	return time.Duration(s.rng.Int64N(int64(d)) + 1)
}

// isUnknown tells a write that reached no verdict.
func isUnknown(err error) bool { return errors.Is(err, errUncertain) }

// room is the node's admission (leader.Admission) for its leader role.
func (n *node) newAdmission() *leader.Admission { return leader.NewAdmission(n.s.cfg.QueueAhead, nil) }
