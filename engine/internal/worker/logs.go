package worker

import (
	"context"
	"log/slog"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/steplog"
	"github.com/flowrun/flow/workflow"
)

// noMasking is the masking's control for a process (-ldflags "-X
// github.com/flowrun/flow/engine/internal/worker.noMasking=1"; empty in every release
// build): a run's secret inputs appear in what its steps print and in their outputs.
var noMasking string

// Masker is the masker of a run's secrets: the values of its inputs the workflow
// declares `secret: true` (nil: none).
func Masker(wf *workflow.Workflow, r *checkpoint.Run) *steplog.Masker {
	if wf == nil || r == nil {
		return nil
	}
	inputs, _ := decodeJSON(r.Inputs).(map[string]any)
	var values []any
	for _, in := range wf.Inputs {
		if v, ok := inputs[in.Name]; ok && in.Secret && v != nil {
			values = append(values, v)
		}
	}
	return steplog.NewMasker(values)
}

// masker is the run's masker, or none with the control on.
func (x *runExec) masker() *steplog.Masker {
	if noMasking != "" || x.p.hooks.NoMasking.Load() {
		return nil
	}
	return x.mask
}

// maskedError is a step's error with the run's secrets masked in its text (an exec
// step's error carries the end of its stderr); errors.Is and As see the step's error.
type maskedError struct {
	err  error
	text string
}

func (e maskedError) Error() string { return e.text }
func (e maskedError) Unwrap() error { return e.err }

func maskError(m *steplog.Masker, err error) error {
	if err == nil || m == nil {
		return err
	}
	if t := m.String(err.Error()); t != err.Error() {
		return maskedError{err, t}
	}
	return err
}

// teeHandler sends a Go step's log records to the node's log and to the step's.
type teeHandler struct {
	node slog.Handler
	step *steplog.Writer
	text slog.Handler // renders a record as a line for the step's log
}

func newTeeLogger(node *slog.Logger, w *steplog.Writer) *slog.Logger {
	text := slog.NewTextHandler(w.Stream("log"), &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{} // each line has its time already
		}
		return a
	}})
	return slog.New(teeHandler{node: node.Handler(), step: w, text: text})
}

func (h teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.node.Enabled(ctx, l) || l >= slog.LevelInfo
}

func (h teeHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.node.Enabled(ctx, r.Level) {
		_ = h.node.Handle(ctx, r.Clone())
	}
	if r.Level >= slog.LevelInfo {
		_ = h.text.Handle(ctx, r)
	}
	return nil
}

func (h teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{node: h.node.WithAttrs(as), step: h.step, text: h.text.WithAttrs(as)}
}

func (h teeHandler) WithGroup(name string) slog.Handler {
	return teeHandler{node: h.node.WithGroup(name), step: h.step, text: h.text.WithGroup(name)}
}
