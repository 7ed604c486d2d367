package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flow/client"
)

// Acting on many runs: run cancel|retry --workflow W [--status S]... [--since T]
// [--until T] [--dry-run] [--max-parallel N] (docs/cli.md, "Acting on many runs"). The
// runs are run list's selection; each change carries the operation's name as its
// reason, so the run's history says which operation did it (and the node records who).

func (a *app) cancelCommand() *cobra.Command {
	var many bulkFlags
	cmd := &cobra.Command{Use: "cancel RUN | cancel --workflow W [--status S]... [--since T] [--until T] [--dry-run] [--max-parallel N]",
		Short: "Cancel a run that has not ended, or many at once", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 1 && many.set(cmd):
				return usage("run cancel: give RUN or --workflow and its selection, not both")
			case len(args) == 0:
				return a.bulk("cancel", many)
			}
			return a.change((*client.Client).CancelRun, args[0])
		}}
	many.add(cmd, "cancel")
	return cmd
}

// bulkFlags select the runs of a bulk change.
type bulkFlags struct {
	workflow, since, until, trigger string
	statuses                        []string
	dryRun                          bool
	maxParallel                     int
}

func (f *bulkFlags) add(cmd *cobra.Command, verb string) {
	fl := cmd.Flags()
	fl.StringVar(&f.workflow, "workflow", "", "with no RUN: "+verb+" the runs of this workflow that match the other flags")
	fl.StringArrayVar(&f.statuses, "status", nil, "with --workflow: only runs in this status (repeat for several)")
	fl.StringVar(&f.since, "since", "", "with --workflow: runs created at or after (RFC 3339, a date, or a duration back: 24h)")
	fl.StringVar(&f.until, "until", "", "with --workflow: runs created before (RFC 3339, a date, or a duration back)")
	fl.StringVar(&f.trigger, "trigger", "", "with --workflow: only runs of this trigger")
	fl.BoolVar(&f.dryRun, "dry-run", false, "with --workflow: list the runs it would "+verb+", change nothing")
	fl.IntVar(&f.maxParallel, "max-parallel", 4, "with --workflow: at most this many changes at once (1 to 64)")
}

// set says whether any selection flag was given (a bulk change).
func (f *bulkFlags) set(cmd *cobra.Command) bool {
	for _, name := range []string{"workflow", "status", "since", "until", "trigger", "dry-run", "max-parallel"} {
		if cmd.Flags().Changed(name) {
			return true
		}
	}
	return false
}

// BulkOutcome is one run's outcome in a bulk change.
type BulkOutcome struct {
	ID      string `json:"id"`
	Status  string `json:"status"` // before the change
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
}

// BulkResult is a bulk change's answer (-o json).
type BulkResult struct {
	Operation string        `json:"operation"`
	Action    string        `json:"action"`
	DryRun    bool          `json:"dry_run"`
	Runs      []BulkOutcome `json:"runs"`
}

// maxBulkRuns bounds what one bulk change selects; a larger selection is refused and
// asks for a narrower one (a time range).
const maxBulkRuns = 10000

func (a *app) bulk(action string, f bulkFlags) error {
	if f.workflow == "" {
		return usage("run %s without RUN needs --workflow W (and, to narrow it, --status, --since, --until): it acts on many runs", action)
	}
	if f.maxParallel < 1 || f.maxParallel > 64 {
		return usage("--max-parallel %d: use 1 to 64", f.maxParallel)
	}
	statuses := f.statuses
	if len(statuses) == 0 {
		statuses = []string{"failed"} // retry: the failed runs
		if action == "cancel" {
			statuses = []string{"pending", "running", "waiting"}
		}
	}
	opts := client.ListOptions{Workflow: f.workflow, Statuses: statuses, Trigger: f.trigger, Oldest: true}
	var err error
	if opts.Since, opts.Until, err = client.ParseRange(f.since, f.until, "--since", "--until", time.Now(), time.Local); err != nil {
		return usage("%v", err)
	}
	c, err := a.api()
	if err != nil {
		return err
	}
	ctx := context.Background()
	var runs []client.Run
	for {
		opts.Limit = min(1000, maxBulkRuns+1-len(runs))
		p, err := c.RunsPage(ctx, opts)
		if err != nil {
			return err
		}
		runs = append(runs, p.Runs...)
		if len(runs) > maxBulkRuns {
			return usage("more than %d runs match: narrow the selection (--since/--until) and run it in parts", maxBulkRuns)
		}
		if p.Next == "" {
			break
		}
		opts.After = p.Next
	}
	res := BulkResult{Operation: operationName(action), Action: action, DryRun: f.dryRun, Runs: make([]BulkOutcome, len(runs))}
	reason := fmt.Sprintf("%s (run %s --workflow %s --status %s)", res.Operation, action, f.workflow, strings.Join(statuses, ","))
	for i, r := range runs {
		res.Runs[i] = BulkOutcome{ID: r.ID, Status: r.Status, Outcome: "would-" + action}
	}
	if !f.dryRun {
		var wg sync.WaitGroup
		sem := make(chan struct{}, f.maxParallel)
		for i := range res.Runs {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				res.Runs[i].Outcome, res.Runs[i].Error = changeOne(ctx, c, action, res.Runs[i].ID, reason)
			}()
		}
		wg.Wait()
	}
	if err := a.print(res, func(w io.Writer) { bulkTable(w, res) }); err != nil {
		return err
	}
	for _, o := range res.Runs {
		if o.Error != "" {
			return failed("%s: some runs were not changed (their errors above)", res.Operation)
		}
	}
	return nil
}

// changeOne cancels or retries one run. When a try's outcome is unknown (the node that
// took the request went away before answering, as a SIGKILLed leader does), it reads
// the run's history (the answering node catches up with the log first) before it asks
// again: if the history holds this operation's change, the first try got through and
// is not repeated (a retried run that failed again meanwhile would otherwise be
// retried twice). Up to 5 tries.
func changeOne(ctx context.Context, c *client.Client, action, id, reason string) (outcome, errText string) {
	done := map[string]string{"cancel": "cancelled", "retry": "retried"}[action]
	var err error
	for try := range 5 {
		if try > 0 && changedBy(ctx, c, action, id, reason) {
			return done, ""
		}
		if action == "cancel" {
			_, err = c.CancelRunFor(ctx, id, reason)
		} else {
			_, err = c.RetryRunFrom(ctx, id, client.RetryOptions{Reason: reason})
		}
		var ce *client.Error
		switch {
		case err == nil:
			return done, ""
		case errors.As(err, &ce):
			if try > 0 && ce.Code == client.CodeConflict && changedBy(ctx, c, action, id, reason) {
				return done, "" // the earlier try landed after the history was read
			}
			return "refused", err.Error() // the node's answer: the change was refused
		}
		// No answer: ask again, after the history says whether it landed.
	}
	return "unknown", fmt.Sprintf("%v (no node answered %d tries: see run history %s)", err, 5, id)
}

// changedBy says whether run id was changed by the operation whose reason this is: a
// cancel is the run's error (the cancel's reason); a retry is in its history.
func changedBy(ctx context.Context, c *client.Client, action, id, reason string) bool {
	if action == "cancel" {
		r, err := c.Run(ctx, id)
		return err == nil && r.Status == "cancelled" && strings.Contains(r.Error, reason)
	}
	evs, err := c.History(ctx, id)
	if err != nil {
		return false
	}
	for _, ev := range evs {
		if ev.Kind == "retry" && ev.Outcome == "accepted" && strings.Contains(ev.Detail, reason) {
			return true
		}
	}
	return false
}

// operationName names a bulk change: its action, the time and a few random bytes.
func operationName(action string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("bulk-%s-%s-%s", action, time.Now().UTC().Format("20060102T150405Z"), hex.EncodeToString(b))
}

func bulkTable(w io.Writer, res BulkResult) {
	fmt.Fprintf(w, "operation %s: %d run(s)\n", res.Operation, len(res.Runs))
	if len(res.Runs) == 0 {
		return
	}
	fmt.Fprintln(w, "RUN\tWAS\tOUTCOME")
	counts := map[string]int{}
	for _, o := range res.Runs {
		counts[o.Outcome]++
		outcome := o.Outcome
		if o.Error != "" {
			outcome += ": " + oneLine(o.Error)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", o.ID, o.Status, outcome)
	}
	var keys []string
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	fmt.Fprintln(w, strings.Join(parts, ", "))
}
