package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/flowrun/flow/client"
)

// The cluster version's commands (docs/operations.md, "Upgrading") and the log dump.

func (a *app) clusterCommands() []*cobra.Command {
	forget := &cobra.Command{Use: "forget NODE", Short: "Remove a node that is gone for good from the cluster (the cluster version stops waiting for it)",
		Args: exactArgs(1, "NODE"), RunE: func(_ *cobra.Command, args []string) error {
			if _, err := ask(a, func(c *client.Client, ctx context.Context) (struct{}, error) {
				return struct{}{}, c.ForgetNode(ctx, args[0])
			}); err != nil {
				return err
			}
			return a.print(map[string]string{"forgotten": args[0]}, func(w io.Writer) {
				fmt.Fprintf(w, "%s forgotten: the cluster version no longer waits for it\n", args[0])
			})
		}}
	var reason string
	hold := &cobra.Command{Use: "hold", Short: "Keep the cluster version where it is (while an upgrade is tried) until cluster unhold",
		Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
			if _, err := ask(a, func(c *client.Client, ctx context.Context) (struct{}, error) {
				return struct{}{}, c.HoldClusterVersion(ctx, reason)
			}); err != nil {
				return err
			}
			return a.print(map[string]bool{"held": true}, func(w io.Writer) {
				fmt.Fprintln(w, "the cluster version is held: it stays until cluster unhold")
			})
		}}
	hold.Flags().StringVar(&reason, "reason", "", "why, shown by cluster status")
	unhold := &cobra.Command{Use: "unhold", Short: "End the hold on the cluster version (it moves once every node reads the next log format)",
		Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
			if _, err := ask(a, func(c *client.Client, ctx context.Context) (struct{}, error) {
				return struct{}{}, c.ReleaseClusterVersion(ctx)
			}); err != nil {
				return err
			}
			return a.print(map[string]bool{"held": false}, func(w io.Writer) {
				fmt.Fprintln(w, "the hold is released")
			})
		}}
	return []*cobra.Command{forget, hold, unhold}
}

func (a *app) logCommand() *cobra.Command {
	logCmd := &cobra.Command{Use: "log", Short: "The checkpoint log"}
	var from uint64
	var run string
	dump := &cobra.Command{Use: "dump [--from SEQ] [--run ID]", Short: "Print log messages as JSON, whatever their format (a line each; -o json: one array)",
		Long: "Print the log's messages from --from (default: the log's first) to its end, decoded whatever their log format\n" +
			"(1: JSON, 2: CBOR), a JSON object per line: seq, format, revision, the writing node, and the entries as\n" +
			"JSON. --run keeps only the entries about one run. -o json prints one JSON array instead.",
		Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { return a.logDump(from, run) }}
	dump.Flags().Uint64Var(&from, "from", 0, "the first log sequence (default: the log's first)")
	dump.Flags().StringVar(&run, "run", "", "only the entries about this run")
	logCmd.AddCommand(dump)
	return logCmd
}

func (a *app) logDump(from uint64, run string) error {
	c, err := a.api()
	if err != nil {
		return err
	}
	var all []client.LogMessage
	lines := a.output != "json" && a.output != "yaml"
	enc := json.NewEncoder(a.out)
	enc.SetEscapeHTML(false)
	for {
		page, err := c.DumpLog(context.Background(), client.LogDumpOptions{From: from, Run: run})
		if err != nil {
			return err
		}
		for _, m := range page.Messages {
			if lines {
				if err := enc.Encode(m); err != nil {
					return err
				}
				continue
			}
			all = append(all, m)
		}
		if page.Next == 0 || page.Next <= from {
			break
		}
		from = page.Next
	}
	if lines {
		return nil
	}
	if all == nil {
		all = []client.LogMessage{}
	}
	return a.print(all, nil)
}

func clusterVersionLines(w io.Writer, st client.ClusterStatus) {
	fmt.Fprintf(w, "VERSION\t%d", st.ClusterVersion)
	if st.PromisedVersion > 0 {
		fmt.Fprintf(w, " (%d promised, being written)", st.PromisedVersion)
	}
	if st.VersionNote != "" {
		fmt.Fprintf(w, ": stays, %s", st.VersionNote)
	}
	fmt.Fprintln(w)
	if st.Hold != nil {
		fmt.Fprintf(w, "HOLD\tby %s since %s: %s\n", dash(st.Hold.By), shortTime(st.Hold.At), dash(oneLine(st.Hold.Reason)))
	}
}

func membersTable(w io.Writer, st client.ClusterStatus) {
	fmt.Fprintln(w, "\nMEMBER\tLIVE\tFORMATS\tBINARY")
	for _, m := range st.Members {
		formats := make([]string, len(m.Formats))
		for i, f := range m.Formats {
			formats[i] = fmt.Sprint(f)
		}
		binary := dash(m.Binary)
		switch {
		case m.Inferred:
			binary = "a release before the cluster version"
		case m.Hold:
			binary += " (--hold-cluster-version)"
		}
		fmt.Fprintf(w, "%s\t%v\t%s\t%s\n", m.ID, m.Live, strings.Join(formats, ","), binary)
	}
}
