// Package apitest helps tests of the API serve states that the rules forbid: runs
// written while guards were off, for the negative controls of run verify. A test wraps
// its engine's API in a type whose Verify method reads a GuardsOff state, and serves
// that.
package apitest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// GuardsOff is a state of runs in a real Pebble store whose guards h turned off.
// Tests write it with Write and read it with Run.
type GuardsOff struct {
	store *checkpoint.Store
}

// NewGuardsOff opens an empty state (in memory) with the guards h turns off.
func NewGuardsOff(t testing.TB, h *testhooks.Hooks) *GuardsOff {
	t.Helper()
	s, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: vfs.NewMem(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &GuardsOff{store: s}
}

// Run is the run as this state has it.
func (g *GuardsOff) Run(id string) (*checkpoint.RunView, error) { return g.store.View(id) }

// Write applies entries as the next log message and returns its sequence (an assign's
// new epoch) and the entries' verdicts.
func (g *GuardsOff) Write(t testing.TB, entries ...checkpoint.Entry) (uint64, []error) {
	t.Helper()
	datas := make([][]byte, len(entries))
	for i, e := range entries {
		if e.At.IsZero() {
			e.At = checkpointEpoch
		}
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		datas[i] = b
	}
	seq := g.store.Applied() + 1
	verdicts, err := g.store.Apply(seq, checkpoint.EncodeEnvelope("apitest", datas))
	if err != nil {
		t.Fatal(err)
	}
	return seq, verdicts
}

// checkpointEpoch is the time of entries written without one.
var checkpointEpoch = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

// Node is a real engine's API whose run.verify reads State instead of the engine's own
// state: serve it (apiserver.Config.Node) to show what run verify says of runs the rules
// forbid. Every other operation is the engine's.
type Node struct {
	*engine.API
	State *GuardsOff
}

// Verify is engine.VerifyRun of the run as State has it.
func (n Node) Verify(id string) (client.Verification, error) {
	v, err := n.State.Run(id)
	if err != nil {
		return client.Verification{}, err
	}
	return engine.VerifyRun(v), nil
}
