package sim

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/checkpoint/invariants"
	"github.com/flowrun/flow/engine/internal/tasks"
)

// The server is NATS JetStream as flow uses it, modelled: the log (a stream), the KV
// buckets of terms and leases (revisions from one counter per bucket, a TTL per key on
// the server's clock, lapse markers), and the task queue (a work queue with acks, naks
// and redelivery). It answers requests when they arrive; the network (net.go) carries
// them. It never fails itself: a NATS outage is a partition of every node.

// Errors of the server's answers.
var (
	errKeyExists   = errors.New("nats: key exists")
	errRevMismatch = errors.New("nats: wrong last sequence")
	errKeyNotFound = errors.New("nats: key not found")
	errTimeout     = errors.New("nats: timeout")
)

type server struct {
	s      *Sim
	log    [][]byte          // message i has sequence i+1
	from   []string          // the node that appended each message ("" for a duplicate)
	msgIDs map[string]uint64 // publish dedup: message ID -> sequence
	polls  []*poll           // consumers waiting for the log to grow
	kv     map[string]*bucket
	tasks  *taskQueue
}

// poll is a long poll parked on the server: answered when what it waits for comes, or
// with nothing at its deadline.
type poll struct {
	ready  func() bool // whether it can be answered now
	answer func()
	done   bool
}

func newServer(s *Sim) *server {
	srv := &server{s: s, msgIDs: map[string]uint64{}, kv: map[string]*bucket{}}
	srv.kv[leaderBucket] = &bucket{srv: srv, name: leaderBucket, ttl: s.cfg.TTL, keys: map[string]*kvEntry{}}
	srv.kv[leaseBucket] = &bucket{srv: srv, name: leaseBucket, ttl: s.cfg.TTL, keys: map[string]*kvEntry{}}
	srv.tasks = &taskQueue{srv: srv, ackWait: max(s.cfg.TTL, time.Second), dedup: map[string]time.Time{}}
	return srv
}

// park parks a long poll until ready or until wait passes (then answer is called anyway:
// with nothing new).
func (srv *server) park(polls *[]*poll, wait time.Duration, ready func() bool, answer func()) {
	if ready() {
		answer()
		return
	}
	p := &poll{ready: ready, answer: answer}
	*polls = append(*polls, p)
	srv.s.after(wait, func() {
		if !p.done {
			p.done = true
			p.answer()
		}
	})
}

// wake answers the parked polls that can be answered now.
func wake(polls *[]*poll) {
	keep := (*polls)[:0]
	var ready []*poll
	for _, p := range *polls {
		switch {
		case p.done:
		case p.ready():
			p.done = true
			ready = append(ready, p)
		default:
			keep = append(keep, p)
		}
	}
	*polls = keep
	for _, p := range ready {
		p.answer()
	}
}

// publish appends a log message unless its message ID was seen (a retried publish):
// the sequence, and whether it was a duplicate.
func (srv *server) publish(node, msgID string, data []byte) (uint64, bool) {
	if seq, ok := srv.msgIDs[msgID]; ok {
		return seq, true
	}
	seq := srv.append(node, data)
	srv.msgIDs[msgID] = seq
	s := srv.s
	if s.faultOn && s.cfg.DupP > 0 && s.rng.Float64() < s.cfg.DupP {
		// The message lands again later, as a message of its own: the dedup state was
		// lost (a stream leader change) or the retry came after the duplicate window.
		// Every entry must be harmless the second time.
		d := time.Duration(s.rng.Int64N(int64(3 * time.Second)))
		s.after(d, func() {
			s.stats.Dups++
			s.tracef("srv", "log: %s's message %d lands again", node, seq)
			srv.append("", data)
		})
	}
	return seq, false
}

// append adds a message to the log, applies it to the reference store and checks the
// invariants on it, and wakes the consumers.
func (srv *server) append(node string, data []byte) uint64 {
	s := srv.s
	srv.log = append(srv.log, data)
	srv.from = append(srv.from, node)
	seq := uint64(len(srv.log))
	s.stats.Messages++
	entries, derr := checkpoint.DecodeEnvelope(seq, data)
	before := invariants.ReadBefore(s.ref, entries)
	verdicts, err := s.ref.Apply(seq, data)
	if err != nil {
		s.fail("9", "the reference store cannot apply message %d: %v", seq, err)
		return seq
	}
	texts := make([]string, len(verdicts))
	for i, v := range verdicts {
		texts[i] = verdictText(v)
	}
	s.refVerd[seq] = texts
	if s.trace != nil {
		var b strings.Builder
		for i := range entries {
			if i > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%s → %s", entryText(entries[i]), checkpoint.VerdictText(s.ref, seq, entries[i], verdicts[i]))
		}
		who := node
		if who == "" {
			who = "dup"
		}
		s.tracef("log", "%d from %s: %s", seq, who, b.String())
	}
	if derr == nil {
		s.countVerdicts(entries, verdicts)
		if err := s.check.Message(s.ref, seq, before, entries, verdicts); err != nil {
			s.failErr(err)
		}
	}
	wake(&srv.polls)
	return seq
}

func (s *Sim) countVerdicts(entries []checkpoint.Entry, verdicts []error) {
	for i, e := range entries {
		v := verdicts[i]
		switch {
		case errors.Is(v, checkpoint.ErrFenced):
			s.stats.Fenced++
		case errors.Is(v, checkpoint.ErrStaleTerm):
			s.stats.Stale++
		case errors.Is(v, checkpoint.ErrDeadLettered):
			s.stats.DeadLettered++
		case v != nil:
		case e.Kind == checkpoint.KindCommit:
			s.stats.Commits++
		case e.Kind == checkpoint.KindAssign:
			s.stats.Assigns++
			if e.Reason != "" {
				s.stats.Reclaims++
			}
		case e.Kind == checkpoint.KindCronTick:
			s.stats.Ticks++
		}
	}
}

// verdictText is a verdict as nodes compare them (invariant 9).
func verdictText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// entryText is an entry for the trace.
func entryText(e checkpoint.Entry) string {
	var b strings.Builder
	b.WriteString(string(e.Kind))
	if e.Run != "" {
		b.WriteString(" " + e.Run)
	}
	if e.Step != "" {
		fmt.Fprintf(&b, "/%s", e.Step)
		if e.Item != checkpoint.ItemWhole {
			fmt.Fprintf(&b, "[%d]", e.Item)
		}
	}
	if e.Epoch != 0 {
		fmt.Fprintf(&b, " epoch=%d", e.Epoch)
	}
	if e.Term != 0 {
		fmt.Fprintf(&b, " term=%d", e.Term)
	}
	if e.Owner != "" {
		fmt.Fprintf(&b, " by=%s", e.Owner)
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, " reason=%s", e.Reason)
	}
	if e.Status != "" {
		fmt.Fprintf(&b, " status=%s", e.Status)
	}
	if e.Tick != nil {
		fmt.Fprintf(&b, " %s@%s:%s", e.Tick.Workflow, e.Tick.At.Sub(T0), e.Tick.Outcome)
	}
	return b.String()
}

// fetchLog answers a consumer's poll for the messages from sequence from on (at most
// max), at once or when the log grows, or with none after wait.
func (srv *server) fetchLog(from uint64, limit int, wait time.Duration, reply func(any)) {
	srv.park(&srv.polls, wait, func() bool { return uint64(len(srv.log)) >= from }, func() {
		var out []logMsg
		for seq := from; seq <= uint64(len(srv.log)) && len(out) < limit; seq++ {
			out = append(out, logMsg{seq: seq, data: srv.log[seq-1]})
		}
		reply(out)
	})
}

type logMsg struct {
	seq  uint64
	data []byte
}

// The KV buckets.
const (
	leaderBucket = "FLOW_LEADER"
	leaseBucket  = "FLOW_LEASES"
	leaderKey    = "leader"
)

type kvOp int

const (
	opPut kvOp = iota
	opDelete
	opPurge // the server's TTL marker: the key lapsed
)

func (o kvOp) String() string { return [...]string{"put", "delete", "lapse"}[o] }

type kvEntry struct {
	value []byte
	rev   uint64
	live  bool
}

type kvEvent struct {
	rev   uint64
	key   string
	op    kvOp
	value []byte
}

// bucket is a KV bucket whose keys lapse TTL after their last write (a purge marker,
// which takes a revision, as JetStream's per-message TTL does).
type bucket struct {
	srv    *server
	name   string
	ttl    time.Duration
	rev    uint64
	keys   map[string]*kvEntry
	events []kvEvent
	polls  []*poll
}

func (b *bucket) write(key string, value []byte, op kvOp) uint64 {
	b.rev++
	rev := b.rev
	e := b.keys[key]
	if e == nil {
		e = &kvEntry{}
		b.keys[key] = e
	}
	e.value, e.rev, e.live = value, rev, op == opPut
	b.events = append(b.events, kvEvent{rev: rev, key: key, op: op, value: value})
	if op == opPut {
		b.srv.s.after(b.ttl, func() {
			if e.rev == rev && e.live {
				b.srv.s.tracef("srv", "%s: %s lapsed (revision %d)", b.name, key, rev)
				b.write(key, nil, opPurge)
			}
		})
	}
	wake(&b.polls)
	return rev
}

func (b *bucket) create(key string, value []byte) (uint64, error) {
	if e := b.keys[key]; e != nil && e.live {
		return 0, errKeyExists
	}
	return b.write(key, value, opPut), nil
}

func (b *bucket) update(key string, value []byte, last uint64) (uint64, error) {
	e := b.keys[key]
	if e == nil || !e.live {
		return 0, errKeyNotFound
	}
	if e.rev != last {
		return 0, errRevMismatch
	}
	return b.write(key, value, opPut), nil
}

func (b *bucket) deleteAt(key string, last uint64) error {
	e := b.keys[key]
	if e == nil || !e.live || e.rev != last {
		return errRevMismatch
	}
	b.write(key, nil, opDelete)
	return nil
}

// latest is a key's value as the stream leader has it.
type latest struct {
	value []byte
	rev   uint64
	live  bool
}

func (b *bucket) latest(key string) latest {
	if e := b.keys[key]; e != nil {
		return latest{value: e.value, rev: e.rev, live: e.live}
	}
	return latest{}
}

// watchReply is a watch's answer: the events after a revision, and the bucket's last
// revision (a status probe's answer too).
type watchReply struct {
	events []kvEvent
	last   uint64
}

// watch answers a watcher's poll for the events after revision from.
func (b *bucket) watch(from uint64, wait time.Duration, reply func(any)) {
	b.srv.park(&b.polls, wait, func() bool { return b.rev > from }, func() {
		var out []kvEvent
		for _, ev := range b.events {
			if ev.rev > from {
				out = append(out, ev)
			}
		}
		reply(watchReply{events: out, last: b.rev})
	})
}

// snapshot is the initial values of a watch: every live key, and the last revision.
func (b *bucket) snapshot() watchReply {
	var out []kvEvent
	for _, ev := range b.events {
		if e := b.keys[ev.key]; e.live && e.rev == ev.rev {
			out = append(out, ev)
		}
	}
	return watchReply{events: out, last: b.rev}
}

// taskQueue is FLOW_TASKS with its one durable consumer: a work queue whose messages
// are delivered to one fetcher at a time, acked, naked with a delay, or delivered again
// after the ack wait.
type taskQueue struct {
	srv     *server
	ackWait time.Duration
	next    uint64
	msgs    []*taskMsg
	dedup   map[string]time.Time // message ID -> when published (the duplicate window)
	polls   []*poll
}

type taskMsg struct {
	id       uint64
	task     tasks.Task
	availAt  time.Time // not before (a nak's delay)
	inFlight time.Time // delivered and unacked until then
}

const taskDupWindow = time.Minute

func (q *taskQueue) publish(t tasks.Task) bool {
	now := q.srv.s.now
	id := fmt.Sprintf("%s@%d", t.Run, t.Epoch)
	if at, ok := q.dedup[id]; ok && now.Sub(at) < taskDupWindow {
		return false
	}
	q.dedup[id] = now
	q.next++
	q.msgs = append(q.msgs, &taskMsg{id: q.next, task: t, availAt: now})
	q.poke()
	return true
}

func (q *taskQueue) deliverable(m *taskMsg) bool {
	now := q.srv.s.now
	return !now.Before(m.availAt) && !now.Before(m.inFlight)
}

func (q *taskQueue) first() *taskMsg {
	for _, m := range q.msgs {
		if q.deliverable(m) {
			return m
		}
	}
	return nil
}

// poke answers waiting fetchers, and arranges to look again when the next message
// becomes deliverable by time (a nak's delay, an ack wait).
func (q *taskQueue) poke() {
	wake(&q.polls)
	if len(q.polls) == 0 {
		return
	}
	now := q.srv.s.now
	var soonest time.Time
	for _, m := range q.msgs {
		at := m.availAt
		if m.inFlight.After(at) {
			at = m.inFlight
		}
		if at.After(now) && (soonest.IsZero() || at.Before(soonest)) {
			soonest = at
		}
	}
	if !soonest.IsZero() {
		q.srv.s.at(soonest, func() { wake(&q.polls) })
	}
}

// taskDelivery is a fetched task and its message's ID, for the ack.
type taskDelivery struct {
	id   uint64
	task tasks.Task
}

func (q *taskQueue) fetch(wait time.Duration, reply func(any)) {
	q.srv.park(&q.polls, wait, func() bool { return q.first() != nil }, func() {
		m := q.first()
		if m == nil {
			reply(nil)
			return
		}
		m.inFlight = q.srv.s.now.Add(q.ackWait)
		reply(taskDelivery{id: m.id, task: m.task})
	})
	q.poke()
}

func (q *taskQueue) ack(id uint64) {
	for i, m := range q.msgs {
		if m.id == id {
			q.msgs = append(q.msgs[:i], q.msgs[i+1:]...)
			return
		}
	}
}

func (q *taskQueue) nak(id uint64, delay time.Duration) {
	for _, m := range q.msgs {
		if m.id == id {
			m.availAt = q.srv.s.now.Add(delay)
			m.inFlight = time.Time{}
		}
	}
	q.poke()
}
