package engine

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/steps"
)

// Apply checks each step's with with the node's registry: a registered Go kind's
// checker and the built-ins' refuse bad input at file:line:column, and write nothing.
func TestApplyChecksWith(t *testing.T) {
	reg := steps.NewRegistry(0)
	payout := steps.WithCheck(steps.Func(func(context.Context, steps.Input) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	}), func(with map[string]any) error {
		if _, ok := with["account"].(string); !ok && !steps.IsTemplate(with["account"]) {
			return &steps.WithError{Path: []string{"account"}, Msg: "is required", Hint: "the ledger account to pay from"}
		}
		return nil
	})
	if err := reg.Register("payout", payout); err != nil {
		t.Fatal(err)
	}
	e := startEngine(t, func(c *Config) { c.Registry = reg })
	ctx := ctxT(t, 10*time.Second)
	before := e.store.Applied()
	for file, c := range map[string]struct{ yaml, want string }{
		"payout.yaml": {"name: pay\nsteps:\n  - name: a\n    uses: payout\n    with:\n      acount: x\n", `payout.yaml:6:7: step "a" (payout): with.account: is required`},
		"sleep.yaml":  {"name: nap\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: soon}\n", `sleep.yaml:5:22: step "a" (sleep): with.duration: "soon" is not a duration`},
	} {
		if _, err := e.ApplyWorkflow(ctx, file, []byte(c.yaml)); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v; want %q", file, err, c.want)
		}
	}
	if e.store.Applied() != before {
		t.Fatalf("bad input wrote to the log (%d -> %d)", before, e.store.Applied())
	}
	apply(t, e, "name: pay\nsteps:\n  - name: a\n    uses: payout\n    with: {account: ops}\n")
}
