package engine

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/audit"
)

// One person's signal data is bounded per node (issue 36): a burst of 2 MiB, then 1 MiB
// a second; another person keeps their own allowance; an allowance refills with time.
func TestSignalDataPerPersonRate(t *testing.T) {
	now := time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)
	e := &Engine{signalBytes: newSignalLimiter()}
	e.signalBytes.SetClock(func() time.Time { return now })
	mb := 900 << 10
	for i := range 2 {
		if err := e.takeSignalBytes("mallory", mb); err != nil {
			t.Fatalf("signal %d of the burst: %v", i, err)
		}
	}
	err := e.takeSignalBytes("mallory", mb)
	if !errors.Is(err, ErrTooMuchSignalData) || !strings.Contains(err.Error(), "mallory sent more than") {
		t.Fatalf("a third 900 KB signal at once: %v; want refused, naming the person", err)
	}
	if err := e.takeSignalBytes("ann", mb); err != nil {
		t.Fatalf("another person: %v", err)
	}
	if err := e.takeSignalBytes("mallory", 0); err != nil {
		t.Fatalf("a signal without data: %v", err)
	}
	now = now.Add(time.Second)
	if err := e.takeSignalBytes("mallory", mb); err != nil {
		t.Fatalf("a second later: %v", err)
	}
	now = now.Add(2 * time.Minute)
	if err := e.takeSignalBytes("nobody", 1); err != nil || e.signalBytes.Keys() != 1 {
		t.Fatalf("idle allowances are dropped: %v, %d kept", err, e.signalBytes.Keys())
	}
}

// Through the engine: the refusal is before anything is written, as too_many_requests on
// the wire.
func TestSignalFloodIsRefusedBeforeTheLog(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, "name: gate\nsteps:\n  - {name: w, uses: wait, with: {signal: never}}\n  - {name: j, needs: [w], uses: wait, with: {signal: junk}}\n")
	ctx := ctxT(t, 30*time.Second)
	id, err := e.StartRun(ctx, "gate", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{id}
	for range 2 {
		more, err := e.StartRun(ctx, "gate", nil, RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, more)
	}
	for _, id := range ids {
		awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
	}
	frozen := time.Now() // no refill while the signals are sent, however slow the machine
	e.signalBytes.SetClock(func() time.Time { return frozen })
	mal := audit.WithActor(ctx, "mallory")
	big := json.RawMessage(`"` + strings.Repeat("x", 700_000) + `"`)
	var refused error
	for i, id := range ids { // each fits its run's inbox; together they pass the burst
		if err := e.Signal(mal, id, "junk", SignalOptions{Data: big}); err != nil {
			refused = err
			if i != 2 {
				t.Fatalf("signal %d: %v", i, err)
			}
		}
	}
	for i, id := range ids {
		r, err := e.store.Run(id)
		if err != nil || len(r.Inbox) != map[bool]int{true: 1, false: 0}[i < 2] {
			t.Fatalf("run %d's inbox holds %d signals (%v): want the two signals allowed and the refused one nowhere", i, len(r.Inbox), err)
		}
	}
	if !errors.Is(refused, ErrTooMuchSignalData) {
		t.Fatalf("five 700 KB signals at once: %v; want the rate refusal", refused)
	}
	if w := wireError(refused); !strings.Contains(w.Error(), "mallory sent more than") {
		t.Fatalf("on the wire: %v", w)
	}
}
