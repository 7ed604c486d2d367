package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/ident"
)

// SignalWithStart signals run id, starting it first as a run of workflow (with inputs)
// if no run id exists: `flowctl run signal RUN NAME --start WORKFLOW`. When the run is
// new, its submit and the signal are one log message, applied together: no node ever
// sees the run without its signal, and no crash, failover or retried request between a
// start and a signal loses the signal. started says whether this call's submit made the
// run (false: it existed, or another caller's start got there first in the log; then the
// inputs are not used, and the signal goes to the run that is there).
//
// Refused with nothing written: a run id that exists as a run of another workflow
// (checkpoint.ErrConflict), or that has ended (checkpoint.ErrConflict, as a signal is);
// an id flow keeps for the runs it derives; a workflow that does not exist; inputs it
// does not take; a signal name no wait step of the workflow waits for (ErrBadInput).
func (e *Engine) SignalWithStart(ctx context.Context, id, name, workflowName string, inputs map[string]any, opts SignalOptions) (started bool, err error) {
	if err := e.running(); err != nil {
		return false, err
	}
	if !ident.ValidID(id) {
		return false, fmt.Errorf("%w: run ID %q: %s", ErrBadInput, id, ident.IDRule)
	}
	r, err := e.store.Run(id)
	switch {
	case err == nil:
		if r.Workflow != workflowName {
			return false, fmt.Errorf("%w: run %s is a run of workflow %s, not %s: signal it without --start, or choose another run ID", checkpoint.ErrConflict, id, r.Workflow, workflowName)
		}
		return false, e.Signal(ctx, id, name, opts)
	case !errors.Is(err, checkpoint.ErrNotFound):
		return false, err
	}
	w, err := e.Workflow(workflowName, 0)
	if err != nil {
		if errors.Is(err, checkpoint.ErrNotFound) {
			return false, fmt.Errorf("%w: no workflow %q: apply it first (flowctl workflow apply -f FILE)", ErrBadInput, workflowName)
		}
		return false, err
	}
	if err := e.checkChosenID(id); err != nil {
		return false, err
	}
	at := e.cfg.Now()
	resolved, err := ResolveInputs(w, inputs, at)
	if err != nil {
		return false, err
	}
	submit, err := e.submitOf(ctx, w, id, resolved, at, RunOptions{Trigger: opts.Trigger})
	if err != nil {
		return false, err
	}
	signal := checkpoint.Entry{Kind: checkpoint.KindSignal, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID,
		Signal: &checkpoint.Signal{Name: name, ID: opts.ID, Data: opts.Data}}
	if err := signal.Validate(); err != nil {
		return false, err
	}
	if err := signalTakenBy(w, id, name); err != nil {
		return false, err
	}
	if len(opts.Data) > checkpoint.MaxInboxBytes {
		return false, fmt.Errorf("%w: run %s: %d bytes of signal data pass the inbox's limit of %d bytes", checkpoint.ErrConflict, id, len(opts.Data), checkpoint.MaxInboxBytes)
	}
	if err := e.takeSignalBytes(audit.Actor(ctx), len(opts.Data)); err != nil {
		return false, err
	}
	// One message: the log judges each entry on its own, in order. A run made by
	// another start meanwhile refuses this submit (it exists) and takes the signal.
	var verdicts []error
	if e.hooks.SignalStartApart.Load() { // the control: two messages, a moment apart
		verdicts = append(e.clog.Writer.Write(ctx, submit).Results(ctx), e.clog.Writer.Write(ctx, signal).Results(ctx)...)
	} else {
		verdicts = e.clog.Writer.Write(ctx, submit, signal).Results(ctx)
	}
	switch err := verdicts[0]; {
	case err == nil:
		started = true
	case !errors.Is(err, checkpoint.ErrRunExists):
		return false, err
	}
	return started, verdicts[1]
}
