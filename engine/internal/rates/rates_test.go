package rates

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go/jetstream"
	"pgregory.net/rapid"

	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/workflow"
)

// bucket opens the rates bucket of a fresh embedded NATS server, once per connection
// asked for: each stands for a node.
func buckets(t *testing.T, n int) []port.KV { return benchBuckets(t, n) }

func benchBuckets(t testing.TB, n int) []port.KV {
	t.Helper()
	srv, err := natsnode.Start(natsnode.Config{DataDir: t.TempDir(), NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []port.KV
	for range n {
		nc, err := srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := jsport.OpenKV(ctx, js, jsport.RatesConfig(1), nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, kv)
	}
	return out
}

// reserveAll has each limiter's starters reserve perStarter moments of r at once, and
// returns every moment reserved.
func reserveAll(t *testing.T, ls []*Limiter, starters, perStarter int, r workflow.RateLimit) []time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var got []time.Time
	var wg sync.WaitGroup
	for _, l := range ls {
		for range starters {
			wg.Go(func() {
				for range perStarter {
					res, err := l.Reserve(ctx, r)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					got = append(got, res.At)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	slices.SortFunc(got, time.Time.Compare)
	return got
}

// closest is the least gap between two reserved moments.
func closest(ats []time.Time) time.Duration {
	least := time.Duration(1<<63 - 1)
	for i := 1; i < len(ats); i++ {
		least = min(least, ats[i].Sub(ats[i-1]))
	}
	return least
}

// The property: whatever the number of nodes, of starters on each and of the rate,
// the moments reserved on one key are spaced by at least the rate's interval, on the
// real bucket (a conditional write per reservation: two nodes that read the same cell
// cannot both write it).
func TestReservationsAreSpacedAcrossNodes(t *testing.T) {
	kvs := buckets(t, 4)
	rapid.Check(t, func(rt *rapid.T) {
		nodes := rapid.IntRange(1, 4).Draw(rt, "nodes")
		starters := rapid.IntRange(1, 4).Draw(rt, "starters")
		each := rapid.IntRange(1, 5).Draw(rt, "each")
		limit := rapid.IntRange(1, 1000).Draw(rt, "limit")
		r := workflow.RateLimit{Key: fmt.Sprintf("k%d", rapid.IntRange(0, 1<<30).Draw(rt, "key")), Limit: limit, Per: workflow.Duration(time.Second)}
		var ls []*Limiter
		for _, kv := range kvs[:nodes] {
			ls = append(ls, New(Config{KV: kv}))
		}
		ats := reserveAll(t, ls, starters, each, r)
		if len(ats) != nodes*starters*each {
			rt.Fatalf("%d reservations, want %d", len(ats), nodes*starters*each)
		}
		if gap := closest(ats); gap < r.Interval() {
			rt.Fatalf("two starts %s apart; the interval of %s is %s", gap, r, r.Interval())
		}
	})
}

// The control: each node pacing alone in its memory (Config.Local), two nodes reserve
// moments closer than the interval, as a per-node limit does.
func TestReservationsControlLocal(t *testing.T) {
	r := workflow.RateLimit{Key: "wallet", Limit: 10, Per: workflow.Duration(time.Second)}
	ls := []*Limiter{New(Config{Local: true}), New(Config{Local: true})}
	ats := reserveAll(t, ls, 2, 5, r)
	if gap := closest(ats); gap >= r.Interval() {
		t.Fatalf("per-node pacing kept every start %s apart: the control shows nothing", gap)
	}
}

// A start that wakes past its moment's slack (a paused process) does not go late: it
// reserves again, behind what others reserved meanwhile.
func TestLateStartReservesAgain(t *testing.T) {
	kv := buckets(t, 1)[0]
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	l := New(Config{KV: kv, Clock: clock})
	r := workflow.RateLimit{Key: "wallet", Limit: 1, Per: workflow.Duration(time.Second)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Reserve(ctx, r); err != nil { // the next moment is a second away
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Wait(ctx, r, Waiter{Run: "r1", Step: "pay"}) }()
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if w := l.Waiters(); len(w) != 1 || w[0].Run != "r1" || w[0].Key != "wallet" {
		t.Fatalf("waiters: %+v", w)
	}
	clock.Advance(time.Second + Slack(r) + time.Millisecond) // it wakes late
	if err := clock.BlockUntilContext(ctx, 1); err != nil {  // and waits for a new moment
		t.Fatal(err)
	}
	if late := l.StatsOf("wallet").Late.Load(); late != 1 {
		t.Fatalf("late: %d", late)
	}
	// Its new moment is behind the one it gave up (the bucket's clock, the server's, has
	// barely moved): two intervals from its reservation.
	clock.Advance(2 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := l.StatsOf("wallet"); s.Starts.Load() != 1 || len(l.Waiters()) != 0 {
		t.Fatalf("starts %d, waiters %v", s.Starts.Load(), l.Waiters())
	}
	rs, err := l.List(ctx)
	if err != nil || len(rs) != 1 || rs[0].Key != "wallet" || rs[0].Limit != 1 || rs[0].Per != time.Second {
		t.Fatalf("list: %+v %v", rs, err)
	}
}

// Wait ends with its context (the epoch's end), and a broken cell paces from now.
func TestWaitEndsWithTheEpoch(t *testing.T) {
	kv := buckets(t, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kv.Put(ctx, "wallet", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	l := New(Config{KV: kv})
	r := workflow.RateLimit{Key: "wallet", Limit: 1, Per: workflow.Duration(time.Hour)}
	if err := l.Wait(ctx, r, Waiter{Run: "a"}); err != nil {
		t.Fatalf("first start: %v", err)
	}
	ectx, end := context.WithCancelCause(ctx)
	cause := fmt.Errorf("epoch ended")
	done := make(chan error, 1)
	go func() { done <- l.Wait(ectx, r, Waiter{Run: "b"}) }() // its moment is an hour away
	select {
	case err := <-done:
		t.Fatalf("the second start did not wait for its moment: %v", err)
	default:
	}
	end(cause)
	if err := <-done; err != cause {
		t.Fatalf("second start's wait ended with %v, want the epoch's cause", err)
	}
}
