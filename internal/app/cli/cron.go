package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flow/client"
)

// Nightly operations (CONTRACT.md): cron pause, resume, next and
// backfill, and run retry from a step with inputs.

// cronCommands are cron pause, cron resume, cron next and cron backfill.
func (a *app) cronCommands() []*cobra.Command {
	var reason string
	pause := &cobra.Command{Use: "pause WORKFLOW", Short: "Pause a schedule: nothing fires until it is resumed (its ticks are recorded as paused)",
		Args: exactArgs(1, "WORKFLOW"), RunE: func(_ *cobra.Command, args []string) error {
			return a.scheduleChange(func(c *client.Client, ctx context.Context) (client.ScheduleChanged, error) {
				return c.PauseSchedule(ctx, args[0], reason)
			})
		}}
	pause.Flags().StringVar(&reason, "reason", "", "why, shown by cron list and the UI")
	resume := &cobra.Command{Use: "resume WORKFLOW", Short: "Resume a paused schedule (its catchup decides what of the pause fires)",
		Args: exactArgs(1, "WORKFLOW"), RunE: func(_ *cobra.Command, args []string) error {
			return a.scheduleChange(func(c *client.Client, ctx context.Context) (client.ScheduleChanged, error) {
				return c.ResumeSchedule(ctx, args[0])
			})
		}}
	var n int
	next := &cobra.Command{Use: "next WORKFLOW", Short: "The next fire times, in the schedule's timezone and UTC, with daylight-saving days marked",
		Args: exactArgs(1, "WORKFLOW"), RunE: func(_ *cobra.Command, args []string) error { return a.cronNext(args[0], n) }}
	next.Flags().IntVarP(&n, "n", "n", 5, "how many fire times (1 to 1000)")
	var opts client.BackfillOptions
	var priority int
	backfill := &cobra.Command{Use: "backfill WORKFLOW --from TIME --to TIME", Short: "Run each tick of a range that has no run (with the tick's run ID)",
		Long: "Run each tick of a range that has no run, with the tick's own run ID (trigger backfill), so that a tick never\n" +
			"runs twice. TIME is RFC 3339 (2026-11-01T02:00:00Z) or a date (2026-11-01: midnight in the schedule's timezone);\n" +
			"both ends are included and a --to in the future is now.",
		Args: exactArgs(1, "WORKFLOW"), RunE: func(cmd *cobra.Command, args []string) error {
			opts.Priority = nil
			if cmd.Flags().Changed("priority") {
				if priority < client.MinPriority || priority > client.MaxPriority {
					return usage("--priority %d: use %d to %d (higher first)", priority, client.MinPriority, client.MaxPriority)
				}
				opts.Priority = &priority
			}
			return a.backfill(args[0], opts)
		}}
	backfill.Flags().IntVar(&priority, "priority", 0, "the backfill's runs' priority, -100 to 100 (default: the workflow's priority:, else 0): give it below tonight's runs' so they go first")
	backfill.Flags().StringVar(&opts.From, "from", "", "the range's first time (RFC 3339, or a date at midnight in the schedule's timezone)")
	backfill.Flags().StringVar(&opts.To, "to", "", "the range's last time (RFC 3339, or a date)")
	backfill.Flags().BoolVar(&opts.OnlyMissed, "only-missed", false, "only the ticks the schedule recorded without a run (missed, skipped, paused)")
	backfill.Flags().BoolVar(&opts.IncludeFailed, "include-failed", false, "retry the run of a tick that failed or was dead-lettered (its run ID kept), instead of counting it as ran")
	backfill.Flags().IntVar(&opts.MaxParallel, "max-parallel", 0, "at most N of the backfill's runs unfinished at once (0: all at once)")
	backfill.Flags().StringVar(&opts.Order, "order", "oldest", "oldest or newest first")
	backfill.Flags().BoolVar(&opts.DryRun, "dry-run", false, "only list what would run")
	return []*cobra.Command{pause, resume, next, backfill}
}

func (a *app) scheduleChange(op func(*client.Client, context.Context) (client.ScheduleChanged, error)) error {
	res, err := ask(a, op)
	if err != nil {
		return err
	}
	return a.print(res, func(w io.Writer) {
		if !res.Paused {
			fmt.Fprintf(w, "%s resumed\n", res.Workflow)
			return
		}
		fmt.Fprintf(w, "%s paused", res.Workflow)
		if res.Reason != "" {
			fmt.Fprintf(w, ": %s", oneLine(res.Reason))
		}
		fmt.Fprintln(w)
	})
}

func (a *app) cronNext(workflow string, n int) error {
	if n < 1 || n > 1000 {
		return usage("-n %d: use 1 to 1000", n)
	}
	return show(a, func(c *client.Client, ctx context.Context) ([]client.NextTick, error) {
		return c.NextTicks(ctx, workflow, n)
	}, nextTable)
}

// nextTable is cron next's: the local time with its UTC offset, UTC, and whether the
// day changes its UTC offset, the note of what that does below the row.
func nextTable(w io.Writer, ticks []client.NextTick) {
	fmt.Fprintln(w, "LOCAL\tUTC\tDST")
	for _, t := range ticks {
		local, utc := t.Local, t.UTC
		if lt, err := time.Parse(time.RFC3339, t.Local); err == nil {
			local = lt.Format("2006-01-02 15:04:05 -07:00 Mon")
		}
		if ut, err := time.Parse(time.RFC3339, t.UTC); err == nil {
			utc = ut.UTC().Format("2006-01-02 15:04:05Z")
		}
		dst := "-"
		if t.DST != "" {
			dst = "yes"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", local, utc, dst)
		for _, l := range wrap(t.DST, 76) {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
}

// wrap cuts s into lines of at most width characters at spaces.
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > width {
			lines, line = append(lines, line), ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// checkTime says whether a backfill's TIME is RFC 3339 or a date; the server resolves a
// date in the schedule's timezone.
func checkTime(flag, s string) error {
	if s == "" {
		return usage("cron backfill needs %s TIME (RFC 3339, such as 2026-11-01T02:00:00Z, or a date such as 2026-11-01)", flag)
	}
	if _, err := time.Parse(time.RFC3339, s); err == nil {
		return nil
	}
	if _, err := time.Parse(time.DateOnly, s); err == nil {
		return nil
	}
	return usage("%s %q: use RFC 3339 (2026-11-01T02:00:00Z) or a date (2026-11-01, midnight in the schedule's timezone)", flag, s)
}

func (a *app) backfill(workflow string, opts client.BackfillOptions) error {
	if err := checkTime("--from", opts.From); err != nil {
		return err
	}
	if err := checkTime("--to", opts.To); err != nil {
		return err
	}
	if opts.Order != "oldest" && opts.Order != "newest" {
		return usage("--order %q: use oldest or newest", opts.Order)
	}
	if opts.MaxParallel < 0 || opts.MaxParallel > 10000 {
		return usage("--max-parallel %d: use 0 (all at once) to 10000", opts.MaxParallel)
	}
	var ticks []client.BackfillTick
	var err error
	if opts.MaxParallel == 0 || opts.DryRun {
		opts.MaxParallel = 0
		ticks, err = ask(a, func(c *client.Client, ctx context.Context) ([]client.BackfillTick, error) {
			return c.Backfill(ctx, workflow, opts)
		})
	} else {
		ticks, err = a.backfillChunks(workflow, opts)
	}
	if err != nil {
		return err
	}
	return a.print(ticks, func(w io.Writer) { backfillTable(w, ticks) })
}

// backfillChunks backfills the range max-parallel ticks at a time: it lists the ticks
// that would run (a dry run), backfills each chunk of them and waits for its runs to end
// before the next, so that at most max-parallel of the backfill's runs are unfinished at
// once. It answers every tick of the range, in the dry run's order.
func (a *app) backfillChunks(workflow string, opts client.BackfillOptions) ([]client.BackfillTick, error) {
	c, err := a.api()
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	plan := opts
	plan.DryRun, plan.MaxParallel = true, 0
	ticks, err := c.Backfill(ctx, workflow, plan)
	if err != nil {
		return nil, err
	}
	var todo []int
	for i, t := range ticks {
		if t.Outcome == client.BackfillWouldRun || t.Outcome == client.BackfillWouldRetry {
			todo = append(todo, i)
		}
	}
	for chunk := range slices.Chunk(todo, opts.MaxParallel) {
		first, last := ticks[chunk[0]].At, ticks[chunk[len(chunk)-1]].At
		if opts.Order == "newest" {
			first, last = last, first
		}
		part := opts
		part.From, part.To, part.MaxParallel = first, last, 0
		got, err := c.Backfill(ctx, workflow, part)
		if err != nil {
			return ticks, err
		}
		at := map[string]client.BackfillTick{}
		for _, g := range got {
			at[g.At] = g
		}
		var started []string
		for _, i := range chunk {
			if g, ok := at[ticks[i].At]; ok {
				ticks[i] = g
				if g.Outcome == client.BackfillBackfilled || g.Outcome == client.BackfillRetried {
					started = append(started, g.RunID)
				}
			}
		}
		if a.output == "table" && len(todo) > len(chunk) {
			fmt.Fprintf(a.errOut, "backfill: started %d run(s) from %s; waiting for them to end\n", len(started), first)
		}
		for _, id := range started {
			if err := waitEnded(ctx, c, id); err != nil {
				return ticks, err
			}
		}
	}
	return ticks, nil
}

// waitEnded waits for a run to end (run.wait answers at the latest after a minute: it
// asks again).
func waitEnded(ctx context.Context, c *client.Client, id string) error {
	for {
		r, err := c.WaitRun(ctx, id, time.Minute)
		if err != nil {
			return err
		}
		if r.Terminal() {
			return nil
		}
	}
}

// backfillTable is a backfill's ticks and a count of each outcome.
func backfillTable(w io.Writer, ticks []client.BackfillTick) {
	fmt.Fprintln(w, "TICK\tOUTCOME\tRUN")
	count := map[string]int{}
	for _, t := range ticks {
		fmt.Fprintf(w, "%s\t%s\t%s\n", t.At, t.Outcome, dash(t.RunID))
		count[t.Outcome]++
	}
	var parts []string
	for _, o := range []string{client.BackfillBackfilled, client.BackfillWouldRun, client.BackfillRan, client.BackfillNotMissed} {
		if count[o] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", count[o], o))
		}
	}
	if len(parts) == 0 {
		parts = []string{"no fire time in the range"}
	}
	fmt.Fprintf(w, "\n%s\n", strings.Join(parts, ", "))
}

// retryCommand is run retry RUN [--from STEP] [--input K=V]...
func (a *app) retryCommand() *cobra.Command {
	var from string
	var inputs []string
	var many bulkFlags
	cmd := &cobra.Command{Use: "retry RUN | retry --workflow W [--status S]... [--since T] [--until T] [--dry-run] [--max-parallel N]",
		Short: "Retry a run that ended: from its checkpoints, or --from a step (it and its dependents run again); or many runs at once",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 1 && many.set(cmd):
				return usage("run retry: give RUN or --workflow and its selection, not both")
			case len(args) == 0 && (from != "" || len(inputs) > 0):
				return usage("run retry --from and --input need RUN: a bulk retry resumes each run from its checkpoints")
			case len(args) == 0:
				return a.bulk("retry", many)
			}
			return a.retry(args[0], from, inputs)
		}}
	cmd.Flags().StringVar(&from, "from", "", "run this step and every step that depends on it again; the others keep their checkpoints")
	cmd.Flags().StringArrayVar(&inputs, "input", nil, "an input changed, as KEY=VALUE (repeat for several; needs --from)")
	many.add(cmd, "retry")
	return cmd
}

func (a *app) retry(id, from string, inputs []string) error {
	if len(inputs) > 0 && from == "" {
		return usage("--input needs --from STEP: a retry without it resumes from the checkpoints, whose inputs are fixed")
	}
	in, err := keyValues("--input", inputs)
	if err != nil {
		return err
	}
	if from == "" {
		return a.change((*client.Client).RetryRun, id)
	}
	res, err := ask(a, func(c *client.Client, ctx context.Context) (client.Change, error) {
		return c.RetryRunFrom(ctx, id, client.RetryOptions{From: from, Inputs: in})
	})
	if err != nil {
		return err
	}
	return a.print(res, func(w io.Writer) { fmt.Fprintf(w, "%s %s (from step %s)\n", res.ID, res.Status, from) })
}
