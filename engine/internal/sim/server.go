package sim

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/checkpoint/invariants"
	"github.com/flowrun/flow/internal/base/port"
)

// The server is NATS JetStream as flow uses it, modelled on the simulation's loop: the
// log (a stream), the KV buckets (revisions from one counter per bucket, a TTL per key on
// the server's clock, lapse markers that take a revision), the task queue (a work queue
// with acks, naks and redelivery after the ack wait), the dead-letter notices and the
// snapshots' object store. It answers requests when they arrive (ports.go carries them
// over the simulated network). It never fails itself: a NATS outage is a partition of
// every node. What it promises is what port/porttest states, and TestServerConforms runs
// that suite on it.

type server struct {
	s       *Sim
	created time.Time        // the log stream's creation: its identity
	first   uint64           // the log's first sequence (a purge moves it)
	log     [][]byte         // message i has sequence i+1 (nil: purged)
	ids     []string         // each message's ID
	from    []string         // the node that appended each message ("" for a duplicate)
	msgIDs  map[string]dedup // publish dedup: message ID -> sequence, within the window
	polls   []*poll          // consumers waiting for the log to grow
	kv      map[string]*bucket
	tasks   *taskQueue
	dlq     map[string]bool
	objects map[string]*object
	// forgetMarkers is the conformance suite's control (TestServerConformsControl): a
	// lapsed key just goes, with no marker, no revision and nothing for watchers, as a
	// bucket made without LimitMarkerTTL would.
	forgetMarkers bool
}

type dedup struct {
	seq uint64
	at  time.Time
}

// poll is a long poll parked on the server: answered when what it waits for comes, or
// with nothing at its deadline.
type poll struct {
	ready  func() bool // whether it can be answered now
	answer func()
	done   bool
}

func newServer(s *Sim) *server {
	srv := &server{s: s, created: s.now, first: 1, msgIDs: map[string]dedup{}, kv: map[string]*bucket{},
		dlq: map[string]bool{}, objects: map[string]*object{}}
	ttl := s.cfg.TTL
	for _, b := range []struct {
		name string
		ttl  time.Duration
	}{{port.LeaderBucket, ttl}, {port.LeaseBucket, ttl}, {port.NodesBucket, time.Minute}, {port.ClusterBucket, 0}, {port.RatesBucket, 0}} {
		srv.kv[b.name] = &bucket{srv: srv, name: b.name, ttl: b.ttl, keys: map[string]*kvEntry{}}
	}
	srv.tasks = &taskQueue{srv: srv, ackWait: max(ttl, time.Second), dedup: map[string]time.Time{}}
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

// The log.

// publish appends a log message unless its message ID was seen within the duplicate
// window (a retried publish): its sequence either way.
func (srv *server) publish(node, msgID string, data []byte) uint64 {
	now := srv.s.now
	if d, ok := srv.msgIDs[msgID]; ok && now.Sub(d.at) < port.LogDuplicates {
		return d.seq
	}
	seq := srv.append(node, msgID, data)
	srv.msgIDs[msgID] = dedup{seq: seq, at: now}
	s := srv.s
	if s.faultOn && s.cfg.DupP > 0 && s.rng.Float64() < s.cfg.DupP {
		// The message lands again later, as a message of its own: the dedup state was
		// lost (a stream leader change) or the retry came after the duplicate window.
		// Every entry must be harmless the second time.
		d := time.Duration(s.rng.Int64N(int64(3 * time.Second)))
		s.after(d, func() {
			s.stats.Dups++
			s.tracef("srv", "log: %s's message %d lands again", node, seq)
			srv.append("", msgID+".again", data)
		})
	}
	return seq
}

// lastSeq is the log's last sequence.
func (srv *server) lastSeq() uint64 { return uint64(len(srv.log)) }

// append adds a message to the log, applies it to the reference store, checks the
// invariants on it, and wakes the consumers.
func (srv *server) append(node, msgID string, data []byte) uint64 {
	s := srv.s
	srv.log = append(srv.log, data)
	srv.ids = append(srv.ids, msgID)
	srv.from = append(srv.from, node)
	seq := srv.lastSeq()
	s.stats.Messages++
	if s.ref == nil { // the conformance suite's server: the log holds bytes, not entries
		wake(&srv.polls)
		return seq
	}
	entries, derr := checkpoint.DecodeEnvelope(seq, data)
	before := invariants.ReadBefore(s.ref, entries)
	verdicts, err := s.ref.Apply(seq, data)
	if err != nil {
		s.fail("9", "the reference store cannot apply message %d: %v", seq, err)
		return seq
	}
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
		s.observe(entries, verdicts)
		if err := s.check.Message(s.ref, seq, before, entries, verdicts); err != nil {
			s.failErr(err)
		}
	}
	wake(&srv.polls)
	return seq
}

// fetchLog answers a consumer's poll for the messages from sequence from on (at most
// limit), at once or when the log grows, or with none after wait.
func (srv *server) fetchLog(from uint64, limit int, wait time.Duration, reply func([]port.Message)) {
	srv.park(&srv.polls, wait, func() bool { return srv.lastSeq() >= max(from, srv.first) }, func() {
		var out []port.Message
		for seq := max(from, srv.first); seq <= srv.lastSeq() && len(out) < limit; seq++ {
			out = append(out, port.Message{Seq: seq, ID: srv.ids[seq-1], Data: srv.log[seq-1]})
		}
		reply(out)
	})
}

func (srv *server) logInfo() port.StreamInfo {
	return port.StreamInfo{Created: srv.created, FirstSeq: srv.first, LastSeq: srv.lastSeq()}
}

func (srv *server) nextMsg(seq uint64) (uint64, bool) {
	for s := max(seq, srv.first); s <= srv.lastSeq(); s++ {
		if srv.log[s-1] != nil {
			return s, true
		}
	}
	return 0, false
}

// purgeLog deletes the messages below keep.
func (srv *server) purgeLog(keep uint64) {
	for seq := srv.first; seq < keep && seq <= srv.lastSeq(); seq++ {
		srv.log[seq-1] = nil
	}
	srv.first = max(srv.first, min(keep, srv.lastSeq()+1))
}

// The KV buckets.

type kvEntry struct {
	value   []byte
	rev     uint64
	live    bool
	created time.Time
}

// bucket is a KV bucket whose keys lapse ttl after their last write (0: never) with a
// purge marker, which takes a revision, as JetStream's per-message TTL does.
type bucket struct {
	srv    *server
	name   string
	ttl    time.Duration
	rev    uint64
	keys   map[string]*kvEntry
	events []port.Entry
	polls  []*poll
}

func (b *bucket) write(key string, value []byte, op port.Op) uint64 {
	b.rev++
	rev := b.rev
	now := b.srv.s.now
	e := b.keys[key]
	if e == nil {
		e = &kvEntry{}
		b.keys[key] = e
	}
	e.value, e.rev, e.live, e.created = value, rev, op == port.OpPut, now
	b.events = append(b.events, port.Entry{Key: key, Value: value, Revision: rev, Op: op, Created: now})
	if op == port.OpPut && b.ttl > 0 {
		b.srv.s.after(b.ttl, func() {
			if e.rev == rev && e.live {
				if b.srv.forgetMarkers {
					e.live = false
					return
				}
				b.srv.s.tracef("srv", "%s: %s lapsed (revision %d)", strings.TrimPrefix(b.name, "FLOW_"), key, rev)
				b.write(key, nil, port.OpPurge)
			}
		})
	}
	wake(&b.polls)
	return rev
}

var errInvalidKey = port.Wrap(port.ErrInvalidKey, errors.New("sim: invalid key"))

func validKey(key string) bool {
	return key != "" && !strings.ContainsAny(key, " \t\r\n*>") && !strings.HasPrefix(key, ".") && !strings.HasSuffix(key, ".") && !strings.Contains(key, "..")
}

func (b *bucket) create(key string, value []byte) (uint64, error) {
	if !validKey(key) {
		return 0, errInvalidKey
	}
	if e := b.keys[key]; e != nil && e.live {
		return 0, port.Wrap(port.ErrKeyExists, fmt.Errorf("sim: %s/%s exists", b.name, key))
	}
	return b.write(key, value, port.OpPut), nil
}

func (b *bucket) update(key string, value []byte, last uint64) (uint64, error) {
	if !validKey(key) {
		return 0, errInvalidKey
	}
	e := b.keys[key]
	if e == nil || !e.live || e.rev != last {
		return 0, port.Wrap(port.ErrWrongRevision, fmt.Errorf("sim: %s/%s: wrong last revision %d", b.name, key, last))
	}
	return b.write(key, value, port.OpPut), nil
}

func (b *bucket) put(key string, value []byte) (uint64, error) {
	if !validKey(key) {
		return 0, errInvalidKey
	}
	return b.write(key, value, port.OpPut), nil
}

func (b *bucket) del(key string, last uint64) error {
	e := b.keys[key]
	if last > 0 && (e == nil || e.rev != last) {
		return port.Wrap(port.ErrWrongRevision, fmt.Errorf("sim: %s/%s: wrong last revision %d", b.name, key, last))
	}
	b.write(key, nil, port.OpDelete)
	return nil
}

// get is a key's value (ErrKeyNotFound unless it holds one).
func (b *bucket) get(key string) (port.Entry, error) {
	if e := b.keys[key]; e != nil && e.live {
		return port.Entry{Key: key, Value: e.value, Revision: e.rev, Op: port.OpPut, Created: e.created}, nil
	}
	return port.Entry{}, port.Wrap(port.ErrKeyNotFound, fmt.Errorf("sim: %s/%s not found", b.name, key))
}

// revision is key's write at rev (every write is kept: the simulated buckets keep their
// whole history, a superset of what JetStream's History keeps).
func (b *bucket) revision(key string, rev uint64) (port.Entry, error) {
	i, found := slices.BinarySearchFunc(b.events, rev, func(e port.Entry, r uint64) int { return cmp.Compare(e.Revision, r) })
	if !found || b.events[i].Key != key {
		return port.Entry{}, port.Wrap(port.ErrKeyNotFound, fmt.Errorf("sim: %s/%s has no revision %d", b.name, key, rev))
	}
	return b.events[i], nil
}

// latest is a key's newest revision, markers included.
func (b *bucket) latest(key string) (port.Entry, error) {
	e := b.keys[key]
	if e == nil {
		return port.Entry{}, port.Wrap(port.ErrKeyNotFound, fmt.Errorf("sim: %s/%s never written", b.name, key))
	}
	op := port.OpPut
	if !e.live {
		op = port.OpDelete
		for i := len(b.events) - 1; i >= 0; i-- {
			if b.events[i].Key == key {
				op = b.events[i].Op
				break
			}
		}
	}
	return port.Entry{Key: key, Value: e.value, Revision: e.rev, Op: op, Created: e.created}, nil
}

func (b *bucket) keyList() []string {
	var out []string
	for k, e := range b.keys {
		if e.live {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// initial is a watch's initial values: every live key (of key, or all with ""), and the
// last revision.
func (b *bucket) initial(key string) ([]port.Entry, uint64) {
	var out []port.Entry
	for _, ev := range b.events {
		if key != "" && ev.Key != key {
			continue
		}
		// A key raise purged (the leader bucket's term raise) has no entry, only its old
		// events: it is gone, not a value (a nil entry here once crashed seed 1 in 3,000).
		if e := b.keys[ev.Key]; e != nil && e.live && e.rev == ev.Revision {
			out = append(out, ev)
		}
	}
	return out, b.rev
}

// watch answers a watcher's poll for the events after revision from (of key, or all).
func (b *bucket) watch(key string, from uint64, wait time.Duration, reply func([]port.Entry, uint64)) {
	b.srv.park(&b.polls, wait, func() bool { return b.rev > from }, func() {
		var out []port.Entry
		for _, ev := range b.events {
			if ev.Revision > from && (key == "" || ev.Key == key) {
				out = append(out, ev)
			}
		}
		reply(out, b.rev)
	})
}

// raise purges the bucket's history below above+1: its next revision is above it (the
// leader bucket's term raise); keys last written at or below it are gone.
func (b *bucket) raise(above uint64) {
	for k, e := range b.keys {
		if e.rev <= above {
			delete(b.keys, k)
		}
	}
	b.rev = max(b.rev, above)
}

// The task queue: FLOW_TASKS with its one durable consumer, a work queue whose messages
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
	data     []byte
	availAt  time.Time // not before (a nak's delay)
	inFlight time.Time // delivered and unacked until then
}

func (q *taskQueue) publish(msgID string, data []byte) {
	now := q.srv.s.now
	if at, ok := q.dedup[msgID]; ok && now.Sub(at) < port.TaskDuplicates {
		return
	}
	q.dedup[msgID] = now
	q.next++
	q.msgs = append(q.msgs, &taskMsg{id: q.next, data: data, availAt: now})
	q.poke()
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
	data []byte
}

func (q *taskQueue) fetch(wait time.Duration, reply func(*taskDelivery)) {
	q.srv.park(&q.polls, wait, func() bool { return q.first() != nil }, func() {
		m := q.first()
		if m == nil {
			reply(nil)
			return
		}
		s := q.srv.s
		m.inFlight = s.now.Add(q.ackWait)
		if s.faultOn && s.cfg.RedeliverP > 0 && s.redeliver.Float64() < s.cfg.RedeliverP {
			// Delivered again soon unless acked first: the second delivery may reach the
			// same node while the first still runs (worker.Pool.take's case).
			m.inFlight = s.now.Add(time.Duration(s.redeliver.Int64N(int64(300 * time.Millisecond))))
			s.stats.Redeliveries++
			q.poke()
		}
		reply(&taskDelivery{id: m.id, data: m.data})
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

// The snapshots' object store.

type object struct {
	data     []byte
	headers  map[string]string
	modified time.Time
}

func (srv *server) putObject(name string, headers map[string]string, data []byte) (port.Object, error) {
	if srv.objects[name] != nil {
		return port.Object{}, port.Wrap(port.ErrKeyExists, fmt.Errorf("sim: object %s exists", name))
	}
	o := &object{data: data, headers: headers, modified: srv.s.now}
	srv.objects[name] = o
	return o.info(name), nil
}

func (o *object) info(name string) port.Object {
	h := map[string]string{}
	for k, v := range o.headers {
		h[k] = v
	}
	return port.Object{Name: name, Size: uint64(len(o.data)), Modified: o.modified, Headers: h}
}

func (srv *server) renameObject(name, to string, headers map[string]string) error {
	o := srv.objects[name]
	switch {
	case o == nil:
		return port.Wrap(port.ErrNotFound, fmt.Errorf("sim: object %s not found", name))
	case srv.objects[to] != nil:
		return port.Wrap(port.ErrKeyExists, fmt.Errorf("sim: object %s exists", to))
	}
	delete(srv.objects, name)
	o.headers = headers
	srv.objects[to] = o
	return nil
}

func (srv *server) getObject(name string) (io.ReadCloser, port.Object, error) {
	o := srv.objects[name]
	if o == nil {
		return nil, port.Object{}, port.Wrap(port.ErrNotFound, fmt.Errorf("sim: object %s not found", name))
	}
	return io.NopCloser(bytes.NewReader(o.data)), o.info(name), nil
}

func (srv *server) listObjects() []port.Object {
	var names []string
	for n := range srv.objects {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]port.Object, 0, len(names))
	for _, n := range names {
		out = append(out, srv.objects[n].info(n))
	}
	return out
}
