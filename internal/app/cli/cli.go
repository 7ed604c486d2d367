package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// Exit codes.
const (
	ExitOK          = 0
	ExitFailed      = 1
	ExitUsage       = 2
	ExitUnreachable = 3
	// ExitNotAuthorized: the server refused the operation, or the connection's
	// credentials, for this user.
	ExitNotAuthorized = 4
)

// exitError carries an exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func failed(format string, args ...any) error {
	return &exitError{ExitFailed, fmt.Errorf(format, args...)}
}

func usage(format string, args ...any) error {
	return &exitError{ExitUsage, fmt.Errorf(format, args...)}
}

type app struct {
	out, errOut io.Writer
	server      string
	output      string
	conn        connFlags
	getenv      func(string) string
	client      *client.Client
}

// Run runs flowctl with args and returns its exit code.
func Run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	a := &app{out: stdout, errOut: stderr, getenv: getenv}
	root := a.commands(getenv)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if a.client != nil {
		a.client.Close()
	}
	if err == nil {
		return ExitOK
	}
	code := ExitUsage // cobra's own errors: unknown commands and flags
	var ee *exitError
	var ae *client.Error
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case errors.Is(err, client.ErrNotAuthorized):
		code = ExitNotAuthorized
	case errors.Is(err, client.ErrUnreachable):
		code = ExitUnreachable
	case errors.As(err, &ae):
		code = ExitFailed
		if ae.Code == client.CodeBadRequest || ae.Code == client.CodeNotFound {
			code = ExitUsage
		}
	}
	fmt.Fprintln(stderr, "flowctl: "+oneLine(err.Error()))
	return code
}

func oneLine(s string) string { return strings.ReplaceAll(strings.TrimSpace(s), "\n", "; ") }

// api is the client of the server named by --server, dialled on first use with the
// credentials and TLS files of the flags and the environment.
func (a *app) api() (*client.Client, error) {
	if a.client == nil {
		conn, err := a.connectOptions()
		if err != nil {
			return nil, err
		}
		c, err := client.Dial(a.server, client.WithNATSOptions(append([]nats.Option{nats.Name("flowctl")}, conn.options...)...))
		if err != nil {
			return nil, connectError(err, conn)
		}
		a.client = c
	}
	return a.client, nil
}

// ask calls op on the client (dialled on first use) with a background context.
func ask[T any](a *app, op func(*client.Client, context.Context) (T, error)) (T, error) {
	c, err := a.api()
	if err != nil {
		var zero T
		return zero, err
	}
	return op(c, context.Background())
}

// show asks the API with op and prints the answer: as JSON or YAML with -o, else as
// table draws it.
func show[T any](a *app, op func(*client.Client, context.Context) (T, error), table func(io.Writer, T)) error {
	v, err := ask(a, op)
	if err != nil {
		return err
	}
	return a.print(v, func(w io.Writer) { table(w, v) })
}

func (a *app) commands(getenv func(string) string) *cobra.Command {
	server := getenv("FLOW_SERVER")
	if server == "" {
		server = "nats://127.0.0.1:4222"
	}
	root := &cobra.Command{
		Use:           "flowctl",
		Short:         "Control flow: workflows, runs, the dead-letter queue, the cluster",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch a.output {
			case "table", "json", "yaml":
				return nil
			}
			return usage("-o %q: use table, json or yaml", a.output)
		},
	}
	root.PersistentFlags().StringVar(&a.server, "server", server, "NATS URL of a flowd (env FLOW_SERVER)")
	// FLOW_SERVER may hold credentials (nats://user:password@host): --help shows the
	// default without them.
	root.PersistentFlags().Lookup("server").DefValue = redactURLs(server)
	root.PersistentFlags().StringVarP(&a.output, "output", "o", "table", "output format: table, json or yaml")
	a.conn.register(root)

	wf := group("workflow", "Validate, apply and show workflows")
	var file string
	validate := &cobra.Command{Use: "validate -f FILE", Short: "Check a workflow file (offline, no server needed)", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return a.validate(file) }}
	validate.Flags().StringVarP(&file, "file", "f", "", "workflow YAML file")
	var applyFiles []string
	apply := &cobra.Command{Use: "apply -f FILE|DIR [-f FILE|DIR]...", Short: "Apply workflow files (a changed file makes a new version)", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return a.apply(applyFiles) }}
	apply.Flags().StringArrayVarP(&applyFiles, "file", "f", nil, "workflow YAML file or directory (repeat for several: all are checked before any is applied)")
	wf.AddCommand(validate, apply,
		&cobra.Command{Use: "list", Short: "List workflows", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
			ws, err := ask(a, (*client.Client).Workflows)
			if err != nil {
				return err
			}
			return a.print(ws, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tVERSION\tSTEPS\tSCHEDULE\tAPPLIED")
				for _, x := range ws {
					fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\n", x.Name, x.Version, x.Steps, dash(x.Schedule), x.AppliedAt)
				}
			})
		}},
		&cobra.Command{Use: "show NAME", Short: "Show a workflow's latest version", Args: exactArgs(1, "NAME"), RunE: func(_ *cobra.Command, args []string) error {
			w, err := ask(a, func(c *client.Client, ctx context.Context) (client.Workflow, error) { return c.Workflow(ctx, args[0]) })
			if err != nil {
				return err
			}
			return a.print(w, func(out io.Writer) {
				fmt.Fprintf(out, "# %s version %d\n%s", w.Name, w.Version, w.Source)
			})
		}},
	)

	run := group("run", "Start, inspect, signal, approve, retry and cancel runs")
	var inputs []string
	var wait bool
	var runID, traceparent string
	var priority int
	start := &cobra.Command{Use: "start WORKFLOW", Short: "Start a run; prints its ID", Args: exactArgs(1, "WORKFLOW"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var p *int
			if cmd.Flags().Changed("priority") {
				if priority < client.MinPriority || priority > client.MaxPriority {
					return usage("--priority %d: use %d to %d (higher first)", priority, client.MinPriority, client.MaxPriority)
				}
				p = &priority
			}
			return a.start(args[0], runID, traceparent, inputs, wait, p)
		}}
	start.Flags().IntVar(&priority, "priority", 0, "the run's priority, -100 to 100, higher first (default: the workflow's priority:, else 0); a waiting run's rises with its age")
	start.Flags().StringVar(&traceparent, "traceparent", "", "a W3C traceparent: the run's trace joins the caller's (default: $TRACEPARENT)")
	start.Flags().StringArrayVar(&inputs, "input", nil, "an input as KEY=VALUE (repeat for several)")
	start.Flags().BoolVar(&wait, "wait", false, "wait for the run to end; exit 1 unless it succeeded")
	start.Flags().StringVar(&runID, "id", "", "the run's ID (default: generated)")
	run.AddCommand(start, a.runListCommand(),
		&cobra.Command{Use: "get RUN", Short: "Show a run", Args: exactArgs(1, "RUN"), RunE: func(_ *cobra.Command, args []string) error { return a.get((*client.Client).Run, args[0]) }},
		&cobra.Command{Use: "watch RUN", Short: "Follow a run until it ends; exit 1 unless it succeeded", Args: exactArgs(1, "RUN"), RunE: func(_ *cobra.Command, args []string) error { return a.watch(args[0]) }},
		&cobra.Command{Use: "history RUN", Short: "Print a run's event log", Args: exactArgs(1, "RUN"), RunE: func(_ *cobra.Command, args []string) error { return a.history(args[0]) }},
		&cobra.Command{Use: "verify RUN", Short: "Re-check a run's invariants from the state; exit 1 on a violation", Args: exactArgs(1, "RUN"), RunE: func(_ *cobra.Command, args []string) error { return a.verify(args[0]) }},
		a.runLogsCommand(),
		a.retryCommand(),
		a.cancelCommand(),
	)
	run.AddCommand(a.waitCommands()...)

	dlq := group("dlq", "The dead-letter queue")
	dlq.AddCommand(
		&cobra.Command{Use: "list", Short: "List dead-lettered runs", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
			return show(a, func(c *client.Client, ctx context.Context) ([]client.Run, error) {
				return c.DeadLetters(ctx, client.ListOptions{Limit: 1000})
			}, listTable)
		}},
		&cobra.Command{Use: "show RUN", Short: "Show a dead-lettered run with its epoch history", Args: exactArgs(1, "RUN"), RunE: func(_ *cobra.Command, args []string) error { return a.get((*client.Client).DeadLetter, args[0]) }},
		&cobra.Command{Use: "retry RUN", Short: "Retry a dead-lettered run (new epoch, epoch changes reset)", Args: exactArgs(1, "RUN"), RunE: func(_ *cobra.Command, args []string) error {
			return a.change((*client.Client).RetryDeadLetter, args[0])
		}},
		&cobra.Command{Use: "purge RUN", Short: "Remove a run from the dead-letter queue", Args: exactArgs(1, "RUN"), RunE: func(_ *cobra.Command, args []string) error {
			return a.change((*client.Client).PurgeDeadLetter, args[0])
		}},
	)
	cronCmd := group("cron", "Scheduled workflows")
	cronCmd.AddCommand(&cobra.Command{Use: "list", Short: "Schedules, next fire times, last ticks, pauses", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { return a.cronList() }})
	cronCmd.AddCommand(a.cronCommands()...)
	cluster := group("cluster", "The flowd nodes")
	cluster.AddCommand(&cobra.Command{Use: "status", Short: "Leader, term, nodes and the log's bounds", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { return a.clusterStatus() }},
		&cobra.Command{Use: "snapshot", Short: "Write a snapshot of the state now (the log is compacted below the newest)", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { return a.snapshot() }})
	cluster.AddCommand(a.clusterCommands()...)
	cluster.AddCommand(a.repairCommand())
	drill := group("drill", "Fault drills on a live cluster")
	drill.AddCommand(&cobra.Command{Use: "zombie", Short: "Pause a worker past its lease, let another take over, and show its commit fenced",
		Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error { return a.drillZombie() }})
	limits := &cobra.Command{Use: "limits", Short: "Concurrency keys (limit, holders, runs waiting) and rate limits (rate, starts reserved, steps waiting)", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error { return show(a, (*client.Client).Limits, limitsTable) }}
	root.AddCommand(wf, run, dlq, cronCmd, cluster, drill, limits, a.logCommand(), a.authCommand(), a.benchCommand())
	return root
}

// group is a command that only holds subcommands: anything else is bad usage.
func group(name, short string) *cobra.Command {
	return &cobra.Command{Use: name, Short: short, Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usage("unknown command %q for flowctl %s (see flowctl %s --help)", args[0], name, name)
			}
			return usage("flowctl %s needs a command (see flowctl %s --help)", name, name)
		}}
}

func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usage("%s needs %s (see flowctl %s --help)", cmd.CommandPath(), names, cmd.CommandPath()[len("flowctl "):])
		}
		return nil
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// print writes v as JSON or YAML, or calls table with a tab writer.
func (a *app) print(v any, table func(io.Writer)) error {
	switch a.output {
	case "json":
		enc := json.NewEncoder(a.out)
		enc.SetIndent("", "  ")
		// Not escaped for HTML: a terminal or a script reads this, and `auth permissions
		// -o json` goes into a nats-server configuration, which cannot read \u003e (">").
		enc.SetEscapeHTML(false)
		return enc.Encode(v)
	case "yaml":
		raw, _ := json.Marshal(v)
		var generic any
		_ = json.Unmarshal(raw, &generic)
		b, err := yaml.Marshal(generic)
		if err != nil {
			return err
		}
		_, err = a.out.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(a.out, 0, 2, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

func (a *app) validate(file string) error {
	if file == "" {
		return usage("workflow validate needs -f FILE")
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return usage("%v", err)
	}
	reg := steps.NewRegistry(0)
	w, err := workflow.LoadWith(file, data, workflow.Options{Kinds: reg.Has, With: reg.CheckWith})
	if err != nil {
		return usage("%v", err)
	}
	return a.print(map[string]any{"name": w.Name, "valid": true, "steps": len(w.Steps)}, func(out io.Writer) {
		fmt.Fprintf(out, "%s: workflow %s is valid (%d steps)\n", file, w.Name, len(w.Steps))
	})
}

// apply applies the workflow files of paths (each a file or a directory of .yaml and
// .yml files), in the order given. Every file is checked before any is applied, here
// and then by the server (the step kinds and their with are the server's to judge: it
// may have Go steps registered), so that bad input changes nothing; two files of one
// workflow are refused (the second would silently replace the first).
func (a *app) apply(paths []string) error {
	if len(paths) == 0 {
		return usage("workflow apply needs -f FILE|DIR (repeat -f for several)")
	}
	var files []string
	seen := map[string]bool{}
	for _, path := range paths {
		st, err := os.Stat(path)
		if err != nil {
			return usage("-f %v; nothing was applied", err)
		}
		found := []string{path}
		if st.IsDir() {
			found = nil
			for _, pat := range []string{"*.yaml", "*.yml"} {
				m, _ := filepath.Glob(filepath.Join(path, pat))
				found = append(found, m...)
			}
			sort.Strings(found)
			if len(found) == 0 {
				return usage("-f %s: the directory holds no .yaml or .yml file; nothing was applied", path)
			}
		}
		for _, f := range found {
			if key := filepath.Clean(f); !seen[key] {
				seen[key] = true
				files = append(files, f)
			}
		}
	}
	datas := map[string][]byte{}
	var problems []string
	byName := map[string]string{} // workflow name -> the file that defines it
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		w, err := workflow.Load(f, data, func(string) bool { return true })
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if other, ok := byName[w.Name]; ok {
			problems = append(problems, fmt.Sprintf("%s and %s both define workflow %q: the second would replace the first; apply one of them", other, f, w.Name))
			continue
		}
		byName[w.Name] = f
		datas[f] = data
	}
	if len(problems) > 0 {
		return usage("%s; nothing was applied", strings.Join(problems, "\n"))
	}
	if len(files) > 1 {
		// The server's checks too (kinds, with) before the first apply: otherwise a
		// file it refuses would stop the apply half way.
		for _, f := range files {
			_, err := ask(a, func(c *client.Client, ctx context.Context) (client.Workflow, error) {
				return c.ValidateWorkflow(ctx, f, datas[f])
			})
			var ae *client.Error
			switch {
			case errors.As(err, &ae) && ae.Code == client.CodeBadRequest:
				problems = append(problems, ae.Message)
			case err != nil:
				return fmt.Errorf("checking %s: %w; nothing was applied", f, err)
			}
		}
		if len(problems) > 0 {
			return usage("%s; nothing was applied", strings.Join(problems, "\n"))
		}
	}
	applied := []client.Workflow{}
	for i, f := range files {
		w, err := ask(a, func(c *client.Client, ctx context.Context) (client.Workflow, error) {
			return c.ApplyWorkflow(ctx, f, datas[f])
		})
		if err != nil {
			// Said with what was applied before it and what was not: a retry of the
			// same command applies the rest (an unchanged file makes no new version).
			_ = a.printApplied(applied)
			msg := err.Error()
			if !strings.HasPrefix(msg, f+":") {
				msg = f + ": " + msg
			}
			if i > 0 {
				msg += fmt.Sprintf("; applied before it: %s", strings.Join(files[:i], ", "))
			}
			if i+1 < len(files) {
				msg += fmt.Sprintf("; not applied: %s", strings.Join(files[i+1:], ", "))
			}
			return withMessage(err, msg)
		}
		applied = append(applied, w)
		if a.output == "table" {
			fmt.Fprintf(a.out, "%s: workflow %s applied: version %d\n", f, w.Name, w.Version)
		}
	}
	return a.printApplied(applied)
}

// printApplied prints the workflows applied, with -o json or yaml (the table's lines
// were printed as each was applied).
func (a *app) printApplied(applied []client.Workflow) error {
	if a.output == "table" {
		return nil
	}
	return a.print(applied, func(io.Writer) {})
}

// withMessage is err (its exit code kept: the same errors.As and errors.Is answer) with
// msg as its text.
func withMessage(err error, msg string) error { return &messageError{msg: msg, err: err} }

type messageError struct {
	msg string
	err error
}

func (e *messageError) Error() string { return e.msg }
func (e *messageError) Unwrap() error { return e.err }

func (a *app) cronList() error {
	return show(a, (*client.Client).Schedules, cronTable)
}

func (a *app) drillZombie() error {
	if a.output == "table" {
		fmt.Fprintln(a.out, "drill: starting a run whose worker will pause past its lease (about 1.5 lease TTLs)...")
	}
	d, err := ask(a, (*client.Client).DrillZombie)
	if err != nil {
		return err
	}
	if err := a.print(d, func(w io.Writer) {
		fmt.Fprintf(w, "run %s: %s\n\n", d.Run.ID, d.Run.Status)
		fmt.Fprintln(w, "EPOCH\tOWNER\tREASON")
		for _, e := range d.Run.Epochs {
			fmt.Fprintf(w, "%d\t%s\t%s\n", e.Epoch, dash(e.Owner), e.Reason)
		}
		fmt.Fprintln(w)
		for _, f := range d.Run.Fenced {
			fmt.Fprintf(w, "FENCED: %s's commit of step %s carried epoch %d; the run's epoch was %d (%s)\n", f.Owner, f.Step, f.Epoch, f.CurrentEpoch, f.Reason)
		}
		if d.Verify.OK {
			fmt.Fprintln(w, "verify: ok: one accepted commit per step, every one at its epoch")
		}
	}); err != nil {
		return err
	}
	if len(d.Run.Fenced) == 0 || !d.Verify.OK {
		return failed("the drill found no fenced commit, or the run violates its invariants")
	}
	return nil
}

// cronTable fits 80 columns: NEXT and LAST TICK both in the schedule's timezone (TZ:
// the TIMEZONE column; the header says so).
func cronTable(w io.Writer, cs []client.CronEntry) {
	fmt.Fprintln(w, "WORKFLOW\tCRON\tTIMEZONE\tNEXT (TZ)\tLAST TICK (TZ)")
	for _, c := range cs {
		loc, err := time.LoadLocation(c.Timezone)
		if err != nil {
			loc = time.UTC
		}
		short := func(s string) string {
			if t, err := time.Parse(time.RFC3339, s); err == nil {
				return t.In(loc).Format("01-02 15:04")
			}
			return s
		}
		next, last := "-", "-"
		if len(c.Next) > 0 {
			next = short(c.Next[0])
		}
		if c.Paused {
			next = "paused"
		}
		if len(c.Last) > 0 {
			last = short(c.Last[len(c.Last)-1].At) + " " + c.Last[len(c.Last)-1].Outcome
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", c.Workflow, c.Cron, c.Timezone, next, last)
	}
	for _, c := range cs {
		if c.Paused {
			fmt.Fprintf(w, "\n%s is paused by %s since %s UTC\n", c.Workflow, dash(c.PausedBy), shortTime(c.PausedSince))
			for _, l := range wrap("reason: "+dash(oneLine(c.PausedReason)), 76) {
				fmt.Fprintf(w, "  %s\n", l)
			}
		}
	}
}

func clusterTable(w io.Writer, st client.ClusterStatus) {
	fmt.Fprintf(w, "LEADER\t%s (term %d)\n", dash(st.Leader), st.Term)
	fmt.Fprintf(w, "LOG\t%d to %d, newest snapshot at %d\n", st.FirstSeq, st.LastSeq, st.SnapshotSeq)
	clusterVersionLines(w, st)
	fmt.Fprintln(w, "\nNODE\tAPPLIED\tLEADER\tLABELS")
	for _, n := range st.Nodes {
		fmt.Fprintf(w, "%s\t%d\t%v\t%s\n", n.ID, n.Applied, n.Leader, dash(strings.Join(n.Labels, ",")))
	}
	membersTable(w, st)
}

// limitsTable prints each concurrency key in use; the holders are the runs holding an
// epoch or parked in a wait.
func limitsTable(w io.Writer, l client.Limits) {
	fmt.Fprintln(w, "KEY\tLIMIT\tHOLDERS\tWAITING\tWORKFLOWS")
	for _, k := range l.Keys {
		fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\n", k.Key, k.Limit, dash(strings.Join(k.Holders, ",")), k.Waiting, strings.Join(k.Workflows, ","))
	}
	if len(l.Keys) == 0 {
		fmt.Fprintln(w, "(no concurrency key in use)")
	}
	if !l.Complete {
		fmt.Fprintln(w, "(waiting counts the first 10000 queued runs only)")
	}
	if len(l.Rates) == 0 {
		return
	}
	// The rates: a step waiting for its moment holds its worker; RESERVED are the starts
	// reserved ahead (each due an interval after the last). The waiting steps follow,
	// one a line (a run ID alone takes a third of the width).
	fmt.Fprintln(w, "\nRATE KEY\tRATE\tRESERVED\tWAITING\tWORKFLOWS")
	for _, r := range l.Rates {
		fmt.Fprintf(w, "%s\t%d/%s\t%d\t%d\t%s\n", r.Key, r.Limit, r.Per, r.Reserved, len(r.Waiting), dash(strings.Join(r.Workflows, ",")))
	}
	for _, r := range l.Rates {
		for _, x := range r.Waiting {
			fmt.Fprintf(w, "  %s waits: %s/%s[%d] on %s\n", r.Key, x.Run, x.Step, x.Item, x.Node)
		}
	}
}

func (a *app) snapshot() error {
	snap, err := ask(a, (*client.Client).Snapshot)
	if err != nil {
		return err
	}
	return a.print(snap, func(w io.Writer) {
		fmt.Fprintf(w, "snapshot %s: the state at log sequence %d, %d bytes\n", snap.Name, snap.Seq, snap.Bytes)
	})
}

func (a *app) clusterStatus() error {
	return show(a, (*client.Client).ClusterStatus, clusterTable)
}
