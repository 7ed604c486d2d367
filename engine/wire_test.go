package engine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
)

// The API answers the engine's errors with the codes of docs/client.md: wireError says
// which, through the wraps the errors pass on their way up, and leaves the rest to be
// the API's internal error, unchanged.
func TestWireErrorCodes(t *testing.T) {
	notFound := &checkpoint.NotFoundError{What: "run", Name: "r1"}
	plain := errors.New("the disk is on fire")
	for _, c := range []struct {
		err       error
		code, msg string
	}{
		{fmt.Errorf("engine: workflow: %w", notFound), client.CodeNotFound, `run "r1" not found`},
		{fmt.Errorf("%w: run %q (cancel at sequence 9)", checkpoint.ErrNotFound, "r1"), client.CodeNotFound, `checkpoint: not found: run "r1" (cancel at sequence 9)`},
		{fmt.Errorf("%w: no workflow %q", ErrBadInput, "w"), client.CodeBadRequest, `no workflow "w"`},
		{fmt.Errorf("%w: status %q", checkpoint.ErrInvalidEntry, "x"), client.CodeBadRequest, `checkpoint: invalid entry: status "x"`},
		{fmt.Errorf("%w: r1", checkpoint.ErrRunExists), client.CodeConflict, "checkpoint: run exists: r1"},
		{fmt.Errorf("%w: ended", checkpoint.ErrConflict), client.CodeConflict, "checkpoint: conflict with run state: ended"},
	} {
		var ce *client.Error
		if err := wireError(c.err); !errors.As(err, &ce) || ce.Code != c.code || ce.Message != c.msg {
			t.Errorf("%v: answered %#v; want %s %q", c.err, err, c.code, c.msg)
		}
	}
	// The control: errors with no code of their own pass unchanged (internal).
	for _, err := range []error{plain, ErrNotStarted, &checkpoint.FencedError{Run: "r1"}, nil} {
		if got := wireError(err); got != err {
			t.Errorf("%v: answered %#v; want it unchanged", err, got)
		}
	}
}
