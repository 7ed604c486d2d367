package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowrun/flow/client"
)

// waitCommands are run signal, run approve and run reject (CONTRACT.md).
func (a *app) waitCommands() []*cobra.Command {
	var data, key, start string
	var inputs []string
	signal := &cobra.Command{Use: "signal RUN NAME", Short: "Send a signal to a run that has not ended (a run waiting for it wakes); with --start, start RUN first if it does not exist",
		Args: exactArgs(2, "RUN and NAME"), RunE: func(_ *cobra.Command, args []string) error {
			return a.signal(args[0], args[1], data, key, start, inputs)
		}}
	signal.Flags().StringVar(&data, "data", "", "the signal's data: JSON, or @FILE to read it from FILE")
	signal.Flags().StringVar(&key, "id", "", "the signal's key: the same signal sent again with it is applied once; another signal under a key already applied is refused")
	signal.Flags().StringVar(&start, "start", "", "signal-with-start: if no run RUN exists, start it as a run of this workflow, with its signal, in one log message")
	signal.Flags().StringArrayVar(&inputs, "input", nil, "an input of the run --start starts, as KEY=VALUE (repeat for several; unused if the run exists)")
	decide := func(use, short string, op func(*client.Client, context.Context, string, client.DecideOptions) (client.Decided, error)) *cobra.Command {
		var opts client.DecideOptions
		cmd := &cobra.Command{Use: use + " RUN", Short: short, Args: exactArgs(1, "RUN"),
			RunE: func(_ *cobra.Command, args []string) error { return a.decide(op, args[0], opts) }}
		cmd.Flags().StringVar(&opts.Step, "step", "", "the approval step (default: the one the run waits on, or its only one)")
		cmd.Flags().StringVar(&opts.Comment, "comment", "", "a comment kept with the decision")
		return cmd
	}
	return []*cobra.Command{signal,
		decide("approve", "Approve a run's approval step (your role must be the step's approvers role or above)", (*client.Client).Approve),
		decide("reject", "Reject a run's approval step: the step, and the run, fail", (*client.Client).Reject),
	}
}

// signalData is --data: JSON as given, or @FILE's; it must be JSON.
func signalData(data string) (json.RawMessage, error) {
	if data == "" {
		return nil, nil
	}
	what := "--data"
	raw := []byte(data)
	if file, ok := strings.CutPrefix(data, "@"); ok {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, usage("--data: %v", err)
		}
		what, raw = file, b
	}
	if !json.Valid(raw) {
		return nil, usage("%s is not valid JSON: a signal's data is JSON (a string is quoted: --data '\"text\"')", what)
	}
	return json.RawMessage(strings.TrimSpace(string(raw))), nil
}

func (a *app) signal(id, name, data, key, start string, inputs []string) error {
	raw, err := signalData(data)
	if err != nil {
		return err
	}
	if start == "" && len(inputs) > 0 {
		return usage("--input is for the run --start starts: give --start WORKFLOW, or leave --input out")
	}
	in, err := keyValues("--input", inputs)
	if err != nil {
		return err
	}
	res, err := ask(a, func(c *client.Client, ctx context.Context) (client.Signalled, error) {
		return c.Signal(ctx, id, name, client.SignalOptions{Data: raw, ID: key, Start: start, Inputs: in})
	})
	if err != nil {
		return err
	}
	return a.print(res, func(w io.Writer) {
		if res.Started {
			fmt.Fprintf(w, "%s started (%s) and signalled %s\n", res.ID, start, res.Signal)
			return
		}
		fmt.Fprintf(w, "%s signalled %s\n", res.ID, res.Signal)
	})
}

func (a *app) decide(op func(*client.Client, context.Context, string, client.DecideOptions) (client.Decided, error), id string, opts client.DecideOptions) error {
	res, err := ask(a, func(c *client.Client, ctx context.Context) (client.Decided, error) { return op(c, ctx, id, opts) })
	if err != nil {
		return err
	}
	word := map[string]string{"approve": "approved", "reject": "rejected"}[res.Decision]
	return a.print(res, func(w io.Writer) { fmt.Fprintf(w, "%s step %s %s\n", res.ID, res.Step, word) })
}

// waitingLine says what a waiting run waits for.
func waitingLine(r client.Run) string {
	w := r.Waiting
	var s string
	switch w.Kind {
	case client.WaitSignal:
		s = fmt.Sprintf("signal %s (step %s)", w.Signal, w.Step)
	case client.WaitApproval:
		// Only the approvals that count (the node's word: not a repeat, nor the starter's
		// or an input changer's under not_the_starter), and whose they are.
		s = fmt.Sprintf("approval of step %s: %d of %d", w.Step, len(w.ApprovedBy), w.Need)
		if w.Role != "" {
			s += " (" + w.Role + " or above)"
		}

	case client.WaitChild:
		s = fmt.Sprintf("%d child run(s) of step %s: %s", len(w.Children), w.Step, strings.Join(w.Children, ", "))
	case client.WaitConcurrency:
		s = fmt.Sprintf("concurrency key %q (limit %d), held by %s", w.Key, w.Limit, strings.Join(w.Holders, ", "))
		if w.Step != "" {
			s = fmt.Sprintf("concurrency key %q of step %s (limit %d), held by %s", w.Key, w.Step, w.Limit, strings.Join(w.Holders, ", "))
		}
		if len(w.Holders) == 0 { // by this node's state, the key has room: the leader's grant is on its way
			s = strings.TrimSuffix(s, ", held by ") + ", being granted"
		}
	case client.WaitLabel:
		s = fmt.Sprintf("a node with worker label %s (runs_on; no live node has it: start one with flowd --labels %s)", strings.Join(w.Labels, ", "), strings.Join(w.Labels, ","))
	case client.WaitRate:
		s = fmt.Sprintf("rate limit %s: step %s waits on its worker for its moment (flowctl limits)", w.Key, w.Step)
	default:
		s = fmt.Sprintf("%s (step %s)", w.Kind, w.Step)
	}
	return s
}

// untilLine is when a waiting run's wait times out.
func untilLine(w *client.Waiting) string {
	if w.Until == nil {
		return "no timeout"
	}
	return utcTime(*w.Until)
}

// waitsTable is run get's inbox and decisions, when it has some.
func waitsTable(w io.Writer, r client.Run) {
	if len(r.Inbox) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "SIGNAL\tSEQ\tSENDER\tTAKEN BY\tAT (UTC)")
		for _, s := range r.Inbox {
			taken := s.ConsumedBy
			if taken == "" {
				taken = "not yet"
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", s.Name, s.Seq, dash(s.Sender), taken, shortTime(s.At))
		}
	}
	if len(r.Decisions) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "DECISION\tSTEP\tBY\tAT (UTC)\tCOMMENT")
		for _, d := range r.Decisions {
			word := "reject"
			if d.Approve {
				word = "approve"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", word, d.Step, d.Actor, shortTime(d.At), oneLine(d.Comment))
		}
	}
}

// shortTime is an RFC 3339 time as UTC month-day time (the wire's string if it is not one).
func shortTime(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return dash(s)
	}
	return t.UTC().Format("01-02 15:04:05")
}
