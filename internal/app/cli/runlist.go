package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flow/client"
)

// run list: runs newest first by creation time, a time range, filters and a cursor
// (docs/cli.md, "Finding runs").

type runListFlags struct {
	workflow, since, until, trigger, parent, after string
	statuses, inputs                               []string
	topLevel, oldest, paged                        bool
	limit                                          int
}

func (a *app) runListCommand() *cobra.Command {
	var f runListFlags
	cmd := &cobra.Command{Use: "list", Short: "List runs, newest first by creation time", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return a.listRuns(f) }}
	fl := cmd.Flags()
	fl.StringVar(&f.workflow, "workflow", "", "only this workflow")
	fl.StringArrayVar(&f.statuses, "status", nil, "only this status (pending running waiting succeeded failed cancelled dead_lettered; repeat for several)")
	fl.StringVar(&f.since, "since", "", "created at or after: RFC 3339, a date (midnight, local time) or a duration back from now (24h, 7d)")
	fl.StringVar(&f.until, "until", "", "created before: RFC 3339, a date (midnight, local time) or a duration back from now")
	fl.StringVar(&f.trigger, "trigger", "", "only this trigger (manual cron backfill retry event child handler)")
	fl.StringArrayVar(&f.inputs, "input", nil, "only runs with this input value, as KEY=VALUE (repeat for several)")
	fl.StringVar(&f.parent, "parent", "", "only this run's children and handler runs")
	fl.BoolVar(&f.topLevel, "top-level", false, "no child runs and no handler runs")
	fl.BoolVar(&f.oldest, "oldest", false, "oldest first")
	fl.StringVar(&f.after, "after", "", "the page after this cursor (printed as \"more: --after TOKEN\")")
	fl.BoolVar(&f.paged, "paged", false, `with -o json or yaml: {"runs": [...], "next": TOKEN} instead of the array`)
	fl.IntVar(&f.limit, "limit", 50, "at most this many runs (1 to 10000)")
	return cmd
}

// keyValues reads repeated KEY=VALUE flags.
func keyValues(flag string, kvs []string) (map[string]string, error) {
	in := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usage("%s %q: use KEY=VALUE", flag, kv)
		}
		in[k] = v
	}
	return in, nil
}

func (a *app) listRuns(f runListFlags) error {
	if f.limit < 1 || f.limit > 10000 {
		return usage("--limit %d: use 1 to 10000", f.limit)
	}
	if f.parent != "" && f.topLevel {
		return usage("--parent and --top-level: a run's children are not top-level runs; give one of them")
	}
	opts := client.ListOptions{Workflow: f.workflow, Statuses: f.statuses, Trigger: f.trigger, Parent: f.parent,
		TopLevel: f.topLevel, Oldest: f.oldest, After: f.after}
	var err error
	if opts.Inputs, err = keyValues("--input", f.inputs); err != nil {
		return err
	}
	if opts.Since, opts.Until, err = client.ParseRange(f.since, f.until, "--since", "--until", time.Now(), time.Local); err != nil {
		return usage("%v", err)
	}
	page, err := ask(a, func(c *client.Client, ctx context.Context) (client.RunPage, error) {
		// A page of the server's may end short (it bounds what one request looks at):
		// ask on until the limit is reached or no run is left.
		var all client.RunPage
		for tries := 0; ; tries++ {
			opts.Limit = f.limit - len(all.Runs)
			p, err := c.RunsPage(ctx, opts)
			if err != nil {
				return all, err
			}
			all.Runs, all.Next = append(all.Runs, p.Runs...), p.Next
			if p.Next == "" || len(all.Runs) >= f.limit || tries == 10000 {
				return all, nil
			}
			opts.After = p.Next
		}
	})
	if err != nil {
		return err
	}
	if page.Runs == nil {
		page.Runs = []client.Run{}
	}
	var v any = page.Runs // -o json without --after or --paged: the array, as before pages
	if f.after != "" || f.paged {
		v = page
	}
	return a.print(v, func(w io.Writer) {
		listTable(w, page.Runs)
		if page.Next != "" {
			fmt.Fprintf(w, "more: --after %s\n", page.Next)
		}
	})
}
