package epoch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// The holder's timing on a fake clock. A keeper (the goroutine of a Lease or Term)
// renews an in-memory bucket whose answers the test controls, and the test moves the
// clock itself: to just before each boundary of the Trust (trust.go) and to it, and
// asserts what happened at exactly that time. These are the decisions the real-time
// tests (epoch_test.go, process_test.go) only bound from outside; the keeper acts on
// absolute times from its Trust, so an Advance that comes before the keeper has armed
// its timer changes nothing.
//
// Policy of every test here (TTL 3s): renew every 1s, renewal timeout 500ms, trust
// window 2s, poison pill at 2.1s.

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

const fakeTTL = 3 * time.Second

// memBucket holds one key in memory. Its mode says how it answers an update: "answer"
// (at once), "hold" (no answer until answer is called or the attempt gives up), or
// "fail" (at once, with no responders: a dead connection).
type memBucket struct {
	port.KV // the methods a keeper never calls
	clk     *clockwork.FakeClock

	mu      sync.Mutex
	rev     uint64
	value   []byte
	mode    string
	answer  chan struct{} // closed by answerHeld
	sends   []time.Time   // the fake time of every update attempt
	deletes int
}

func newMemBucket(clk *clockwork.FakeClock, value []byte) *memBucket {
	return &memBucket{clk: clk, rev: 1, value: value, mode: "answer", answer: make(chan struct{})}
}

func (b *memBucket) Bucket() string { return "mem" }

func (b *memBucket) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	b.mu.Lock()
	b.sends = append(b.sends, b.clk.Now())
	mode, answer := b.mode, b.answer
	b.mu.Unlock()
	switch mode {
	case "hold":
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-answer:
		}
	case "fail":
		return 0, nats.ErrNoResponders
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if rev != b.rev {
		return 0, port.ErrWrongRevision
	}
	b.rev++
	b.value = value
	return b.rev, nil
}

func (b *memBucket) Delete(ctx context.Context, key string, rev uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if rev != b.rev {
		return port.ErrWrongRevision
	}
	b.deletes++
	b.rev++
	b.value = nil
	return nil
}

func (b *memBucket) Latest(ctx context.Context, key string) (port.Entry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	op := port.OpPut
	if b.value == nil {
		op = port.OpDelete
	}
	return port.Entry{Key: key, Revision: b.rev, Value: b.value, Op: op}, nil
}

func (b *memBucket) setMode(mode string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mode = mode
}

// answerHeld answers the attempts being held, and every later one.
func (b *memBucket) answerHeld() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mode = "answer"
	close(b.answer)
}

// steal writes another owner's value: the next renewal is refused.
func (b *memBucket) steal() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rev++
	b.value = []byte("thief")
}

func (b *memBucket) sent() []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Time(nil), b.sends...)
}

// fakeHolder is one keeper on a fake clock and an in-memory bucket, created at t0.
type fakeHolder struct {
	t   *testing.T
	clk *clockwork.FakeClock
	b   *memBucket
	cfg *Config
	k   *keeper

	mu    sync.Mutex
	until time.Time // what the keeper's goroutine waits for on the clock; zero while it runs
}

func newFakeHolder(t *testing.T, cfg Config, term bool) *fakeHolder {
	t.Helper()
	return newFakeHolderStartedAt(t, cfg, term, 0)
}

// newFakeHolderStartedAt is newFakeHolder whose goroutine starts when the clock is at
// t0+start: a create sent at t0 that took that long to answer.
func newFakeHolderStartedAt(t *testing.T, cfg Config, term bool, start time.Duration) *fakeHolder {
	t.Helper()
	clk := clockwork.NewFakeClockAt(t0)
	cfg.TTL, cfg.Clock = fakeTTL, clk
	cfg, err := cfg.ready()
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHolder{t: t, clk: clk, b: newMemBucket(clk, []byte("ours")), cfg: &cfg}
	h.k = makeKeeper(context.Background(), h.b, "r", []byte("ours"), 1, t0, h.cfg, "lease of run r", term,
		func() { cfg.Counters.LeasesLost.Add(1) })
	h.k.parked = func(until time.Time) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.until = until
	}
	clk.Advance(start)
	go h.k.run()
	t.Cleanup(func() { _ = h.k.release(context.Background(), ErrReleased) })
	return h
}

func (h *fakeHolder) lease() *Lease { return &Lease{k: h.k} }

// parked waits until the keeper's goroutine waits on the clock until t0+d: it has done
// everything due before and decided that its next step is then.
func (h *fakeHolder) parked(d time.Duration) {
	h.t.Helper()
	var until time.Time
	waitFor(h.t, 10*time.Second, fmt.Sprintf("the keeper to wait until %s (clock at %s)", d, h.clk.Now().Sub(t0)), func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		until = h.until
		return until.Equal(t0.Add(d))
	})
}

// parkedForever waits until the keeper's goroutine waits for nothing on the clock.
func (h *fakeHolder) parkedForever() {
	h.t.Helper()
	waitFor(h.t, 10*time.Second, fmt.Sprintf("the keeper to wait for nothing on the clock (clock at %s)", h.clk.Now().Sub(t0)), func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.until.Equal(never)
	})
}

// at moves the fake clock to t0+d.
func (h *fakeHolder) at(d time.Duration) {
	h.t.Helper()
	if now := h.clk.Now().Sub(t0); d < now {
		h.t.Fatalf("the clock is at %s already, cannot go back to %s", now, d)
	}
	h.clk.Advance(t0.Add(d).Sub(h.clk.Now()))
}

// sends are the times of the bucket's update attempts, as offsets from t0.
func (h *fakeHolder) sends() []time.Duration {
	var out []time.Duration
	for _, s := range h.b.sent() {
		out = append(out, s.Sub(t0))
	}
	return out
}

func (h *fakeHolder) wantSends(want ...time.Duration) {
	h.t.Helper()
	if got := h.sends(); fmt.Sprint(got) != fmt.Sprint(want) {
		h.t.Fatalf("renewal attempts at %v; want exactly %v", got, want)
	}
}

func (h *fakeHolder) wantTrustUntil(d time.Duration) {
	h.t.Helper()
	if got := h.k.trust().Deadline().Sub(t0); got != d {
		h.t.Fatalf("trust deadline %s; want %s", got, d)
	}
}

func (h *fakeHolder) waitDone(what string) {
	h.t.Helper()
	select {
	case <-h.k.ctx.Done():
	case <-time.After(10 * time.Second):
		h.t.Fatalf("the holder's context was not cancelled within 10s (real time) of the clock reaching %s: %s", h.clk.Now().Sub(t0), what)
	}
}

func (h *fakeHolder) wantNotDone() {
	h.t.Helper()
	select {
	case <-h.k.ctx.Done():
		h.t.Fatalf("at %s: ownership ended: %v", h.clk.Now().Sub(t0), context.Cause(h.k.ctx))
	default:
	}
}

func (h *fakeHolder) waitLoopEnded() {
	h.t.Helper()
	select {
	case <-h.k.done:
	case <-time.After(10 * time.Second):
		h.t.Fatal("the keeper's goroutine did not end within 10s")
	}
}

func (h *fakeHolder) wantOpen(open bool) {
	h.t.Helper()
	err := h.k.check()
	if open && err != nil {
		h.t.Fatalf("at %s: check = %v; want the trust window open", h.clk.Now().Sub(t0), err)
	}
	if !open && !errors.Is(err, ErrLeaseLost) {
		h.t.Fatalf("at %s: check = %v; want ErrLeaseLost", h.clk.Now().Sub(t0), err)
	}
}

const ns = time.Nanosecond

// Renewals go out exactly every RenewInterval after the last successful one was sent,
// and each moves the trust deadline to 2/3 TTL after its send: a holder that renews
// keeps its lease however long it lives.
func TestRenewalCadenceOnAFakeClock(t *testing.T) {
	h := newFakeHolder(t, Config{}, false)
	h.wantTrustUntil(2 * time.Second)
	var want []time.Duration
	for i := 1; i <= 9; i++ {
		due := time.Duration(i) * time.Second
		h.parked(due)
		h.at(due - ns)
		h.wantOpen(true)
		h.wantSends(want...)
		h.at(due)
		h.parked(due + time.Second) // the next renewal; the trust deadline is later
		want = append(want, due)
		h.wantSends(want...)
		h.wantTrustUntil(due + 2*time.Second)
	}
	if h.lease().Degraded() || h.cfg.Counters.RenewalsOK.Load() != 9 || h.cfg.Counters.RenewalsFailed.Load() != 0 {
		t.Fatalf("a renewing holder: degraded %v, renewals ok %d failed %d", h.lease().Degraded(),
			h.cfg.Counters.RenewalsOK.Load(), h.cfg.Counters.RenewalsFailed.Load())
	}
	h.wantNotDone()
	if got := h.lease().TrustDeadline(); !got.Equal(t0.Add(11 * time.Second)) {
		t.Fatalf("Lease.TrustDeadline = t0+%s; want t0+11s", got.Sub(t0))
	}
}

// The kill switch: renewals go unanswered from 1s on; the first attempt is given up at
// 1.5s (degraded) and retried at once; the retry is given up at the trust deadline,
// 2s, when the context is cancelled with ErrLeaseLost. Not a nanosecond earlier.
func TestKillSwitchAtTheTrustDeadline(t *testing.T) {
	h := newFakeHolder(t, Config{}, false)
	h.b.setMode("hold")
	h.parked(time.Second)
	h.at(time.Second - ns)
	h.wantSends()
	h.at(time.Second)
	h.parked(1500 * time.Millisecond) // the attempt, in flight until its timeout
	h.wantSends(time.Second)
	h.at(1500*time.Millisecond - ns)
	h.wantOpen(true)
	if h.lease().Degraded() {
		t.Fatal("degraded before the attempt's timeout")
	}
	h.at(1500 * time.Millisecond)
	h.parked(2 * time.Second) // the retry, sent at once, given up at the trust deadline
	if since := h.k.trust().DegradedSince().Sub(t0); !h.lease().Degraded() || since != 1500*time.Millisecond {
		t.Fatalf("degraded %v since %s; want since 1.5s", h.lease().Degraded(), since)
	}
	h.wantSends(time.Second, 1500*time.Millisecond)
	h.at(2*time.Second - ns)
	h.wantOpen(true)
	h.wantNotDone()
	h.at(2 * time.Second)
	h.waitDone("the kill switch at 2s")
	if err := context.Cause(h.k.ctx); !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "2/3 of the TTL") {
		t.Fatalf("cause %v; want ErrLeaseLost for the trust window", err)
	}
	h.wantOpen(false)
	h.wantTrustUntil(2 * time.Second)
	h.waitLoopEnded()
	h.wantSends(time.Second, 1500*time.Millisecond)
	if h.cfg.Counters.LeasesLost.Load() != 1 {
		t.Fatalf("%d leases lost; want 1", h.cfg.Counters.LeasesLost.Load())
	}
	if h.lease().Degraded() {
		t.Fatal("a lost lease still reports degraded")
	}
	if d := h.cfg.Counters.Degraded(); d != 500*time.Millisecond {
		t.Fatalf("degraded time %s; want 500ms (1.5s to 2s)", d)
	}
}

// The poison pill: with FastFail, a holder whose renewals go unanswered has its kill
// switch fire at 2s and exits (BeforeExit, then Exit(75)) at exactly 2.1s. A holder that
// released its lost lease before then does not exit.
func TestPoisonPillAt70PercentOfTheTTL(t *testing.T) {
	for _, release := range []bool{false, true} {
		t.Run(fmt.Sprintf("released-first=%v", release), func(t *testing.T) {
			type exit struct {
				code           int
				at, beforeExit time.Duration
			}
			exits := make(chan exit, 1)
			var beforeExit time.Duration = -1 // written and read by the keeper's goroutine
			var clk *clockwork.FakeClock
			cfg := Config{FastFail: true}
			cfg.BeforeExit = func() { beforeExit = clk.Now().Sub(t0) }
			cfg.Exit = func(code int) { exits <- exit{code, clk.Now().Sub(t0), beforeExit} }
			h := newFakeHolder(t, cfg, false)
			clk = h.clk
			h.b.setMode("hold")
			h.parked(time.Second)
			h.at(time.Second)
			h.parked(1500 * time.Millisecond)
			h.at(1500 * time.Millisecond)
			h.parked(2 * time.Second)
			h.at(2 * time.Second)
			h.waitDone("the kill switch at 2s")
			h.parked(2100 * time.Millisecond) // the poison pill
			if release {
				if err := h.lease().Release(context.Background()); err != nil {
					t.Fatal(err)
				}
				h.at(time.Hour)
				select {
				case e := <-exits:
					t.Fatalf("exit %d at %s after the lease was released", e.code, e.at)
				default: // Release waited for the keeper's goroutine, the only caller of Exit
				}
				return
			}
			h.at(2100*time.Millisecond - ns)
			select {
			case e := <-exits:
				t.Fatalf("exit %d at %s, before 2.1s", e.code, e.at)
			default:
			}
			h.at(2100 * time.Millisecond)
			select {
			case e := <-exits:
				if e.code != DefaultExitCode || e.at != 2100*time.Millisecond || e.beforeExit != e.at {
					t.Fatalf("exit %d at %s, BeforeExit at %s; want %d at 2.1s, BeforeExit just before", e.code, e.at, e.beforeExit, DefaultExitCode)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no exit within 10s (real time) of the clock reaching 2.1s")
			}
		})
	}
}

// Degraded: an attempt unanswered for the renewal timeout (500ms) makes the holder
// degraded, exactly then; the retry that is answered ends it, and the trust window
// then runs from the retry's send.
func TestDegradedUntilARenewalIsAnswered(t *testing.T) {
	h := newFakeHolder(t, Config{}, false)
	h.b.setMode("hold")
	h.parked(time.Second)
	h.at(time.Second)
	h.parked(1500 * time.Millisecond)
	h.at(1500*time.Millisecond - ns)
	if h.lease().Degraded() {
		t.Fatal("degraded before the renewal timeout")
	}
	h.at(1500 * time.Millisecond)
	h.parked(2 * time.Second)
	if !h.lease().Degraded() {
		t.Fatal("not degraded after the renewal timeout")
	}
	h.wantSends(time.Second, 1500*time.Millisecond)
	h.at(1700 * time.Millisecond)
	h.b.answerHeld() // the retry sent at 1.5s is answered at 1.7s
	h.parked(2500 * time.Millisecond)
	if h.lease().Degraded() {
		t.Fatal("still degraded after an answered renewal")
	}
	if d := h.cfg.Counters.Degraded(); d != 200*time.Millisecond {
		t.Fatalf("degraded time %s; want 200ms (1.5s to 1.7s)", d)
	}
	h.wantTrustUntil(3500 * time.Millisecond) // 2s after the retry's send
	h.at(2500 * time.Millisecond)
	h.parked(3500 * time.Millisecond)
	h.wantSends(time.Second, 1500*time.Millisecond, 2500*time.Millisecond)
	h.wantNotDone()
}

// A dead connection (every attempt fails at once) is retried every quarter of the
// renewal timeout, 125ms, not spun on, until the trust deadline.
func TestFailingRenewalsArePaced(t *testing.T) {
	h := newFakeHolder(t, Config{}, false)
	h.b.setMode("fail")
	var want []time.Duration
	for at := time.Second; at < 2*time.Second; at += 125 * time.Millisecond {
		h.parked(at)
		h.at(at - ns)
		h.wantSends(want...)
		h.at(at)
		h.parked(at + 125*time.Millisecond)
		want = append(want, at)
		h.wantSends(want...)
		if !h.lease().Degraded() {
			t.Fatalf("not degraded after the attempt at %s failed", at)
		}
	}
	h.at(2 * time.Second)
	h.waitDone("the kill switch at 2s")
	h.waitLoopEnded()
	h.wantSends(want...) // 8: 1s, 1.125s, ... 1.875s
}

// A renewal refused because the key holds another owner's value ends the lease at that
// renewal, at once, with "moved on": not at the trust deadline.
func TestRefusedRenewalEndsTheLeaseAtOnce(t *testing.T) {
	h := newFakeHolder(t, Config{}, false)
	h.parked(time.Second)
	h.at(500 * time.Millisecond)
	h.b.steal()
	h.wantOpen(true)
	h.at(time.Second)
	h.waitDone("the refused renewal at 1s")
	if err := context.Cause(h.k.ctx); !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "moved on") {
		t.Fatalf("cause %v; want ErrLeaseLost, moved on", err)
	}
	h.wantTrustUntil(time.Second)
	h.wantOpen(false)
}

// A term ends on any failed renewal, an unanswered one included: at the attempt's
// timeout, 1.5s, not at the trust deadline.
func TestTermEndsAtItsFirstFailedRenewal(t *testing.T) {
	h := newFakeHolder(t, Config{}, true)
	term := &Term{k: h.k, term: 7, node: "n"}
	h.b.setMode("hold")
	h.parked(time.Second)
	h.at(time.Second)
	h.parked(1500 * time.Millisecond)
	h.at(1500*time.Millisecond - ns)
	if err := term.Check(); err != nil {
		t.Fatalf("check before the attempt's timeout: %v", err)
	}
	h.at(1500 * time.Millisecond)
	h.waitDone("the term's failed renewal at 1.5s")
	if err := term.Check(); !errors.Is(err, ErrNotLeader) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("check = %v; want ErrNotLeader wrapping ErrLeaseLost", err)
	}
	if got := term.TrustDeadline().Sub(t0); got != 1500*time.Millisecond {
		t.Fatalf("term's trust deadline %s after it ended at 1.5s", got)
	}
}

// A pause (Freeze: no renewal, no kill switch, as under SIGSTOP or a long GC) costs the
// lease exactly when it ends at or past the trust deadline: offset + pause >= 2s after
// the last renewal. So with renewals every TTL/3 (1s), a pause under TTL/3 never costs
// it, one of 2/3 TTL (2s) or more always does, and between it depends on where in the
// renewal cycle it falls (docs/leases.md, the TTL trade-off; TestLeaseTTLTradeoff checks
// the two ends with real processes and SIGSTOP).
func TestPauseCostsTheLeaseOnlyPastTheTrustWindow(t *testing.T) {
	pauses := []time.Duration{450 * time.Millisecond, 900 * time.Millisecond, 1200 * time.Millisecond,
		1500 * time.Millisecond, 1800 * time.Millisecond, 2*time.Second - ns, 2 * time.Second, 2250 * time.Millisecond, 3 * time.Second}
	offsets := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second - ns}
	var table strings.Builder
	for _, pause := range pauses {
		fmt.Fprintf(&table, "\n  pause %-12s", pause)
		for _, offset := range offsets {
			lost := pauseAt(t, offset, pause)
			if want := offset+pause >= 2*time.Second; lost != want {
				t.Errorf("a pause of %s at %s into the renewal cycle: lost = %v, want %v", pause, offset, lost, want)
			}
			fmt.Fprintf(&table, " %s", map[bool]string{false: "kept", true: "LOST"}[lost])
		}
	}
	t.Logf("TTL %s, pause at offset %v after a renewal:%s", fakeTTL, offsets, table.String())
}

// pauseAt freezes a holder for pause, offset after its renewal at 1s, and reports
// whether it lost its lease.
func pauseAt(t *testing.T, offset, pause time.Duration) (lost bool) {
	h := newFakeHolder(t, Config{}, false)
	defer func() { _ = h.k.release(context.Background(), ErrReleased) }()
	h.parked(time.Second)
	h.at(time.Second) // a renewal sent at 1s: trust until 3s
	h.parked(2 * time.Second)
	h.at(time.Second + offset)
	h.lease().Freeze(pause)
	end := time.Second + offset + pause
	h.parked(end)
	h.at(end)
	if offset+pause >= 2*time.Second {
		select {
		case <-h.k.ctx.Done():
			return true
		case <-time.After(10 * time.Second):
			return false
		}
	}
	// It renews at once if a renewal fell due during the pause, else when due.
	next := max(end, 2*time.Second)
	if end < next {
		h.parked(next)
		h.at(next)
	}
	h.parked(next + time.Second)
	return h.k.check() != nil
}

// Check is a pure reading of the clock: it fails from the trust deadline on even when
// the keeper's goroutine has not run yet, and the deadline Lease.TrustDeadline reports is
// the one Check uses.
func TestCheckReadsTheClockItself(t *testing.T) {
	h := newFakeHolder(t, Config{}, false)
	h.b.setMode("hold")
	l := h.lease()
	if got := l.TrustDeadline(); !got.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("TrustDeadline t0+%s; want t0+2s", got.Sub(t0))
	}
	h.clk.Advance(2*time.Second - ns)
	if err := l.Check(); err != nil {
		t.Fatalf("check 1ns before the deadline: %v", err)
	}
	h.clk.Advance(ns)
	if err := l.Check(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("check at the deadline: %v", err)
	}
}

// The lease guards' switches (internal/base/testhooks), as the negative controls of
// docs/testing.md use them: without renewals the kill switch still fires at the trust
// deadline; without the kill switch an unrenewed holder never notices, and stops
// trying once its window has closed (no spin); with neither it does nothing at all.
func TestLeaseGuardSwitchesOnAFakeClock(t *testing.T) {
	t.Run("NoRenew", func(t *testing.T) {
		h := newFakeHolder(t, Config{Hooks: &testhooks.Hooks{NoRenew: true}}, false)
		h.parked(2 * time.Second) // no renewal: only the kill switch
		h.at(2*time.Second - ns)
		h.wantNotDone()
		h.at(2 * time.Second)
		h.waitDone("the kill switch at 2s")
		h.wantSends()
	})
	t.Run("NoKillSwitch", func(t *testing.T) {
		h := newFakeHolder(t, Config{Hooks: &testhooks.Hooks{NoKillSwitch: true}}, false)
		h.b.setMode("hold")
		h.parked(time.Second) // the renewal only
		h.at(time.Second)
		h.parked(1500 * time.Millisecond)
		h.at(1500 * time.Millisecond)
		h.parked(2 * time.Second)
		h.at(2 * time.Second)
		h.parkedForever() // the attempt given up at 2s, and then nothing to wait for
		h.at(time.Hour)
		h.wantSends(time.Second, 1500*time.Millisecond)
		h.wantNotDone()
		if err := h.k.check(); err != nil {
			t.Fatalf("the control's check an hour later: %v; want nil (it never notices)", err)
		}
	})
	t.Run("NoRenew+NoKillSwitch", func(t *testing.T) {
		h := newFakeHolder(t, Config{Hooks: &testhooks.Hooks{NoRenew: true, NoKillSwitch: true}}, false)
		h.parkedForever() // no timer at all
		h.at(time.Hour)
		h.wantSends()
		h.wantNotDone()
		if err := h.k.check(); err != nil {
			t.Fatalf("the control's check an hour later: %v; want nil", err)
		}
	})
}

// A holder whose create took longer than the trust window to answer starts with its
// window closed: its kill switch fires at once, and it never renews.
func TestHolderStartedPastItsWindowIsLostAtOnce(t *testing.T) {
	h := newFakeHolderStartedAt(t, Config{}, false, 2*time.Second)
	h.waitDone("a holder started past its trust deadline")
	if err := context.Cause(h.k.ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("cause %v; want ErrLeaseLost", err)
	}
	h.waitLoopEnded()
	h.wantSends()
}
