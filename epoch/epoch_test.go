package epoch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/internal/base/backoff"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/internal/testkit/within"
)

var fastBackoff = backoff.Policy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}

func TestConfigValidation(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{TTL: -time.Second}, "TTL -1s is negative"},
		{Config{RenewInterval: -1}, "RenewInterval -1ns is negative"},
		{Config{TTL: 500 * time.Millisecond}, "under 1s"},
		{Config{TTL: 10 * time.Second, RenewInterval: 10 * time.Second}, "RenewInterval 10s must be shorter than the lease TTL"},
		{Config{TTL: 9 * time.Second, RenewInterval: 7 * time.Second}, "RenewInterval 7s must be shorter than 2/3 of the lease TTL (6s)"},
		{Config{RenewInterval: 7 * time.Second}, "shorter than 2/3 of the lease TTL (6.666666666s)"}, // the default TTL
	} {
		before := c.cfg
		err := c.cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "use") && !strings.Contains(err.Error(), "set") {
			t.Errorf("Validate(%+v) = %v; want %q and the fix", c.cfg, err, c.want)
		}
		if fmt.Sprintf("%+v", c.cfg) != fmt.Sprintf("%+v", before) {
			t.Errorf("Validate changed its config: %+v, was %+v", c.cfg, before)
		}
		if _, err := newLeases(context.Background(), nil, c.cfg, 1); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewLeases(%+v) = %v; want ErrInvalidConfig before any I/O", c.cfg, err)
		}
	}
	var zero Config
	if err := zero.Validate(); err != nil || zero.TTL != 0 || zero.Clock != nil || zero.Counters != nil {
		t.Fatalf("the zero config: Validate = %v, and it changed: %+v", err, zero)
	}
	d := DefaultConfig()
	if d.TTL != 10*time.Second || d.RenewInterval != d.TTL/3 || d.Backoff != defaultBackoff || d.Exit == nil ||
		d.Clock == nil || d.Counters == nil || d.Logger == nil || d.Validate() != nil {
		t.Fatalf("DefaultConfig() = %+v (valid: %v)", d, d.Validate())
	}
	c := Config{TTL: 3 * time.Second, Counters: &Counters{}}
	w := c.WithDefaults()
	if w.RenewInterval != time.Second || w.Counters != c.Counters || c.RenewInterval != 0 || c.Clock != nil {
		t.Fatalf("WithDefaults: %+v from %+v; want RenewInterval TTL/3, the same Counters, and the original unchanged", w, c)
	}
	short := Config{TTL: 300 * time.Millisecond, AllowShortTTL: true}
	if err := short.Validate(); err != nil {
		t.Fatalf("a short TTL in test mode: %v", err)
	}
	if p := short.LeaseClock(); p.RenewInterval() != 100*time.Millisecond || p.TrustWindow() != 200*time.Millisecond || p.RenewalTimeout() != 50*time.Millisecond {
		t.Fatalf("LeaseClock of TTL 300ms: renew %s, trust %s, renewal timeout %s", p.RenewInterval(), p.TrustWindow(), p.RenewalTimeout())
	}
}

func TestElectionAndResign(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	_, js := connect(t, srv.ClientURL())
	counters := &Counters{}
	cfgA, cfgB := testConfig(), testConfig()
	cfgA.Counters, cfgB.Counters = counters, counters
	a, err := newElector(ctx, js, "node-a", cfgA, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newElector(ctx, js, "node-b", cfgB, 1)
	if err != nil {
		t.Fatal(err)
	}
	obsCtx, stopObs := context.WithCancel(ctx)
	defer stopObs()
	seen, err := a.Observe(obsCtx)
	if err != nil {
		t.Fatal(err)
	}
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := b.Leader(ctx); err != nil || l.Node != "node-a" || l.Term != ta.Term() {
		t.Fatalf("leader = %+v, %v; want node-a at term %d", l, err, ta.Term())
	}
	if l := within.Recv(t, 10*time.Second, seen, "node-a's term observed"); l.Node != "node-a" || l.Term != ta.Term() {
		t.Fatalf("observed %+v", l)
	}
	// b campaigns while a leads; a renews through several TTLs.
	type result struct {
		term *Term
		err  error
	}
	won := make(chan result, 1)
	go func() { tb, err := b.Campaign(ctx); won <- result{tb, err} }()
	waitFor(t, 5*time.Second, "three renewals", func() bool { return counters.RenewalsOK.Load() >= 3 })
	if err := ta.Check(); err != nil {
		t.Fatalf("leader's check while renewing: %v", err)
	}
	select {
	case r := <-won:
		t.Fatalf("b won (%v) while a was renewing", r.err)
	default:
	}
	if err := ta.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ta.Check(); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("check after resign: %v", err)
	}
	r := within.Recv(t, 10*time.Second, won, "node-b's campaign after node-a resigned")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.term.Term() <= ta.Term() {
		t.Fatalf("new term %d not above %d", r.term.Term(), ta.Term())
	}
	for l := range seen {
		if l.Node == "node-b" {
			if l.Term != r.term.Term() {
				t.Fatalf("observed b at term %d, want %d", l.Term, r.term.Term())
			}
			break
		}
	}
	if err := r.term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if counters.TermsWon.Load() != 2 || counters.TermsLost.Load() != 0 {
		t.Fatalf("terms won %d lost %d; want 2 and 0 (resigning is not losing)", counters.TermsWon.Load(), counters.TermsLost.Load())
	}
}

func TestLeaseAcquireRenewRelease(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	_, js := connect(t, srv.ClientURL())
	cfg := testConfig()
	ls, err := newLeases(ctx, js, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ls.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	l, err := ls.Acquire(ctx, "run-1", 10, "w1")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "renewals", func() bool { return ls.cfg.Counters.RenewalsOK.Load() >= 4 })
	if err := l.Check(); err != nil || l.Degraded() {
		t.Fatalf("held lease: check %v degraded %v", err, l.Degraded())
	}
	if v, ok := w.Live("run-1"); !ok || v.Owner != "w1" || v.Epoch != 10 {
		t.Fatalf("watcher sees %+v %v", v, ok)
	}
	// Same epoch, another owner: refused at once. Adopting our own: fine.
	if _, err := ls.Acquire(ctx, "run-1", 10, "w2"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("second owner of one epoch: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), ErrReleased) {
		t.Fatalf("released lease err = %v", l.Err())
	}
	ev := recvEvent(t, w.Events(), 5*testTTL, "the released lease")
	if ev.Kind != LeaseReleased || ev.Lease.Run != "run-1" {
		t.Fatalf("event %+v; want released", ev)
	}
	// A release deletes the key, so the next epoch is taken at once, without waiting for
	// the TTL.
	if cur, err := latestOf(ctx, js, LeaseBucket, "run-1"); err != nil || (cur.found && !cur.deleted) {
		t.Fatalf("after release the key is %+v (%v); want it deleted", cur, err)
	}
	l2, err := ls.Acquire(ctx, "run-1", 11, "w2")
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A holder that dies (stops renewing without releasing) loses its lease after the TTL:
// the watcher reports it lapsed, and a newer epoch's acquire, which waited, succeeds.
func TestLeaseLapsesAndNewerEpochTakesOver(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	_, js := connect(t, srv.ClientURL())
	cfg := testConfig()
	ls, err := newLeases(ctx, js, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ls.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	dead := Config{TTL: testTTL, Hooks: &testhooks.Hooks{NoRenew: true, NoKillSwitch: true}}
	lsDead, err := newLeases(ctx, js, dead, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Timed from before the dead holder's create was sent: its key cannot lapse on the
	// server before a TTL from here, however slow the machine.
	start := time.Now()
	old, err := lsDead.Acquire(ctx, "run-2", 20, "dead")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Release(ctx)
	select {
	case <-w.Ready():
	case <-ctx.Done():
		t.Fatal("the watcher never read the existing leases")
	}
	if _, err := ls.Acquire(ctx, "run-2", 19, "late"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("acquire of an older epoch: %v, want ErrLeaseHeld at once", err)
	}
	l, err := ls.Acquire(ctx, "run-2", 21, "next")
	if err != nil {
		t.Fatal(err)
	}
	// The lower bound is the server's TTL (with a margin for how exactly it expires);
	// the upper one only says that it did not take many TTLs.
	if took := time.Since(start); took < testTTL*9/10 || took > 10*testTTL {
		t.Fatalf("newer epoch acquired %s after the dead holder's create; want after its TTL (%s), and not many TTLs", took, testTTL)
	}
	ev := recvEvent(t, w.Events(), 5*testTTL, "the dead holder's lapse")
	if ev.Kind != LeaseLapsed || ev.Lease.Owner != "dead" {
		t.Fatalf("event %+v; want the dead holder's lease lapsed", ev)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Partition, with real NATS and the real clock: a holder behind a proxy that starts
// dropping traffic. Its renewals fail, and its kill switch fires at its trust deadline,
// before the server lets another owner take the run's lease (which a contender, trying
// from the cut on, then does). The exact times are TestKillSwitchAtTheTrustDeadline's, on
// a fake clock; here only the order, which has a third of the TTL to spare.
func TestPartitionFiresKillSwitch(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	p := startProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
	_, jsCut := connect(t, p.url(), nats.Timeout(time.Second))
	_, js := connect(t, srv.ClientURL())
	cfg := Config{TTL: 2 * time.Second, Backoff: fastBackoff}
	lsCut, err := newLeases(ctx, jsCut, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := newLeases(ctx, js, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	held, err := lsCut.Acquire(ctx, "run-3", 30, "cut")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	waitFor(t, 10*time.Second, "two renewals through the proxy", func() bool { return lsCut.cfg.Counters.RenewalsOK.Load() >= 2 })
	p.dropped.Store(true)
	// The contender: it waits (Acquire retries with backoff) until the key lapses.
	next, err := ls.Acquire(ctx, "run-3", 31, "other")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	select {
	case <-held.Done():
	default:
		t.Fatal("another owner took the lease while the cut holder still trusted it: the kill switch did not fire first")
	}
	if !errors.Is(held.Err(), ErrLeaseLost) || !errors.Is(held.Check(), ErrLeaseLost) {
		t.Fatalf("cause %v, check %v; want ErrLeaseLost", held.Err(), held.Check())
	}
	if lsCut.cfg.Counters.LeasesLost.Load() != 1 || lsCut.cfg.Counters.RenewalsFailed.Load() == 0 {
		t.Fatalf("counters: lost %d failed renewals %d", lsCut.cfg.Counters.LeasesLost.Load(), lsCut.cfg.Counters.RenewalsFailed.Load())
	}
}

// Degraded: a renewal that gets no answer (the network holds it) marks the lease
// degraded until one succeeds.
func TestDegradedWhileUnanswered(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	p := startProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
	_, jsCut := connect(t, p.url())
	cfg := Config{TTL: 3 * time.Second, Backoff: fastBackoff}
	ls, err := newLeases(ctx, jsCut, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ls.Acquire(ctx, "run-4", 40, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	p.hold()
	waitFor(t, 3*time.Second, "degraded", l.Degraded)
	p.release()
	waitFor(t, 3*time.Second, "recovered", func() bool { return !l.Degraded() })
	if l.Err() != nil || ls.cfg.Counters.Degraded() <= 0 {
		t.Fatalf("after recovery: err %v degraded time %s", l.Err(), ls.cfg.Counters.Degraded())
	}
}

// The poison pill, with real NATS and the real clock: with FastFail, a holder cut off
// from NATS calls Exit(75), after its kill switch and before the server lets another
// owner take its lease. (Exactly when: TestPoisonPillAt70PercentOfTheTTL, on a fake
// clock; here only the order, with 30% of the TTL to spare.)
func TestPoisonPillExits(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	p := startProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
	_, jsCut := connect(t, p.url())
	_, js := connect(t, srv.ClientURL())
	type exit struct {
		code       int
		killSwitch bool // the lease's context was cancelled before the exit
	}
	exited := make(chan exit, 1)
	var held atomic.Pointer[Lease]
	cfg := Config{TTL: 2 * time.Second, Backoff: fastBackoff, FastFail: true}
	cfg.Exit = func(code int) { exited <- exit{code, held.Load().Err() != nil} }
	ls, err := newLeases(ctx, jsCut, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	other, err := newLeases(ctx, js, Config{TTL: cfg.TTL, Backoff: fastBackoff}, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ls.Acquire(ctx, "run-5", 50, "w")
	if err != nil {
		t.Fatal(err)
	}
	held.Store(l)
	defer l.Release(ctx)
	p.dropped.Store(true)
	next, err := other.Acquire(ctx, "run-5", 51, "other")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	select {
	case e := <-exited:
		if e.code != DefaultExitCode || !e.killSwitch {
			t.Fatalf("exit %d (after the kill switch: %v); want %d after it", e.code, e.killSwitch, DefaultExitCode)
		}
	default:
		t.Fatal("another owner took the lease before the poison pill fired")
	}
}

// Start/stop stress: many acquire/release and campaign/resign cycles, concurrently,
// under -race; goleak (TestMain) checks nothing is left behind.
func TestStartStopStress(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 60*time.Second)
	_, js := connect(t, srv.ClientURL())
	ls, err := newLeases(ctx, js, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				l, err := ls.Acquire(ctx, "stress-"+string(rune('a'+g)), int64(i+1), "w")
				if err != nil {
					t.Error(err)
					return
				}
				_ = l.Check()
				if err := l.Release(ctx); err != nil {
					t.Error(err)
				}
				_ = l.Release(ctx) // twice is fine
			}
		}(g)
	}
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			e, err := newElector(ctx, js, "node-"+string(rune('a'+g)), testConfig(), 1)
			if err != nil {
				t.Error(err)
				return
			}
			for i := 0; i < 10; i++ {
				term, err := e.Campaign(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if err := term.Resign(ctx); err != nil {
					t.Error(err)
				}
			}
		}(g)
	}
	// Campaigns abandoned by their context end cleanly too.
	for i := 0; i < 5; i++ {
		e, _ := newElector(ctx, js, "quitter", testConfig(), 1)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		if term, err := e.Campaign(cctx); err == nil {
			_ = term.Resign(ctx)
		}
		cancel()
	}
	within.Group(t, 30*time.Second, &wg, "the holders and the campaigners")
}

// A takeover (the key now holds another owner's value) ends the holder's lease at its
// next renewal, with ErrLeaseLost: it is not mistaken for a late renewal of its own.
func TestTakeoverDetectedAtNextRenewal(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	_, js := connect(t, srv.ClientURL())
	ls, err := newLeases(ctx, js, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ls.Acquire(ctx, "run-6", 60, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if _, err := ls.kv.Put(ctx, "run-6", []byte(`{"run":"run-6","epoch":61,"owner":"thief"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(10 * testTTL):
		t.Fatal("the takeover went unnoticed")
	}
	// Noticed by a renewal (refused: "moved on"), not by the trust window running out.
	// When exactly: TestRefusedRenewalEndsTheLeaseAtOnce, on a fake clock.
	if !errors.Is(l.Err(), ErrLeaseLost) || !strings.Contains(l.Err().Error(), "moved on") {
		t.Fatalf("cause = %v; want the refused renewal's", l.Err())
	}
}

// A retried acquire that finds the key holding its own value (an earlier create that
// timed out here but reached the server) adopts it by renewing it, so that its trust
// begins at a send it knows precedes the write the server's TTL runs from.
func TestAcquireAdoptsItsOwnKeyByRenewingIt(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	_, js := connect(t, srv.ClientURL())
	ls, err := newLeases(ctx, js, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(LeaseValue{Run: "run-7", Epoch: 70, Owner: "w"})
	put, err := ls.kv.Create(ctx, "run-7", raw) // the create that "timed out"
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	l, err := ls.Acquire(ctx, "run-7", 70, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	cur, err := latestOf(ctx, js, LeaseBucket, "run-7")
	if err != nil || cur.rev <= put || string(cur.value) != string(raw) {
		t.Fatalf("after adopting: key at revision %d (%v), created at %d; want a renewal of the same value", cur.rev, err, put)
	}
	if d := l.TrustDeadline(); d.Before(before.Add(ls.cfg.LeaseClock().TrustWindow())) {
		t.Fatalf("trust deadline %s is before the adopting renewal's send + 2/3 TTL", time.Until(d))
	}
}

// A run ID that cannot be a KV key fails Acquire at once with ErrInvalidRun (permanent),
// instead of retrying until the caller's deadline and being retried again by the task.
func TestAcquireInvalidRunIsPermanent(t *testing.T) {
	srv := startNATS(t)
	_, js := connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ls, err := newLeases(ctx, js, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = ls.Acquire(ctx, "a.", 1, "w")
	if !errors.Is(err, ErrInvalidRun) {
		t.Fatalf("Acquire(\"a.\") = %v, want ErrInvalidRun", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("Acquire waited for its deadline (%s) before failing", time.Since(began))
	}
}
