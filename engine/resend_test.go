package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/resend"
)

// A second start of a run ID derived from a nonce (internal/base/resend), as a forger
// who found a nonce for an existing ID would send, is the conflict and leaves the running
// run's epochs as they were. A try sent again (Flow-Try) that finds this start's own run
// is answered with its ID; with other inputs it is the conflict too. (The node sends a
// derived ID down the leader's short path only while no run of it is there; with that
// check removed this test still passes: the log refuses the assign riding with the
// refused submit, so the check only spares the write, and the log is the guard.)
func TestDerivedIDsTakeTheShortPathOnlyWhenNew(t *testing.T) {
	e := startEngine(t, nil)
	waitLeader(t, e)
	apply(t, e, "name: hold\ninputs:\n  n: {type: int, default: 1}\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 1h}\n")
	ctx := ctxT(t, 30*time.Second)
	nonce := resend.NewNonce()
	id := resend.RunIDFor(time.Now(), nonce)
	first := RunOptions{ID: id, Try: resend.Try{Nonce: nonce, Number: 1}}
	if got, err := e.StartRun(ctx, "hold", nil, first); err != nil || got != id {
		t.Fatalf("start %s: %q %v", id, got, err)
	}
	var before *checkpoint.Run
	for before == nil || before.Status != checkpoint.StatusRunning {
		if ctx.Err() != nil {
			t.Fatalf("run %s not running: %+v", id, before)
		}
		before, _ = e.store.Run(id)
		time.Sleep(10 * time.Millisecond) // polling the local state, with ctx's deadline
	}
	if _, err := e.StartRun(ctx, "hold", nil, first); !errors.Is(err, checkpoint.ErrRunExists) {
		t.Fatalf("a first try of an existing derived ID: %v; want the conflict", err)
	}
	again := RunOptions{ID: id, Try: resend.Try{Nonce: nonce, Number: 2}}
	if got, err := e.StartRun(ctx, "hold", nil, again); err != nil || got != id {
		t.Fatalf("a try sent again of the same start: %q %v; want its ID", got, err)
	}
	if _, err := e.StartRun(ctx, "hold", map[string]any{"n": "2"}, again); !errors.Is(err, checkpoint.ErrRunExists) {
		t.Fatalf("a try sent again with other inputs: %v; want the conflict", err)
	}
	after, err := e.store.Run(id)
	if err != nil || after.Epoch != before.Epoch || len(after.Epochs) != len(before.Epochs) || after.Status != checkpoint.StatusRunning {
		t.Fatalf("the run after the repeated starts: %+v %v; want it as it was (epoch %d, %d epochs)", after, err, before.Epoch, len(before.Epochs))
	}
}
