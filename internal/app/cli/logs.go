package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flow/client"
)

// runLogsCommand is `run logs RUN [--step S] [--item N] [--attempt N] [--follow]`: what
// the run's steps printed, each line once, with the step, item, attempt and epoch that
// printed it; --follow prints lines as they come until the run ends.
func (a *app) runLogsCommand() *cobra.Command {
	var step, item string
	var attempt int
	var follow bool
	cmd := &cobra.Command{Use: "logs RUN", Short: "Print what a run's steps printed (--follow: as they print it, until the run ends)",
		Args: exactArgs(1, "RUN"),
		RunE: func(_ *cobra.Command, args []string) error {
			opts := client.LogOptions{Step: step, Attempt: attempt}
			if item != "" {
				n, err := strconv.Atoi(item)
				if err != nil || n < 0 {
					return usage("--item %q: give a foreach item's index (0, 1, ...)", item)
				}
				opts.Item = &n
			}
			if attempt < 0 {
				return usage("--attempt %d: attempts count from 1 (leave it out for every attempt)", attempt)
			}
			return a.logs(args[0], opts, follow)
		}}
	f := cmd.Flags()
	f.StringVar(&step, "step", "", "only this step's lines")
	f.StringVar(&item, "item", "", "only this foreach item's lines (its index)")
	f.IntVar(&attempt, "attempt", 0, "only this attempt's lines (1 for the first)")
	f.BoolVar(&follow, "follow", false, "print lines as the steps print them, until the run ends")
	return cmd
}

func (a *app) logs(id string, opts client.LogOptions, follow bool) error {
	c, err := a.api()
	if err != nil {
		return err
	}
	ctx := context.Background()
	enc := json.NewEncoder(a.out)
	enc.SetEscapeHTML(false)
	var all []client.LogLine
	print := func(l client.LogLine) {
		switch a.output {
		case "json": // one object per line, as a follower's pipe reads them
			_ = enc.Encode(l)
		case "yaml":
			all = append(all, l)
		default:
			fmt.Fprintln(a.out, logLine(l))
		}
	}
	if follow {
		err = c.FollowLogs(ctx, id, opts, 0, print)
	} else {
		for {
			page, perr := c.RunLogs(ctx, id, opts)
			if perr != nil {
				err = perr
				break
			}
			for _, l := range page.Lines {
				print(l)
			}
			if len(page.Lines) == 0 || page.Next == opts.After {
				break
			}
			opts.After = page.Next
		}
	}
	if err != nil {
		return err
	}
	if a.output == "yaml" {
		if all == nil {
			all = []client.LogLine{}
		}
		return a.print(all, nil)
	}
	return nil
}

// logLine is a line as the table shows it: the time (UTC, to the second), where it came
// from (step[item] #attempt e<epoch>, the stream) and the line.
func logLine(l client.LogLine) string {
	at := "--:--:--"
	if t, err := time.Parse(time.RFC3339Nano, l.At); err == nil {
		at = t.UTC().Format("15:04:05")
	}
	where := l.Step
	if l.Item != nil {
		where += fmt.Sprintf("[%d]", *l.Item)
	}
	return fmt.Sprintf("%s %s #%d e%d %s| %s", at, where, l.Attempt, l.Epoch, l.Stream, l.Line)
}
