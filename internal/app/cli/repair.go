package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flowrun/flow/client"
)

// repairCommand is cluster repair (docs/security.md, "Sealing and repair"): flow's
// buckets and the tasks stream that someone sealed or reconfigured are made anew by a
// flowd that embeds its NATS server; the log, the DLQ and the snapshots are refused.
func (a *app) repairCommand() *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{Use: "repair [--dry-run]",
		Short: "Mend flow's streams and buckets that were sealed or reconfigured (admin; ends every lease and the term held)",
		Args:  cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
			r, err := ask(a, func(c *client.Client, ctx context.Context) (client.Repair, error) {
				return c.Repair(ctx, dryRun)
			})
			if errors.Is(err, client.ErrUnreachable) {
				return fmt.Errorf("%w (only a flowd that embeds its NATS server answers cluster repair; on an external NATS cluster see docs/security.md, \"Sealing and repair\")", err)
			}
			if err != nil && len(r.Streams) == 0 {
				return err
			}
			if perr := a.print(r, func(w io.Writer) { repairTable(w, r) }); perr != nil {
				return perr
			}
			if err != nil {
				return failed("%v", err)
			}
			for _, s := range r.Streams {
				if s.Action == "refuse" && !dryRun {
					return failed("%s cannot be repaired in place: %s", s.Stream, s.Note)
				}
			}
			return nil
		}}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say what differs and what repair would do; change nothing")
	return cmd
}

func repairTable(w io.Writer, r client.Repair) {
	if len(r.Streams) == 0 {
		fmt.Fprintf(w, "every stream and bucket of flow's is as flow wants it (checked by %s)\n", r.Node)
		return
	}
	fmt.Fprintln(w, "STREAM\tPROBLEMS\tACTION\tDONE")
	for _, s := range r.Streams {
		done := "no"
		switch {
		case s.Done:
			done = "yes"
		case r.DryRun:
			done = "dry run"
		case s.Error != "":
			done = "failed: " + s.Error
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", s.Stream, strings.Join(s.Problems, "; "), s.Action, done)
	}
	for _, s := range r.Streams {
		if s.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", s.Stream, s.Note)
		}
	}
	if !r.DryRun {
		fmt.Fprintf(w, "by %s; readyz of every node says whether anything is left\n", r.Node)
	}
}
