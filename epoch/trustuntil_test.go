package epoch

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/base/testhooks"
)

// A lease's TrustUntil (what exec steps' inits hold as their deadline: steps.Input.
// TrustUntil) is 2/3 TTL after the last renewal's send, moves on with each renewal,
// and is the moment the kill switch fires: cut off from NATS, the lease is lost no
// sooner than its last TrustUntil, and the lease's key lapses on the server no sooner
// than TTL/3 after it (here: another holder acquires only then). Without the kill
// switch (a control's hook) there is no deadline.
func TestTrustUntilIsTheKillSwitchAndMovesWithRenewals(t *testing.T) {
	srv := startNATS(t)
	ctx := ctxT(t, 30*time.Second)
	p := startProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
	_, jsCut := connect(t, p.url())
	_, js := connect(t, srv.ClientURL())
	ls, err := newLeases(ctx, jsCut, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	acquired := time.Now()
	l, err := ls.Acquire(ctx, "run-t", 7, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	first := l.TrustUntil()
	trust := 2 * testTTL / 3
	if first.Before(acquired) || first.After(time.Now().Add(trust)) {
		t.Fatalf("TrustUntil %s after the acquire; want within 2/3 TTL (%s)", first.Sub(acquired), trust)
	}
	waitFor(t, 2*testTTL, "a renewal to move TrustUntil on", func() bool { return l.TrustUntil().After(first) })

	p.dropped.Store(true) // cut off: no renewal succeeds from now on
	last := l.TrustUntil()
	select {
	case <-l.Done():
	case <-time.After(2 * testTTL):
		t.Fatal("the lease was not lost")
	}
	lost := time.Now()
	if !errors.Is(l.Err(), ErrLeaseLost) {
		t.Fatalf("lease ended with %v; want lost", l.Err())
	}
	if got := l.TrustUntil(); !got.Equal(last) && got.Before(lost) {
		last = got // a renewal that got through just before the cut
	}
	if lost.Before(last) {
		t.Fatalf("the kill switch fired %s before TrustUntil", last.Sub(lost))
	}
	other, err := newLeases(ctx, js, testConfig(), 1)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := other.Acquire(ctx, "run-t", 8, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(ctx)
	if took := time.Since(last); took < testTTL/3-50*time.Millisecond {
		t.Fatalf("another holder got the lease %s after TrustUntil; want no sooner than TTL/3 (%s)", took, testTTL/3)
	}

	noSwitch := testConfig()
	noSwitch.Hooks = &testhooks.Hooks{NoKillSwitch: true}
	ls3, err := newLeases(ctx, js, noSwitch, 1)
	if err != nil {
		t.Fatal(err)
	}
	l3, err := ls3.Acquire(ctx, "run-u", 9, "c")
	if err != nil {
		t.Fatal(err)
	}
	defer l3.Release(ctx)
	if d := l3.TrustUntil(); !d.IsZero() {
		t.Fatalf("TrustUntil without a kill switch: %s; want none", d)
	}
}
