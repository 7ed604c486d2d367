// Package porttest is the conformance suite of package port: what flow's shell, and so
// the simulation, assumes of JetStream, stated as tests that every implementation of
// the ports runs (as River's riverdrivertest does for its drivers). internal/base/jsport
// runs it on a real embedded NATS server (TestJetStreamConforms); the simulation's
// server runs it in a testing/synctest bubble on its own clock (engine/internal/sim's
// TestServerConforms). When either side does something else, its run fails: the
// simulation may then not assume it.
//
// The cases take time as the implementation has it: time.Now and time.Sleep are the
// real clock for jsport and the bubble's for the simulation. A case waits for what
// must come (a lapse, a redelivery) by polling with a deadline, and sleeps only to let
// time pass before it checks what must not have happened yet.
package porttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowrun/flow/internal/base/port"
)

// T is what a case needs of its test: *testing.T, or a recorder that notes a failure
// (the simulation's control runs the cases on a server that must fail one).
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Env is one case's fresh ports.
type Env struct {
	// KV is an empty bucket whose keys lapse TTL after their last write, with a marker
	// (as the leader and lease buckets are made).
	KV  port.KV
	TTL time.Duration
	// Log is an empty stream (the log's configuration: a duplicate window of
	// port.LogDuplicates).
	Log port.Stream
	// Tasks is an empty task queue whose consumer redelivers an unacknowledged task
	// after AckWait.
	Tasks   port.Queue
	AckWait time.Duration
}

// Case is one promise.
type Case struct {
	Name string
	Run  func(t T, env Env)
}

// Cases are the suite. An implementation runs each on a fresh Env.
var Cases = []Case{
	{"KVCreateOnce", kvCreateOnce},
	{"KVUpdateAtRevision", kvUpdateAtRevision},
	{"KVRevisionsGrowAcrossKeys", kvRevisionsGrow},
	{"KVReadARevision", kvReadRevision},
	{"KVConditionalDelete", kvConditionalDelete},
	{"KVLapseLeavesAMarker", kvLapse},
	{"KVWatchReplaysThenFollows", kvWatch},
	{"LogPublishDeduplicates", logDedup},
	{"LogConsumeFromASequence", logConsume},
	{"LogPurgeKeepsTheTail", logPurge},
	{"TasksAckedAreGone", tasksAcked},
	{"TasksUnackedComeBackAfterTheAckWait", tasksRedelivered},
	{"TasksNakDelays", tasksNak},
	{"TasksTermEnds", tasksTerm},
	{"TasksPublishDeduplicates", tasksDedup},
}

func ctxFor(t T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond every step until it holds, or fails after within.
func eventually(t T, within, step time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(step)
	}
}

// A write is read back by its revision, with its server stamp; a revision of another key
// or none is not found (what a rate reservation's read-back relies on).
func kvReadRevision(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	rev, err := env.KV.Create(ctx, "k", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := env.KV.Put(ctx, "j", []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := env.KV.Revision(ctx, "k", rev)
	if err != nil || string(e.Value) != "a" || e.Revision != rev || e.Key != "k" || e.Created.IsZero() {
		t.Fatalf("revision %d of k: %+v %v", rev, e, err)
	}
	latest, err := env.KV.Latest(ctx, "k")
	if err != nil || !latest.Created.Equal(e.Created) {
		t.Fatalf("the stamp read back by revision %v differs from the latest's %v (%v)", e.Created, latest.Created, err)
	}
	for _, r := range []uint64{other, other + 100} {
		if _, err := env.KV.Revision(ctx, "k", r); !errors.Is(err, port.ErrKeyNotFound) {
			t.Fatalf("revision %d of k (j's, or none): %v; want ErrKeyNotFound", r, err)
		}
	}
}

func kvCreateOnce(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	rev, err := env.KV.Create(ctx, "k", []byte("a"))
	if err != nil || rev == 0 {
		t.Fatalf("create: %d %v", rev, err)
	}
	if _, err := env.KV.Create(ctx, "k", []byte("b")); !errors.Is(err, port.ErrKeyExists) {
		t.Fatalf("create of a live key: %v; want ErrKeyExists", err)
	}
	e, err := env.KV.Get(ctx, "k")
	if err != nil || string(e.Value) != "a" || e.Revision != rev || e.Op != port.OpPut {
		t.Fatalf("get: %+v %v; want a at revision %d", e, err, rev)
	}
	if _, err := env.KV.Get(ctx, "never"); !errors.Is(err, port.ErrKeyNotFound) {
		t.Fatalf("get of a key never written: %v; want ErrKeyNotFound", err)
	}
	if _, err := env.KV.Create(ctx, "bad key", nil); !errors.Is(err, port.ErrInvalidKey) {
		t.Fatalf("create of a key with a space: %v; want ErrInvalidKey", err)
	}
}

func kvUpdateAtRevision(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	r1, err := env.KV.Create(ctx, "k", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := env.KV.Update(ctx, "k", []byte("b"), r1)
	if err != nil || r2 <= r1 {
		t.Fatalf("update at the key's revision: %d %v; want a revision above %d", r2, err, r1)
	}
	if _, err := env.KV.Update(ctx, "k", []byte("c"), r1); !errors.Is(err, port.ErrWrongRevision) {
		t.Fatalf("update at an old revision: %v; want ErrWrongRevision", err)
	}
	if _, err := env.KV.Update(ctx, "other", []byte("c"), r2); !errors.Is(err, port.ErrWrongRevision) {
		t.Fatalf("update of a key never written: %v; want ErrWrongRevision", err)
	}
	if e, err := env.KV.Get(ctx, "k"); err != nil || string(e.Value) != "b" {
		t.Fatalf("get after the refused updates: %+v %v; want b", e, err)
	}
	r3, err := env.KV.Put(ctx, "k", []byte("d"))
	if err != nil || r3 <= r2 {
		t.Fatalf("put: %d %v; want a revision above %d", r3, err, r2)
	}
}

func kvRevisionsGrow(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	var last uint64
	for i, k := range []string{"a", "b", "a.b", "c"} {
		rev, err := env.KV.Put(ctx, k, []byte{byte(i)})
		if err != nil || rev <= last {
			t.Fatalf("put %s: %d %v; want above %d (one sequence for the whole bucket)", k, rev, err, last)
		}
		last = rev
	}
	if got, err := env.KV.LastRevision(ctx); err != nil || got != last {
		t.Fatalf("last revision: %d %v; want %d", got, err, last)
	}
	keys, err := env.KV.Keys(ctx)
	if err != nil || len(keys) != 4 {
		t.Fatalf("keys: %v %v; want 4", keys, err)
	}
}

func kvConditionalDelete(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	r1, err := env.KV.Create(ctx, "k", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.KV.Delete(ctx, "k", r1+100); !errors.Is(err, port.ErrWrongRevision) {
		t.Fatalf("delete at a revision the key does not have: %v; want ErrWrongRevision", err)
	}
	if err := env.KV.Delete(ctx, "k", r1); err != nil {
		t.Fatalf("delete at the key's revision: %v", err)
	}
	if _, err := env.KV.Get(ctx, "k"); !errors.Is(err, port.ErrKeyNotFound) {
		t.Fatalf("get of a deleted key: %v; want ErrKeyNotFound", err)
	}
	l, err := env.KV.Latest(ctx, "k")
	if err != nil || l.Op == port.OpPut || l.Revision <= r1 {
		t.Fatalf("latest of a deleted key: %+v %v; want its delete marker above revision %d", l, err, r1)
	}
	r2, err := env.KV.Create(ctx, "k", []byte("b"))
	if err != nil || r2 <= l.Revision {
		t.Fatalf("create after the delete: %d %v; want a revision above the marker's %d", r2, err, l.Revision)
	}
}

// A key not written again lapses TTL after its last write (not before), leaving a
// marker that takes a revision, that Latest returns and that a watcher sees: how a
// lease's holder is found gone.
func kvLapse(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	w, err := env.KV.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if e := next(t, w, 10*time.Second); e != nil {
		t.Fatalf("watch of a key never written: %+v; want the end of the initial values (nil)", e)
	}
	start := time.Now() // the write is after this
	rev, err := env.KV.Create(ctx, "k", []byte("held"))
	if err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 10*time.Second); e == nil || e.Op != port.OpPut || e.Revision != rev {
		t.Fatalf("watch: %+v; want the put at %d", e, rev)
	}
	time.Sleep(env.TTL / 2)
	if _, err := env.KV.Get(ctx, "k"); err != nil {
		t.Fatalf("get at half the TTL: %v; a key lives a TTL", err)
	}
	e := next(t, w, 3*env.TTL+5*time.Second)
	if e == nil || e.Op == port.OpPut || e.Revision <= rev {
		t.Fatalf("watch after the TTL: %+v; want a lapse marker above revision %d", e, rev)
	}
	if took := time.Since(start); took < env.TTL {
		t.Fatalf("the key lapsed at most %s after its write, before its TTL of %s", took, env.TTL)
	}
	if _, err := env.KV.Get(ctx, "k"); !errors.Is(err, port.ErrKeyNotFound) {
		t.Fatalf("get after the lapse: %v; want ErrKeyNotFound", err)
	}
	l, err := env.KV.Latest(ctx, "k")
	if err != nil || l.Op == port.OpPut || l.Revision != e.Revision {
		t.Fatalf("latest after the lapse: %+v %v; want the marker at %d", l, err, e.Revision)
	}
	if _, err := env.KV.Create(ctx, "k", []byte("again")); err != nil {
		t.Fatalf("create after the lapse: %v", err)
	}
}

// next is the watcher's next update, or fails after within.
func next(t T, w port.Watcher, within time.Duration) *port.Entry {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case e, ok := <-w.Updates():
		if !ok {
			t.Fatal("the watch ended")
		}
		return e
	case <-timer.C:
		t.Fatalf("no update within %s", within)
		return nil
	}
}

// A watch gives the live values first (each key's newest), then nil, then every write
// after, in revision order, deletes included.
func kvWatch(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	ra, _ := env.KV.Put(ctx, "a", []byte("1"))
	_, _ = env.KV.Put(ctx, "b", []byte("1"))
	rb, _ := env.KV.Put(ctx, "b", []byte("2"))
	w, err := env.KV.Watch(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	got := map[string]uint64{}
	for {
		e := next(t, w, 10*time.Second)
		if e == nil {
			break
		}
		got[e.Key] = e.Revision
	}
	if len(got) != 2 || got["a"] != ra || got["b"] != rb {
		t.Fatalf("initial values: %v; want a@%d and b@%d", got, ra, rb)
	}
	rc, _ := env.KV.Put(ctx, "c", []byte("1"))
	if err := env.KV.Delete(ctx, "a", 0); err != nil {
		t.Fatal(err)
	}
	if e := next(t, w, 10*time.Second); e == nil || e.Key != "c" || e.Revision != rc {
		t.Fatalf("watch: %+v; want c at %d", e, rc)
	}
	if e := next(t, w, 10*time.Second); e == nil || e.Key != "a" || e.Op == port.OpPut || e.Revision <= rc {
		t.Fatalf("watch: %+v; want a's delete after %d", e, rc)
	}
}

func logDedup(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	s1, err := env.Log.Publish(ctx, "m1", []byte("one"))
	if err != nil || s1 == 0 {
		t.Fatalf("publish: %d %v", s1, err)
	}
	s2, err := env.Log.Publish(ctx, "m2", []byte("two"))
	if err != nil || s2 != s1+1 {
		t.Fatalf("publish: %d %v; want %d", s2, err, s1+1)
	}
	again, err := env.Log.Publish(ctx, "m1", []byte("one"))
	if err != nil || again != s1 {
		t.Fatalf("publish of a message ID within the duplicate window: %d %v; want its first sequence %d", again, err, s1)
	}
	info, err := env.Log.Info(ctx)
	if err != nil || info.LastSeq != s2 || info.FirstSeq != s1 {
		t.Fatalf("info: %+v %v; want messages %d..%d (the duplicate not appended)", info, err, s1, s2)
	}
}

func logConsume(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	var seqs []uint64
	for i := range 5 {
		s, err := env.Log.Publish(ctx, fmt.Sprint("m", i), []byte{byte(i)})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	it, err := env.Log.Consume(ctx, seqs[2])
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	for i := 2; i < 5; i++ {
		m, err := it.Next(ctx)
		if err != nil || m.Seq != seqs[i] || m.ID != fmt.Sprint("m", i) || !bytes.Equal(m.Data, []byte{byte(i)}) {
			t.Fatalf("message %d: %+v %v; want seq %d, ID m%d", i, m, err, seqs[i], i)
		}
	}
	// The next one comes when published.
	s, err := env.Log.Publish(ctx, "late", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if m, err := it.Next(ctx); err != nil || m.Seq != s || m.ID != "late" {
		t.Fatalf("a message published while consuming: %+v %v; want seq %d", m, err, s)
	}
	it.Stop()
	if _, err := it.Next(ctx); !errors.Is(err, port.ErrClosed) {
		t.Fatalf("next after stop: %v; want ErrClosed", err)
	}
}

func logPurge(t T, env Env) {
	ctx := ctxFor(t, time.Minute)
	var last uint64
	for i := range 5 {
		s, err := env.Log.Publish(ctx, fmt.Sprint("m", i), []byte{byte(i)})
		if err != nil {
			t.Fatal(err)
		}
		last = s
	}
	keep := last - 1
	if err := env.Log.Purge(ctx, keep); err != nil {
		t.Fatal(err)
	}
	info, err := env.Log.Info(ctx)
	if err != nil || info.FirstSeq != keep || info.LastSeq != last {
		t.Fatalf("info after a purge below %d: %+v %v", keep, info, err)
	}
	for _, from := range []uint64{1, keep - 1, keep} {
		if next, ok, err := env.Log.NextSeq(ctx, from); err != nil || !ok || next != keep {
			t.Fatalf("the next message from %d after the purge: %d %t %v; want %d", from, next, ok, err, keep)
		}
	}
	if next, ok, err := env.Log.NextSeq(ctx, last); err != nil || !ok || next != last {
		t.Fatalf("the next message from the last: %d %t %v; want %d", next, ok, err, last)
	}
	if next, ok, err := env.Log.NextSeq(ctx, last+1); err != nil || ok {
		t.Fatalf("the next message past the end: %d %t %v; want none", next, ok, err)
	}
}

// fetchOne fetches one task, waiting at most wait (nil: none came).
func fetchOne(t T, c port.Consumer, wait time.Duration) port.Delivery {
	t.Helper()
	ds, err := c.Fetch(ctxFor(t, wait+30*time.Second), 1, wait)
	if err != nil {
		t.Fatalf("fetch: %v", err)
	}
	if len(ds) == 0 {
		return nil
	}
	return ds[0]
}

func consumer(t T, env Env) port.Consumer {
	t.Helper()
	c, err := env.Tasks.Consumer(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// publishAndFetch publishes one task and fetches it.
func publishAndFetch(t T, env Env) (port.Consumer, port.Delivery) {
	t.Helper()
	c := consumer(t, env)
	if err := env.Tasks.Publish(ctxFor(t, time.Minute), "t1", []byte("run-1")); err != nil {
		t.Fatal(err)
	}
	d := fetchOne(t, c, 5*time.Second)
	if d == nil {
		t.Fatal("no task")
	}
	return c, d
}

// redelivered waits for a task to come again, fetching for wait at a time.
func redelivered(t T, c port.Consumer, within, wait time.Duration, what string) port.Delivery {
	t.Helper()
	var again port.Delivery
	eventually(t, within, 10*time.Millisecond, what, func() bool {
		again = fetchOne(t, c, wait)
		return again != nil
	})
	return again
}

func tasksAcked(t T, env Env) {
	c := consumer(t, env)
	if err := env.Tasks.Publish(ctxFor(t, time.Minute), "t1", []byte("run-1")); err != nil {
		t.Fatal(err)
	}
	d := fetchOne(t, c, 5*time.Second)
	if d == nil || string(d.Data()) != "run-1" {
		t.Fatalf("fetch: %v; want run-1", d)
	}
	if err := d.Ack(); err != nil {
		t.Fatal(err)
	}
	if d := fetchOne(t, c, 2*env.AckWait+time.Second); d != nil {
		t.Fatalf("an acked task came again: %s", d.Data())
	}
}

func tasksRedelivered(t T, env Env) {
	c, _ := publishAndFetch(t, env)
	start := time.Now()
	if d := fetchOne(t, c, env.AckWait/2); d != nil {
		t.Fatalf("an unacked task came again within half the ack wait: %s", d.Data())
	}
	again := redelivered(t, c, 3*env.AckWait+5*time.Second, env.AckWait, "the unacked task's redelivery")
	if string(again.Data()) != "run-1" || time.Since(start) < env.AckWait/2 {
		t.Fatalf("redelivery: %s after %s", again.Data(), time.Since(start))
	}
	_ = again.Ack()
}

func tasksNak(t T, env Env) {
	c, d := publishAndFetch(t, env)
	delay := env.AckWait / 2
	start := time.Now()
	if err := d.Nak(delay); err != nil {
		t.Fatal(err)
	}
	again := redelivered(t, c, delay+3*env.AckWait+5*time.Second, env.AckWait, "the naked task's redelivery")
	if took := time.Since(start); took < delay/2 {
		t.Fatalf("a task naked with a delay of %s came again after %s", delay, took)
	}
	_ = again.Ack()
}

func tasksTerm(t T, env Env) {
	c, d := publishAndFetch(t, env)
	if err := d.Term(); err != nil {
		t.Fatal(err)
	}
	if d := fetchOne(t, c, 2*env.AckWait+time.Second); d != nil {
		t.Fatalf("a terminated task came again: %s", d.Data())
	}
}

func tasksDedup(t T, env Env) {
	c := consumer(t, env)
	ctx := ctxFor(t, time.Minute)
	for range 2 {
		if err := env.Tasks.Publish(ctx, "same", []byte("run-1")); err != nil {
			t.Fatal(err)
		}
	}
	d := fetchOne(t, c, 5*time.Second)
	if d == nil {
		t.Fatal("no task")
	}
	_ = d.Ack()
	if d := fetchOne(t, c, time.Second); d != nil {
		t.Fatalf("a task published twice with one message ID came twice: %s", d.Data())
	}
}
