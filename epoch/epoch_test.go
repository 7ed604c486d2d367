package epoch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/internal/backoff"
	"github.com/flowrun/flow/internal/testhooks"
)

var fastBackoff = backoff.Policy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}

func TestConfigValidation(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{TTL: -time.Second}, "must not be negative"},
		{Config{RenewInterval: -1}, "must not be negative"},
		{Config{TTL: 500 * time.Millisecond}, "under 1s"},
		{Config{TTL: 10 * time.Second, RenewInterval: 10 * time.Second}, "shorter than the lease TTL"},
		{Config{TTL: 9 * time.Second, RenewInterval: 7 * time.Second}, "shorter than 2/3 of the lease TTL"},
	} {
		err := c.cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v; want %q", c.cfg, err, c.want)
		}
	}
	var c Config
	if err := c.Validate(); err != nil || c.TTL != 10*time.Second || c.RenewInterval != c.TTL/3 {
		t.Fatalf("defaults: %v %+v", err, c)
	}
	short := Config{TTL: 300 * time.Millisecond, AllowShortTTL: true}
	if err := short.Validate(); err != nil {
		t.Fatalf("a short TTL in test mode: %v", err)
	}
}

func TestElectionAndResign(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	_, js := connect(t, srv.ClientURL())
	counters := &Counters{}
	cfgA, cfgB := testConfig(), testConfig()
	cfgA.Counters, cfgB.Counters = counters, counters
	a, err := NewElector(ctx, js, "node-a", cfgA, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewElector(ctx, js, "node-b", cfgB, 1)
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
	if l := <-seen; l.Node != "node-a" || l.Term != ta.Term() {
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
	r := <-won
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
	ls, err := NewLeases(ctx, js, cfg, 1)
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
	// After a release the next epoch is taken at once.
	start := time.Now()
	l2, err := ls.Acquire(ctx, "run-1", 11, "w2")
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > testTTL/2 {
		t.Fatalf("acquire after release took %s: it waited for the TTL", d)
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
	ls, err := NewLeases(ctx, js, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ls.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	dead := Config{TTL: testTTL, Hooks: &testhooks.Hooks{NoRenew: true, NoKillSwitch: true}}
	lsDead, err := NewLeases(ctx, js, dead, 1)
	if err != nil {
		t.Fatal(err)
	}
	old, err := lsDead.Acquire(ctx, "run-2", 20, "dead")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Release(ctx)
	<-w.Ready()
	start := time.Now()
	if _, err := ls.Acquire(ctx, "run-2", 19, "late"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("acquire of an older epoch: %v, want ErrLeaseHeld at once", err)
	}
	l, err := ls.Acquire(ctx, "run-2", 21, "next")
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took < testTTL/2 || took > 3*testTTL {
		t.Fatalf("newer epoch acquired after %s; want about one TTL (%s)", took, testTTL)
	}
	ev := recvEvent(t, w.Events(), 5*testTTL, "the dead holder's lapse")
	if ev.Kind != LeaseLapsed || ev.Lease.Owner != "dead" {
		t.Fatalf("event %+v; want the dead holder's lease lapsed", ev)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Partition: a holder behind a proxy that starts dropping traffic. Its kill switch fires
// within 2/3 of the TTL; the run's lease is then taken by another owner.
func TestPartitionFiresKillSwitch(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	p := startProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
	_, jsCut := connect(t, p.url(), nats.Timeout(time.Second))
	_, js := connect(t, srv.ClientURL())
	lsCut, err := NewLeases(ctx, jsCut, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := NewLeases(ctx, js, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	held, err := lsCut.Acquire(ctx, "run-3", 30, "cut")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	waitFor(t, 5*time.Second, "a renewal through the proxy", func() bool { return lsCut.cfg.Counters.RenewalsOK.Load() >= 2 })
	cut := time.Now()
	p.dropped.Store(true)
	select {
	case <-held.Done():
	case <-time.After(2 * testTTL):
		t.Fatal("kill switch did not fire")
	}
	fired := time.Since(cut)
	// The window ends 2/3 TTL after the last renewal was sent, which was before the cut.
	if limit := lsCut.cfg.trust() + 100*time.Millisecond; fired > limit { // timer and scheduling slack under -race
		t.Fatalf("kill switch fired %s after the partition; want within 2/3 TTL (%s)", fired, lsCut.cfg.trust())
	}
	if !errors.Is(held.Err(), ErrLeaseLost) || !errors.Is(held.Check(), ErrLeaseLost) {
		t.Fatalf("cause %v, check %v; want ErrLeaseLost", held.Err(), held.Check())
	}
	if lsCut.cfg.Counters.LeasesLost.Load() != 1 || lsCut.cfg.Counters.RenewalsFailed.Load() == 0 {
		t.Fatalf("counters: lost %d failed renewals %d", lsCut.cfg.Counters.LeasesLost.Load(), lsCut.cfg.Counters.RenewalsFailed.Load())
	}
	t.Logf("kill switch fired %s after the partition (TTL %s)", fired.Round(time.Millisecond), testTTL)
	next, err := ls.Acquire(ctx, "run-3", 31, "other")
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
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
	ls, err := NewLeases(ctx, jsCut, cfg, 1)
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

// The poison pill: with FastFail, a holder that cannot renew calls Exit by 70% of TTL.
func TestPoisonPillExits(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	p := startProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
	_, jsCut := connect(t, p.url())
	exited := make(chan int, 1)
	cfg := testConfig()
	cfg.FastFail = true
	cfg.Exit = func(code int) { exited <- code }
	ls, err := NewLeases(ctx, jsCut, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ls.Acquire(ctx, "run-5", 50, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	cut := time.Now()
	p.dropped.Store(true)
	select {
	case code := <-exited:
		if code != DefaultExitCode || time.Since(cut) > time.Duration(float64(testTTL)*poisonFraction)+150*time.Millisecond {
			t.Fatalf("exit %d after %s", code, time.Since(cut))
		}
	case <-time.After(2 * testTTL):
		t.Fatal("poison pill did not fire")
	}
}

// Start/stop stress: many acquire/release and campaign/resign cycles, concurrently,
// under -race; goleak (TestMain) checks nothing is left behind.
func TestStartStopStress(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 60*time.Second)
	_, js := connect(t, srv.ClientURL())
	ls, err := NewLeases(ctx, js, testConfig(), 1)
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
			e, err := NewElector(ctx, js, "node-"+string(rune('a'+g)), testConfig(), 1)
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
		e, _ := NewElector(ctx, js, "quitter", testConfig(), 1)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		if term, err := e.Campaign(cctx); err == nil {
			_ = term.Resign(ctx)
		}
		cancel()
	}
	wg.Wait()
}

// A takeover (the key now holds another owner's value) ends the holder's lease at its
// next renewal, with ErrLeaseLost: it is not mistaken for a late renewal of its own.
func TestTakeoverDetectedAtNextRenewal(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	_, js := connect(t, srv.ClientURL())
	ls, err := NewLeases(ctx, js, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ls.Acquire(ctx, "run-6", 60, "w")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	taken := time.Now()
	if _, err := ls.kv.Put(ctx, "run-6", []byte(`{"run":"run-6","epoch":61,"owner":"thief"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(testTTL):
		t.Fatal("the takeover went unnoticed")
	}
	if !errors.Is(l.Err(), ErrLeaseLost) || !strings.Contains(l.Err().Error(), "moved on") {
		t.Fatalf("cause = %v", l.Err())
	}
	if d := time.Since(taken); d > ls.cfg.RenewInterval+300*time.Millisecond {
		t.Fatalf("noticed after %s; want within one renew interval (%s)", d, ls.cfg.RenewInterval)
	}
}

// A run ID that cannot be a KV key fails Acquire at once with ErrInvalidRun (permanent),
// instead of retrying until the caller's deadline and being retried again by the task.
func TestAcquireInvalidRunIsPermanent(t *testing.T) {
	srv := startNATS(t)
	_, js := connect(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ls, err := NewLeases(ctx, js, testConfig(), 1)
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
