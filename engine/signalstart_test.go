package engine

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

const signalStartYAML = `
name: ledger
inputs:
  date: {type: string}
steps:
  - {name: closed, uses: wait, with: {signal: ledger-closed}}
  - {name: pay, needs: [closed], uses: noop}
`

// Signal-with-start: a run that does not exist is started with its signal in one log
// message (its submit and its signal share a sequence: no node sees the run without its
// signal, and no crash between them loses it), and its wait takes the signal; a run that
// exists is signalled, its inputs unchanged. Refused with nothing written: a run of
// another workflow under the ID, a run that ended, a signal name no wait step takes, an
// ID flow keeps, a workflow that does not exist, inputs it does not take.
func TestSignalWithStart(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, signalStartYAML)
	apply(t, e, "name: other\nsteps:\n  - {name: w, uses: wait, with: {signal: ledger-closed}}\n")
	ctx := ctxT(t, 60*time.Second)

	first := SignalOptions{Data: []byte(`{"rows": 3}`), ID: "closed-1204"}
	started, err := e.SignalWithStart(ctx, "close-1204", "ledger-closed", "ledger", map[string]any{"date": "2026-12-04"}, first)
	if err != nil || !started {
		t.Fatalf("signal-with-start of a new run: started %v, %v", started, err)
	}
	end, err := e.WaitRun(ctx, "close-1204")
	if err != nil || end.Status != checkpoint.StatusSucceeded {
		t.Fatalf("the run started with its signal: %v %+v", err, end)
	}
	v, err := e.Run("close-1204")
	if err != nil {
		t.Fatal(err)
	}
	var submitSeq, signalSeq uint64
	for _, ev := range v.Events {
		switch ev.Kind {
		case checkpoint.KindSubmit:
			submitSeq = ev.Seq
		case checkpoint.KindSignal:
			signalSeq = ev.Seq
		}
	}
	if submitSeq == 0 || submitSeq != signalSeq {
		t.Fatalf("submit at sequence %d, signal at %d: want one message", submitSeq, signalSeq)
	}
	if len(v.Run.Inbox) != 1 || v.Run.Inbox[0].ConsumedBy != "closed" || string(v.Run.Inbox[0].Data) != `{"rows":3}` {
		t.Fatalf("inbox %+v: want the one signal, with its data, taken by step closed", v.Run.Inbox)
	}

	// The same call again after the run ended (its first answer lost): answered as the
	// first was, nothing written.
	before := e.store.Applied()
	if started, err := e.SignalWithStart(ctx, "close-1204", "ledger-closed", "ledger", map[string]any{"date": "2026-12-04"}, first); err != nil || started {
		t.Fatalf("the same signal-with-start again after the run ended: started %v, %v; want it answered as applied", started, err)
	}
	if e.store.Applied() != before {
		t.Fatalf("the repeated signal wrote to the log")
	}

	// An existing run is signalled; its inputs stay.
	id, err := e.StartRun(ctx, "ledger", map[string]any{"date": "2026-12-05"}, RunOptions{ID: "close-1205"})
	if err != nil {
		t.Fatal(err)
	}
	awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
	started, err = e.SignalWithStart(ctx, id, "ledger-closed", "ledger", map[string]any{"date": "1999-01-01"}, SignalOptions{})
	if err != nil || started {
		t.Fatalf("signal-with-start of a waiting run: started %v, %v; want it signalled, not started", started, err)
	}
	end, err = e.WaitRun(ctx, id)
	if err != nil || end.Status != checkpoint.StatusSucceeded || string(end.Inputs) != `{"date":"2026-12-05"}` {
		t.Fatalf("the existing run: %v %+v; want it succeeded with its own inputs", err, end)
	}

	refused := []struct {
		name, id, signal, workflow string
		inputs                     map[string]any
		want                       error
	}{
		{"a run of another workflow", "close-1205b", "ledger-closed", "other", nil, checkpoint.ErrConflict},
		{"a run that ended", "close-1204", "ledger-closed", "ledger", map[string]any{"date": "x"}, checkpoint.ErrConflict},
		{"a signal no wait takes", "close-1206", "ledger-opened", "ledger", map[string]any{"date": "x"}, ErrBadInput},
		{"an ID flow keeps", "close.1206", "ledger-closed", "ledger", map[string]any{"date": "x"}, nil},
		{"no such workflow", "close-1206", "ledger-closed", "nope", nil, ErrBadInput},
		{"an input it does not take", "close-1206", "ledger-closed", "ledger", map[string]any{"date": "x", "extra": "y"}, ErrBadInput},
		{"a missing input", "close-1206", "ledger-closed", "ledger", nil, ErrBadInput},
	}
	if _, err := e.StartRun(ctx, "other", nil, RunOptions{ID: "close-1205b"}); err != nil {
		t.Fatal(err)
	}
	// Parked: its own entries (assign, claim, park) are in the log before the refusals.
	// (Read before it was, the log moved on under them: a fresh-clone CI run.)
	awaitRun(t, e, "close-1205b", 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
	refused[0].workflow = "ledger" // close-1205b is a run of other
	before = e.store.Applied()
	for _, c := range refused {
		started, err := e.SignalWithStart(ctx, c.id, c.signal, c.workflow, c.inputs, SignalOptions{})
		if err == nil || started || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: started %v, %v; want refused (%v)", c.name, started, err, c.want)
		}
	}
	// Nothing of the refused IDs after before (the node's own periodic entries may be).
	for _, c := range refused {
		msgs, _, _, err := e.Ops().DumpLog(ctx, before+1, c.id, MaxDumpLimit)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if len(m.Message.Entries) > 0 {
				t.Fatalf("%s: the refusal wrote to the log at %d: %+v", c.name, m.Seq, m.Message.Entries)
			}
		}
	}
	if _, err := e.Run("close-1206"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("close-1206 after refused starts: %v; want no run", err)
	}
}

// Callers racing to signal-with-start one run: one of them starts it, every signal
// reaches it (each its own), and the run exists once.
func TestSignalWithStartRacesStartOnce(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: gather
steps:
  - {name: w, uses: wait, with: {signal: part}}
`)
	ctx := ctxT(t, 60*time.Second)
	const callers = 8
	var wg sync.WaitGroup
	startedBy := make(chan int, callers)
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started, err := e.SignalWithStart(ctx, "gather-1", "part", "gather", nil, SignalOptions{ID: fmt.Sprintf("part-%d", i)})
			if err != nil {
				errs <- err
			}
			if started {
				startedBy <- i
			}
		}()
	}
	wg.Wait()
	close(errs)
	close(startedBy)
	for err := range errs {
		t.Fatal(err)
	}
	if n := len(startedBy); n != 1 {
		t.Fatalf("%d callers started the run; want one", n)
	}
	v, err := e.Run("gather-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Run.Inbox) != callers {
		t.Fatalf("the run holds %d signals; want %d, one per caller", len(v.Run.Inbox), callers)
	}
	if end, err := e.WaitRun(ctx, "gather-1"); err != nil || end.Status != checkpoint.StatusSucceeded {
		t.Fatalf("%v %+v", err, end)
	}
}
