package cli

// The run commands: start, watch, get, list, history, verify and the changes.

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/tracing"
)

func (a *app) start(wf, id, traceparent string, inputs []string, wait bool, priority *int) error {
	if traceparent == "" {
		traceparent = a.getenv("TRACEPARENT") // as exec steps get it: a step's flowctl joins its trace
	}
	if err := tracing.ValidTraceparent(traceparent); err != nil {
		return usage("--traceparent: %v", err)
	}
	in, err := keyValues("--input", inputs)
	if err != nil {
		return err
	}
	started, err := ask(a, func(c *client.Client, ctx context.Context) (string, error) {
		return c.StartRun(ctx, wf, client.StartOptions{ID: id, Inputs: in, Traceparent: traceparent, Priority: priority})
	})
	if err != nil {
		return err
	}
	if !wait {
		return a.print(map[string]string{"id": started}, func(out io.Writer) { fmt.Fprintln(out, started) })
	}
	r, err := a.watchRun(started, nil)
	if err != nil {
		return err
	}
	if err := a.print(map[string]string{"id": r.ID, "status": r.Status}, func(out io.Writer) {
		fmt.Fprintf(out, "%s\t%s\n", r.ID, r.Status)
	}); err != nil {
		return err
	}
	if r.Status != "succeeded" {
		return failed("run %s %s: %s", r.ID, r.Status, r.Error)
	}
	return nil
}

// watchRun follows a run until it ends, calling progress (if not nil) on each change.
func (a *app) watchRun(id string, progress func(client.Run)) (client.Run, error) {
	return ask(a, func(c *client.Client, ctx context.Context) (client.Run, error) { return c.WatchRun(ctx, id, progress) })
}

func (a *app) watch(id string) error {
	r, err := a.watchRun(id, func(r client.Run) {
		if a.output == "table" {
			fmt.Fprintf(a.out, "%s  %s\n", time.Now().Format("15:04:05"), r.Progress())
		}
	})
	if err != nil {
		return err
	}
	if a.output != "table" {
		if err := a.print(r, nil); err != nil {
			return err
		}
	}
	if r.Status != "succeeded" {
		return failed("run %s %s%s", r.ID, r.Status, suffix(r.Error))
	}
	return nil
}

// utcTime is an RFC 3339 time of the wire as the tables show it: to the second, in UTC,
// saying so.
func utcTime(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return dash(s)
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// clock is the time of day of an RFC 3339 time, in UTC (the column says so).
func clock(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return "-"
	}
	return t.UTC().Format("15:04:05")
}

// took is how long from start to end: to the millisecond under a second, else to the
// tenth of a second; "-" without both.
func took(start, end *string) string {
	if start == nil || end == nil {
		return "-"
	}
	a, err1 := time.Parse(time.RFC3339Nano, *start)
	b, err2 := time.Parse(time.RFC3339Nano, *end)
	if err1 != nil || err2 != nil || b.Before(a) {
		return "-"
	}
	d := b.Sub(a)
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

func suffix(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

func (a *app) get(op func(*client.Client, context.Context, string) (client.Run, error), id string) error {
	return show(a, func(c *client.Client, ctx context.Context) (client.Run, error) { return op(c, ctx, id) }, runTable)
}

func runTable(w io.Writer, r client.Run) {
	fmt.Fprintf(w, "RUN\t%s\n", r.ID)
	fmt.Fprintf(w, "WORKFLOW\t%s v%d (%s)\n", r.Workflow, r.Version, r.Trigger)
	fmt.Fprintf(w, "STATUS\t%s%s\n", r.Status, suffix(r.Error))
	if r.Waiting != nil {
		since := ""
		if r.Waiting.Since != "" {
			since = " since " + utcTime(r.Waiting.Since)
		}
		fmt.Fprintf(w, "WAITING\t%s%s\n", waitingLine(r), since)
		if a := r.Waiting.ApprovedBy; len(a) > 0 {
			fmt.Fprintf(w, "APPROVED BY\t%s\n", strings.Join(a, ", ")) // only those who count
		}
		fmt.Fprintf(w, "UNTIL\t%s\n", untilLine(r.Waiting))
	}
	if r.StartedBy != "" {
		fmt.Fprintf(w, "STARTED BY\t%s\n", r.StartedBy)
	}
	if p := r.Parent; p != nil {
		fmt.Fprintf(w, "PARENT\t%s (step %s)\n", p.Run, p.Step)
	}
	if len(r.Children) > 0 {
		fmt.Fprintf(w, "CHILDREN\t%s\n", strings.Join(r.Children, ", "))
	}
	if len(r.Outputs) > 0 {
		fmt.Fprintf(w, "OUTPUTS\t%s\n", r.Outputs)
	}
	fmt.Fprintf(w, "EPOCH\t%d (changes %d of max %d)\n", r.Epoch, r.EpochChanges, r.MaxEpochs)
	if r.ScheduledAt != "" {
		fmt.Fprintf(w, "SCHEDULED\t%s\n", utcTime(r.ScheduledAt))
	}
	fmt.Fprintf(w, "CREATED\t%s\n", utcTime(r.CreatedAt))
	if r.StartedAt != nil {
		fmt.Fprintf(w, "STARTED\t%s\n", utcTime(*r.StartedAt))
	}
	if r.EndedAt != nil {
		fmt.Fprintf(w, "ENDED\t%s (took %s)\n", utcTime(*r.EndedAt), took(r.StartedAt, r.EndedAt))
	}
	if d := r.Deadline; d != nil {
		missed := ""
		if d.Missed {
			missed = " (missed)"
		}
		fmt.Fprintf(w, "DEADLINE\t%s%s\n", utcTime(d.At), missed)
	}
	if len(r.Handlers) > 0 {
		fmt.Fprintf(w, "HANDLERS\t%s\n", strings.Join(r.Handlers, ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "STEP\tSTATUS\tATTEMPTS\tITEMS\tEPOCH\tSTARTED (UTC)\tTOOK")
	for _, s := range r.Steps {
		items := "-"
		if s.Items > 0 {
			items = fmt.Sprintf("%d/%d", s.ItemsDone, s.Items)
		}
		started := "-"
		if s.StartedAt != nil {
			started = clock(*s.StartedAt)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\t%s\t%s\n", s.Name, s.Status, s.Attempts, items, s.Epoch, started, took(s.StartedAt, s.EndedAt))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "EPOCH\tOWNER\tREASON\tAT (UTC)")
	for _, e := range r.Epochs {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", e.Epoch, dash(e.Owner), e.Reason, shortTime(e.At))
	}
	if len(r.Fenced) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "FENCED STEP\tITEM\tEPOCH\tCURRENT\tOWNER")
		for _, f := range r.Fenced {
			fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\n", f.Step, f.Item, f.Epoch, f.CurrentEpoch, f.Owner)
		}
	}
	waitsTable(w, r)
}

// listTable: CHG is epoch_changes, CREATED the month-day time in UTC (the header says
// so).
func listTable(w io.Writer, runs []client.Run) {
	fmt.Fprintln(w, "RUN\tWORKFLOW\tSTATUS\tTRIGGER\tCHG\tCREATED UTC")
	for _, r := range runs {
		created := "-"
		if t, err := time.Parse(time.RFC3339, r.CreatedAt); err == nil {
			created = t.UTC().Format("01-02 15:04")
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.Workflow, r.Status, dash(r.Trigger), r.EpochChanges, created)
	}
}

func (a *app) history(id string) error {
	return show(a, func(c *client.Client, ctx context.Context) ([]client.Event, error) { return c.History(ctx, id) }, historyTable)
}

func historyTable(w io.Writer, evs []client.Event) {
	fmt.Fprintln(w, "SEQ\tKIND\tSTEP\tITEM\tEPOCH\tOWNER\tOUTCOME\tBY")
	for _, e := range evs {
		item := "-"
		if e.Kind == "commit" || e.Kind == "fail" {
			item = fmt.Sprint(e.Item)
		}
		outcome := e.Outcome
		if e.Detail != "" { // what was sent, decided, waited for, retried, missed, started
			outcome += ": " + e.Detail
		}
		// BY: the user who asked for it, as the NATS server said (with auth: docs/security.md).
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.Seq, e.Kind, dash(e.Step), item, e.Epoch, dash(e.Owner), outcome, dash(e.Actor))
	}
}

func (a *app) verify(id string) error {
	v, err := ask(a, func(c *client.Client, ctx context.Context) (client.Verification, error) { return c.Verify(ctx, id) })
	if err != nil {
		return err
	}
	if err := a.print(v, func(w io.Writer) {
		for _, c := range v.Checked {
			fmt.Fprintf(w, "checked: %s\n", c)
		}
		for _, x := range v.Violations {
			fmt.Fprintf(w, "VIOLATION: %s\n", x)
		}
		if v.OK {
			fmt.Fprintf(w, "run %s: ok\n", v.ID)
		}
	}); err != nil {
		return err
	}
	if !v.OK {
		return failed("run %s violates %d invariant(s)", id, len(v.Violations))
	}
	return nil
}

func (a *app) change(op func(*client.Client, context.Context, string) (client.Change, error), id string) error {
	res, err := ask(a, func(c *client.Client, ctx context.Context) (client.Change, error) { return op(c, ctx, id) })
	if err != nil {
		return err
	}
	return a.print(res, func(w io.Writer) { fmt.Fprintf(w, "%s %s\n", res.ID, res.Status) })
}
