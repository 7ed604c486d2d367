package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/steplog"
)

// stepLogSink is the node's step logs' writer (steplog.Sink): it keeps nothing when the
// node has no step logs' port.
func (e *Engine) stepLogSink() *steplog.Sink {
	if e.ports.StepLogs == nil {
		return nil
	}
	return steplog.NewSink(steplog.Config{Logs: e.ports.StepLogs, Node: e.cfg.NodeID, Limit: e.cfg.StepLogLimit,
		Now: e.cfg.Clock.Now, Logger: e.log})
}

// removeStepLogs removes retired runs' step logs (the leader's retention, after their
// retire entries are in the log).
func (e *Engine) removeStepLogs(ctx context.Context, runs []string) {
	if e.ports.StepLogs == nil {
		return
	}
	for _, id := range runs {
		if err := e.ports.StepLogs.Remove(ctx, id); err != nil {
			e.log.Warn("retention: could not remove a retired run's step logs (they stay until the stream's cap drops them)", "run", id, "err", err)
			return
		}
	}
}

// stepLogsPage is how many lines one run.logs answer holds at most (whole messages).
const stepLogsPage = 2000

// RunLogs reads what run's steps printed after cursor after ("" from the first line),
// narrowed to a step, an item (nil: any) and an attempt (0: any): a page of lines, the
// cursor for the next, and whether the run has ended (a follower stops once an ended
// run's page is empty).
func (a *API) RunLogs(ctx context.Context, run, step string, item *int, attempt int, after string) (client.StepLogPage, error) {
	f := steplog.Filter{Step: step, Item: item, Attempt: attempt}
	e := a.e
	r, err := e.store.Run(run)
	if err != nil {
		return client.StepLogPage{}, wireError(err)
	}
	if step != "" && !slices.Contains(r.Steps, step) {
		return client.StepLogPage{}, wireError(fmt.Errorf("%w: run %s has no step %q (its steps: %s)", ErrBadInput, run, step, strings.Join(r.Steps, ", ")))
	}
	var seq uint64
	if after != "" {
		if seq, err = strconv.ParseUint(after, 10, 64); err != nil {
			return client.StepLogPage{}, wireError(fmt.Errorf("%w: cursor %q is not one run logs returned: pass the last page's next unchanged, or none for the first line", ErrBadInput, after))
		}
	}
	page := client.StepLogPage{Lines: []client.LogLine{}, Next: after, Ended: r.Status.Terminal()}
	if e.ports.StepLogs == nil {
		return page, nil
	}
	lines, next, err := steplog.Read(ctx, e.ports.StepLogs, run, seq, f, stepLogsPage)
	if err != nil && len(lines) == 0 {
		return client.StepLogPage{}, fmt.Errorf("read the step logs of %s: %w", run, err)
	}
	page.Lines = append(page.Lines, lines...)
	if next > 0 {
		page.Next = strconv.FormatUint(next, 10)
	}
	return page, nil
}

// maskInputs shows r's secret inputs (its workflow's inputs declared `secret: true`) as
// steplog.Mask: a viewer reads a run's inputs, not its secrets.
func (e *Engine) maskInputs(out *client.Run, r *checkpoint.Run) {
	if len(out.Inputs) == 0 {
		return
	}
	wf, err := e.specs.OfRun(r)
	if err != nil || wf == nil {
		return
	}
	var secret []string
	for _, in := range wf.Inputs {
		if in.Secret {
			secret = append(secret, in.Name)
		}
	}
	if len(secret) == 0 {
		return
	}
	var inputs map[string]json.RawMessage
	if json.Unmarshal(out.Inputs, &inputs) != nil {
		return
	}
	for _, name := range secret {
		if _, ok := inputs[name]; ok {
			inputs[name] = json.RawMessage(strconv.Quote(steplog.Mask))
		}
	}
	if b, err := json.Marshal(inputs); err == nil {
		out.Inputs = b
	}
}
