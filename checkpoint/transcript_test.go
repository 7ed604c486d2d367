package checkpoint

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/internal/base/testhooks"
)

// Apply transcripts (issue 13, point 6): the files in testdata/*.txt drive a Store
// message by message and print every verdict and the state it leaves, one file per
// rule, in the manner of etcd raft's testdata. Each file is meant to be read as the
// specification of its rule; `go test ./checkpoint -run TestTranscripts -rewrite`
// rewrites the expected output, which must then be read and checked by hand.
//
// Commands:
//
//	apply [seq=N]
//	<entry>
//	<entry>...
//	    One log message holding the entries, at sequence N (default: the next one).
//	    Prints one line per entry, "<seq>.<index> <kind> <run> [<step>[<item>]]:
//	    <verdict>", where the verdict is ok, fenced: <reason> (epoch E, run's C),
//	    rejected: stale term ..., conflict: ..., invalid: ..., dead-lettered: ...,
//	    not found: ..., run exists: .... An accepted assign also prints the epoch it
//	    began and why. A message that does not decode prints "<seq>: corrupt: ...".
//	state run=R [run=R2...]
//	    The run: status, epoch, owner, epoch changes/max_epochs, its epochs (reason,
//	    owner, term), its steps (status, attempts, checkpoint, foreach items) and its
//	    fenced records.
//	history run=R
//	    The run's events (View), in log order.
//	runs [status=S]
//	    Run IDs and statuses.
//	stale-terms
//	    The highest applied term and the scheduler entries rejected for their term.
//	applied
//	    The applied sequence and the highest term.
//
// An entry is "<kind> key=value...": run, epoch, term, owner, step, item (default -1,
// the whole step), worker, reason, out (JSON, as written), error, attempt, items,
// status; bare flags final and skipped; and for submit: steps=a,b* ('*' marks a
// foreach step), max_epochs (default 0: DefaultMaxEpochs), workflow (default wf). A
// value with spaces is written in double quotes. epoch=@R is run R's current epoch when the
// message is built; an assign without epoch= carries the run's current epoch (what a
// scheduler reading the state writes). Every entry's At is t0.

// TestTranscripts replays every transcript with every guard on.
func TestTranscripts(t *testing.T) {
	walkTranscripts(t, func(t *testing.T, path string) {
		tr := &transcript{s: memStore(t, nil)}
		datadriven.RunTest(t, path, tr.handle)
	})
}

// TestTranscriptsInFormat2: every transcript gives the same verdicts, state and history
// with its messages in log format 2 (CBOR) as in format 1 (JSON): the format changes
// the bytes, never the state machine. (cluster-version.txt mixes formats on purpose.)
func TestTranscriptsInFormat2(t *testing.T) {
	walkTranscripts(t, func(t *testing.T, path string) {
		if filepath.Base(path) == "cluster-version.txt" {
			t.Skip("mixes formats on purpose")
		}
		tr := &transcript{s: memStore(t, nil), format: LogFormatBinary}
		datadriven.RunTest(t, path, tr.handle)
	})
}

// guardCatches says, for each store guard (a field of testhooks.Hooks tagged
// guard:"store"), where its switch must change the transcripts: the file, the line of
// expected output that shows the guard's verdict, and the line printed instead with the
// guard off. Each is the first difference of its file with that one switch set (after it
// the state differs, and so does the rest). A new guard needs a place here, and a
// transcript change that moves or adds a place must say so here too.
var guardCatches = map[string][]guardCatch{
	"NoEpochCheck": {
		{"slots.txt", "13.0 commit r1 pay: fenced: stale-epoch (epoch 11, run's 12)", "13.0 commit r1 pay: ok"}, // a zombie would give back the slot its run holds
		{"complete.txt", "18.0 complete r3: fenced: stale-epoch (epoch 13, run's 15)", "18.0 complete r3: ok"},
		{"fenced.txt", "6.0 start r1 a: fenced: stale-epoch (epoch 2, run's 4)", "6.0 start r1 a: ok"},
		{"foreach.txt", "10.2 commit r1 b[1]: fenced: stale-epoch (epoch 2, run's 7)", "10.2 commit r1 b[1]: fenced: checkpoint-exists (epoch 2, run's 7)"},
		{"nightly.txt", "8.0 commit r1 b[0]: fenced: stale-epoch (epoch 2, run's 7)", "8.0 commit r1 b[0]: ok"},
		{"reclaim.txt", "9.0 commit r1 a: fenced: stale-epoch (epoch 2, run's 5)", "9.0 commit r1 a: ok"},
		{"requeue.txt", "9.0 requeue r1: fenced: stale-epoch (epoch 2, run's 7)", "9.0 requeue r1: ok"},
		// The zombie's wait commit takes the signal: consumed by a fenced epoch, lost to
		// the current one (whose commit is then refused as a second checkpoint).
		{"waits.txt", "14.0 commit r2 w: fenced: stale-epoch (epoch 8, run's 12)", "14.0 commit r2 w: ok"},
	},
	"NoCheckpointCheck": {
		{"fenced.txt", "9.0 commit r1 a: fenced: checkpoint-exists (epoch 4, run's 4)", "9.0 commit r1 a: ok"},
		{"foreach.txt", "6.0 commit r1 b[2]: fenced: checkpoint-exists (epoch 2, run's 2)", "6.0 commit r1 b[2]: ok"},
	},
	"NoTermCheck": {
		{"slots.txt", "8.0 wake r1 pay: rejected: stale term (term 1 < highest 2)", "8.0 wake r1 pay: ok"}, // a deposed leader grants a slot
		{"stale-term.txt", "3.0 assign r2: rejected: stale term (term 1 < highest 2)", "3.0 assign r2: ok, epoch 3 (assigned)"},
		{"waits.txt", "24.0 wake r4 nap: rejected: stale term (term 1 < highest 2)", "24.0 wake r4 nap: ok"},
		{"nightly.txt", "11.0 deadline-missed d1: rejected: stale term (term 1 < highest 2)", "11.0 deadline-missed d1: ok"},
		// A deposed leader's raise of the cluster version.
		{"cluster-version.txt", "4.0 cluster_version : rejected: stale term (term 2 < highest 3)", "4.0 cluster_version : ok"},
	},
	"NoStartCheck": {
		{"cancel.txt", "13.0 start r2 a: fenced: checkpoint-exists (epoch 11, run's 11)", "13.0 start r2 a: ok"},
		{"fenced.txt", "9.2 start r1 a: fenced: checkpoint-exists (epoch 4, run's 4)", "9.2 start r1 a: ok"},
	},
	"NoClaimOnceCheck": {
		{"claim-once.txt", "5.0 claim r1: fenced: epoch-already-claimed (epoch 2, run's 2)", "5.0 claim r1: ok"},
		// A first owner of an epoch the run left (cancelled before a claim, retried).
		{"claim-after-retry.txt", "5.0 claim r1: fenced: stale-epoch (epoch 2, run's 2)", "5.0 claim r1: ok"},
	},
	"TermFromAnyEntry": {
		{"stale-term.txt", "9.0 assign r2: ok, epoch 9 (reconciled)", "9.0 assign r2: rejected: stale term (term 4 < highest 5)"},
	},
	"NoSignalDedup": {
		{"waits.txt", `7.0 signal: accepted (signal go: id "k1" was applied at sequence 6; applied once)`, "7.0 signal: accepted (signal go)"},
	},
	"NoEarlySignals": {
		{"slots.txt", "  signal 4 go from ann", "  epochs: 1 assigned (w1, term 1)"},
		// The signal sent before the run reached its wait is dropped: the wait's commit
		// finds nothing to take.
		{"waits.txt", "4.0 commit r1 ledger: ok", "4.0 commit r1 ledger: invalid: run r1 has no signal at sequence 2"},
		// A signal to a run that waits for none is dropped before its size is judged.
		{"waits-limits.txt", "3.0 signal r: conflict: signal of run r (status pending, epoch 0): the run's inbox holds 900000 bytes of signal data; 900000 more would pass its limit of 1048576 bytes", "3.0 signal r: ok"},
	},
	"NoCancelCascade": {
		{"children.txt", "g.a cancelled", "g.a pending"},
	},
	"NoDeadlineCheck": {
		{"nightly.txt", "11.3 deadline-missed d2: conflict: deadline-missed of run d2 (status succeeded, epoch 9): the run succeeded", "11.3 deadline-missed d2: ok"},
	},
	"NoConsumeOnce": {
		{"waits.txt", `5.0 commit r1 b: conflict: commit of run r1 (status running, epoch 1): the signal at sequence 2 was consumed by step "ledger" (epoch 1)`, "5.0 commit r1 b: ok"},
	},
	"NoChildEpochCheck": {
		// A zombie of the parent's older epoch starts a child: the child is the zombie's.
		{"children-bound.txt", "4.0 submit p.fan.1: fenced: stale-epoch: only the parent's current epoch starts its child p.fan.1 (the parent is running) (epoch 1, run's 3)", "4.0 submit p.fan.1: ok"},
	},
	"NoChildLoopCheck": {
		{"children-bound.txt", "11.0 submit l.s.t: conflict: run l.s of workflow b would start a run of a, which an ancestor runs (a -> b -> a): workflow steps start a loop", "11.0 submit l.s.t: ok"},
	},
	"NoTreeLimit": {
		{"children-bound.txt", "16.0 submit t.b: conflict: run t's tree would hold 4 runs with t.b, more than the limit of 3 (the run and all its descendants; flowd --max-run-tree)", "16.0 submit t.b: ok"},
	},
	"NoInputsByExclude": {
		// Otto, who set the new amount, approves it himself.
		{"approvals.txt", "17.0 decide r approve: conflict: decide of run r (status waiting, epoch 14): the approval does not count: otto changed the run's inputs (retry --input), and the step wants people other than those who set what it approves (not_the_starter)", "17.0 decide r approve: ok"},
	},
	"NoDecisionCheck": {
		{"approvals.txt", "5.0 decide r approve: conflict: decide of run r (status waiting, epoch 1): the approval does not count: sam started the run, and the step wants people other than its starter (not_the_starter)", "5.0 decide r approve: ok"},
	},
	"NoParkCheck": {
		// A wake of the run's earlier park ends its later one, hours before that one's time.
		{"waits.txt", `32.0 wake r5 s1: conflict: wake of run r5 (status waiting, epoch 30): the run is not parked at sequence 28 on step "s1"`, "32.0 wake r5 s1: ok"},
	},
	"NoStepDrain": {
		// A cancel while the owner may still run the step frees its slots at once.
		{"slots.txt", "  draining slot acct-x of step pay (limit 1), granted at seq 16", "  epochs: 15 assigned (w1, term 2); 16 resumed (w1, term 2)"},
	},
	"NoHandlerOnce": {
		// The failed run's missed deadline starts its on_failure handler a second time.
		{"nightly.txt", "r1 succeeded", "h1.on-failure.1 pending"},
	},
	"NoInboxBytes": {
		{"waits-limits.txt", "3.0 signal r: conflict: signal of run r (status pending, epoch 0): the run's inbox holds 900000 bytes of signal data; 900000 more would pass its limit of 1048576 bytes", "3.0 signal r: ok"},
	},
	"StopOnUndecodable": {
		{"log.txt", `11: message rejected, undecodable: entry 1: unknown kind "teleport"`,
			`11: applier stopped: checkpoint: corrupt log message at sequence 11: entry 1: unknown kind "teleport"`},
		{"cluster-version.txt", "1: message rejected, undecodable: revision 5 in a format-2 message, which holds revisions up to 4",
			"1: applier stopped: checkpoint: corrupt log message at sequence 1: revision 5 in a format-2 message, which holds revisions up to 4"},
	},
}

// guardCatch is one place a guard's switch changes: in file, the expected line want is
// printed as got.
type guardCatch struct{ file, want, got string }

// TestTranscriptsNeedTheirGuards is the transcripts' negative control: with each guard
// (a field of testhooks.Hooks tagged guard:"store") switched off alone, every transcript
// guardCatches lists for it changes at the line it names, to the line it names, and no
// other transcript changes. A guard no transcript catches is a rule the transcripts do
// not specify; a difference somewhere else is not the guard's verdict.
func TestTranscriptsNeedTheirGuards(t *testing.T) {
	if f := flag.Lookup("rewrite"); f != nil && f.Value.String() == "true" {
		t.Skip("rewriting the expected output: the control compares against it")
	}
	// Every guard of the store, so that a guard added later needs a transcript too.
	ht := reflect.TypeFor[testhooks.Hooks]()
	guards := map[string]bool{}
	for i := range ht.NumField() {
		if ht.Field(i).Tag.Get("guard") != "store" {
			continue
		}
		guard := ht.Field(i).Name
		guards[guard] = true
		t.Run(guard, func(t *testing.T) {
			want := guardCatches[guard]
			if len(want) == 0 {
				t.Fatalf("guardCatches names no transcript line that Hooks.%s changes: write the transcript of its rule and list the line", guard)
			}
			off := new(testhooks.Hooks)
			reflect.ValueOf(off).Elem().Field(i).SetBool(true)
			caught := map[string]guardCatch{} // by file: its first difference
			walkTranscripts(t, func(t *testing.T, path string) {
				tr := &transcript{s: memStore(t, off)}
				file := filepath.Base(path)
				datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
					got := tr.handle(t, d)
					if got != "" && !strings.HasSuffix(got, "\n") {
						got += "\n"
					}
					if _, seen := caught[file]; !seen && got != d.Expected {
						// Only the first difference of a file: the state diverges after it.
						w, g := firstDiff(d.Expected, got)
						caught[file] = guardCatch{file, w, g}
						t.Logf("Hooks.%s changes %s: expected %q, got %q", guard, d.Pos, w, g)
					}
					return d.Expected // the difference is compared below, not failed on here
				})
			})
			for _, w := range want {
				switch c, ok := caught[w.file]; {
				case !ok:
					t.Errorf("with Hooks.%s set (its guard off), %s gives its expected output: want %q printed as %q", guard, w.file, w.want, w.got)
				case c != w:
					t.Errorf("with Hooks.%s set, %s first differs at %q (printed %q); want %q printed as %q", guard, w.file, c.want, c.got, w.want, w.got)
				}
				delete(caught, w.file)
			}
			for _, c := range caught {
				t.Errorf("with Hooks.%s set, %s also differs: %q printed as %q; if that is the guard's verdict, add it to guardCatches", guard, c.file, c.want, c.got)
			}
		})
	}
	for g := range guardCatches {
		if !guards[g] {
			t.Errorf("guardCatches lists %s, which is no store guard of testhooks.Hooks", g)
		}
	}
}

func walkTranscripts(t *testing.T, f func(t *testing.T, path string)) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if !strings.HasSuffix(path, ".txt") {
			t.Skipf("%s is not a transcript", path)
		}
		f(t, path)
	})
}

// firstDiff returns the first line where two outputs differ, as each has it.
func firstDiff(want, got string) (string, string) {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return wl, gl
		}
	}
	return "", ""
}

type transcript struct {
	s *Store
	// format is the log format apply encodes in (0: format 1), unless it says format=N.
	format int
}

func (tr *transcript) handle(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "apply":
		return tr.apply(t, d)
	case "state":
		var b strings.Builder
		for _, run := range tr.runArgs(t, d) {
			tr.printRun(t, d, &b, run)
		}
		return b.String()
	case "history":
		var b strings.Builder
		for _, run := range tr.runArgs(t, d) {
			tr.printHistory(t, d, &b, run)
		}
		return b.String()
	case "runs":
		return tr.runs(t, d)
	case "stale-terms":
		return tr.staleTerms(t, d)
	case "applied":
		return fmt.Sprintf("applied %d, highest term %d", tr.s.Applied(), tr.s.HighestTerm())
	case "cluster-version": // the applied cluster version (cluster.go)
		return fmt.Sprintf("cluster version %d, this store reads formats up to %d\n", tr.s.ClusterVersion(), tr.s.ReadFormat())
	case "new-store": // a new, empty store; reads=N: one that reads log formats up to N
		reads := 0
		if d.HasArg("reads") {
			d.ScanArgs(t, "reads", &reads)
		}
		s, err := OpenStore("state", StoreOptions{FS: vfs.NewMem(), Hooks: tr.s.hooks, ReadFormat: reads})
		if err != nil {
			d.Fatalf(t, "open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		tr.s = s
		return fmt.Sprintf("a new store, reading log formats up to %d\n", s.ReadFormat())
	case "deadlines": // the runs whose deadline is due at=RFC3339 (DueDeadlines)
		var at string
		d.ScanArgs(t, "at", &at)
		now, err := time.Parse(time.RFC3339, at)
		if err != nil {
			d.Fatalf(t, "at=%s: %v", at, err)
		}
		due, ticks, next, err := tr.s.DueDeadlines(now, 100)
		if err != nil {
			d.Fatalf(t, "due deadlines: %v", err)
		}
		for _, tk := range ticks {
			due = append(due, fmt.Sprintf("tick %s@%s", tk.Workflow, tk.At.UTC().Format(time.RFC3339)))
		}
		out := fmt.Sprintf("due: %s\n", orDash(strings.Join(due, " ")))
		if !next.IsZero() {
			out += "next: " + next.UTC().Format(time.RFC3339) + "\n"
		}
		return out + fmt.Sprintf("missed so far: %v\n", tr.s.DeadlinesMissed())
	case "schedule": // a schedule's pause state (operations.go)
		var name string
		d.ScanArgs(t, "workflow", &name)
		st, err := tr.s.Schedule(name)
		if err != nil {
			d.Fatalf(t, "schedule %s: %v", name, err)
		}
		if st == nil {
			return "never paused\n"
		}
		state := "running"
		if st.Paused {
			state = "paused"
		}
		out := fmt.Sprintf("%s: %s (seq %d)", st.Workflow, state, st.Seq)
		if st.Reason != "" {
			out += fmt.Sprintf(", reason %q", st.Reason)
		}
		if st.Actor != "" {
			out += ", paused by " + st.Actor
		}
		if st.ResumedBy != "" {
			out += ", resumed by " + st.ResumedBy
		}
		return out + "\n"
	case "slots": // the runs parked for step slots, in park order, and those holding them (slots.go)
		var b strings.Builder
		for _, w := range tr.s.SlotWaiters() {
			fmt.Fprintf(&b, "waits: %s step %s park %d", w.Run, w.Step, w.ParkSeq)
			for _, k := range w.Keys {
				fmt.Fprintf(&b, " %s:%d", k.Key, k.Limit)
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "hold: %s\n", orDash(strings.Join(tr.s.SlotHolders(), " ")))
		fmt.Fprintf(&b, "key holders: %s\n", orDash(strings.Join(tr.s.KeyHolders(nil), " ")))
		return b.String()
	case "timers": // the parked runs whose timer is due at=RFC3339 (DueTimers)
		var at string
		d.ScanArgs(t, "at", &at)
		now, err := time.Parse(time.RFC3339, at)
		if err != nil {
			d.Fatalf(t, "at=%s: %v", at, err)
		}
		due, next, err := tr.s.DueTimers(now, 100)
		if err != nil {
			d.Fatalf(t, "due timers: %v", err)
		}
		var b strings.Builder
		for _, du := range due {
			fmt.Fprintf(&b, "due: %s step %s park %d at %s\n", du.Run, du.Step, du.ParkSeq, du.Until.UTC().Format(time.RFC3339))
		}
		if next.IsZero() {
			b.WriteString("next: none\n")
		} else {
			fmt.Fprintf(&b, "next: %s\n", next.UTC().Format(time.RFC3339))
		}
		return b.String()
	}
	d.Fatalf(t, "unknown command %q (apply, state, history, runs, stale-terms, applied)", d.Cmd)
	return ""
}

func (tr *transcript) runArgs(t *testing.T, d *datadriven.TestData) []string {
	arg, ok := d.Arg("run")
	if !ok || len(arg.Vals) == 0 {
		d.Fatalf(t, "%s needs run=<id>", d.Cmd)
	}
	var runs []string
	for _, a := range d.CmdArgs {
		if a.Key == "run" {
			runs = append(runs, a.Vals...)
		}
	}
	return runs
}

// apply applies the input lines as one log message.
func (tr *transcript) apply(t *testing.T, d *datadriven.TestData) string {
	seq := tr.s.Applied() + 1
	if d.HasArg("seq") {
		d.ScanArgs(t, "seq", &seq)
	}
	var entries []Entry
	for _, line := range strings.Split(d.Input, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, err := tr.parseEntry(line)
		if err != nil {
			d.Fatalf(t, "entry %q: %v", line, err)
		}
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		d.Fatalf(t, "apply needs at least one entry")
	}
	format := max(tr.format, LogFormatJSON) // format=2: the message in log format 2
	if d.HasArg("format") {
		d.ScanArgs(t, "format", &format)
	}
	msg, err := EncodeMessageIn(format, "transcript", entries...)
	if errors.Is(err, ErrInvalidEntry) { // what the writer refuses (an entry its format does not hold)
		return fmt.Sprintf("%d: not written: %v\n", seq, err)
	} else if err != nil {
		d.Fatalf(t, "encode: %v", err)
	}
	if d.HasArg("revision") { // a forged envelope: the message claims revision=N whatever its format holds
		var revision int
		d.ScanArgs(t, "revision", &revision)
		datas := make([][]byte, len(entries))
		for i := range entries {
			if datas[i], err = EncodeEntry(format, &entries[i]); err != nil {
				d.Fatalf(t, "encode: %v", err)
			}
		}
		msg = EncodeEnvelopeIn(format, "transcript", revision, datas)
	}
	verdicts, err := tr.s.Apply(seq, msg)
	if err != nil { // what stops a node's applier (a storage failure, a newer format)
		return fmt.Sprintf("%d: applier stopped: %v", seq, err)
	}
	if verdicts == nil {
		return fmt.Sprintf("%d: skipped: at or below the applied sequence", seq)
	}
	if len(verdicts) == 0 { // the message did not decode: recorded as rejected
		rejected, err := tr.s.RejectedMessages()
		if err != nil || len(rejected) == 0 || rejected[len(rejected)-1].Seq != seq {
			d.Fatalf(t, "message %d gave no verdicts and no rejection record: %v %v", seq, rejected, err)
		}
		return fmt.Sprintf("%d: message rejected, undecodable: %s", seq, rejected[len(rejected)-1].Detail)
	}
	var b strings.Builder
	for i, e := range entries {
		fmt.Fprintf(&b, "%d.%d %s %s%s: %s\n", seq, i, e.Kind, e.Run, stepRef(e.Step, e.Item), tr.verdict(seq, e, verdicts[i]))
	}
	return b.String()
}

// verdict prints an entry's outcome in a stable form.
func (tr *transcript) verdict(seq uint64, e Entry, err error) string {
	return VerdictText(tr.s, seq, e, err)
}

// parseEntry reads "<kind> key=value ..." (EntryText).
func (tr *transcript) parseEntry(line string) (Entry, error) {
	return ParseEntryText(line, t0, func(run string) (int64, bool) {
		r, err := tr.s.Run(run)
		if err != nil {
			return 0, false
		}
		return r.Epoch, true
	})
}

// printRun prints a run's state deterministically (no times, no pointers).
func (tr *transcript) printRun(t *testing.T, d *datadriven.TestData, b *strings.Builder, id string) {
	v, err := tr.s.View(id)
	if errors.Is(err, ErrNotFound) {
		fmt.Fprintf(b, "run %s: not found\n", id)
		return
	}
	if err != nil {
		d.Fatalf(t, "view %s: %v", id, err)
	}
	r := v.Run
	fmt.Fprintf(b, "run %s: %s, epoch %d, owner %s, epoch changes %d/%d", r.ID, r.Status, r.Epoch, orDash(r.Owner), r.EpochChanges, r.MaxEpochs)
	if r.HandedBack {
		b.WriteString(", handed back")
	}
	if r.RetryRequested {
		b.WriteString(", retry requested")
	}
	if r.Resume {
		b.WriteString(", resume")
	}
	b.WriteString("\n")
	if r.Parent != nil {
		fmt.Fprintf(b, "  parent: %s step %s item %d, depth %d\n", r.Parent.Run, r.Parent.Step, r.Parent.Item, r.Depth)
	}
	if len(r.Children) > 0 {
		fmt.Fprintf(b, "  children: %s\n", strings.Join(r.Children, ", "))
	}
	if r.TreeSize > 0 {
		fmt.Fprintf(b, "  tree: %d descendants\n", r.TreeSize)
	}
	if len(r.InputsBy) > 0 {
		fmt.Fprintf(b, "  inputs changed by: %s\n", strings.Join(r.InputsBy, ", "))
	}
	if len(r.Outputs) > 0 {
		fmt.Fprintf(b, "  outputs: %s\n", r.Outputs)
	}
	if w := r.Waiting; w != nil {
		fmt.Fprintf(b, "  waiting: %s on step %s (park seq %d)", w.Kind, w.Step, w.Seq)
		if w.Name != "" {
			fmt.Fprintf(b, ", signal %s", w.Name)
		}
		if w.Need > 0 {
			fmt.Fprintf(b, ", need %d", w.Need)
		}
		if w.Exclude != "" {
			fmt.Fprintf(b, ", not %s", w.Exclude)
		}
		if w.NotTheStarter {
			b.WriteString(", not_the_starter")
		}
		if len(w.Children) > 0 {
			fmt.Fprintf(b, ", children %s (ended: %s)", strings.Join(w.Children, " "), orDash(strings.Join(w.Ended, " ")))
		}
		for _, k := range w.Keys {
			fmt.Fprintf(b, ", key %s limit %d", k.Key, k.Limit)
		}
		if !w.Until.IsZero() {
			fmt.Fprintf(b, ", until %s", w.Until.UTC().Format(time.RFC3339))
		}
		b.WriteString("\n")
	}
	for _, s := range r.Slots {
		fmt.Fprintf(b, "  slot %s of step %s (limit %d), granted at seq %d\n", s.Key, s.Step, s.Limit, s.Seq)
	}
	for _, s := range r.Draining {
		fmt.Fprintf(b, "  draining slot %s of step %s (limit %d), granted at seq %d\n", s.Key, s.Step, s.Limit, s.Seq)
	}
	for _, sg := range r.Inbox {
		fmt.Fprintf(b, "  signal %d %s", sg.Seq, sg.Name)
		if sg.ID != "" {
			fmt.Fprintf(b, " id %s", sg.ID)
		}
		switch {
		case len(sg.Data) > 100:
			fmt.Fprintf(b, " data of %d bytes", len(sg.Data))
		case len(sg.Data) > 0:
			fmt.Fprintf(b, " data %s", sg.Data)
		}
		fmt.Fprintf(b, " from %s", orDash(sg.Sender))
		if sg.ConsumedBy != "" {
			fmt.Fprintf(b, ", consumed by %s at epoch %d", sg.ConsumedBy, sg.ConsumedEpoch)
		}
		b.WriteString("\n")
	}
	for _, dc := range r.Decisions {
		verdict := "rejects"
		if dc.Approve {
			verdict = "approves"
		}
		fmt.Fprintf(b, "  decision %d: %s %s %s\n", dc.Seq, orDash(dc.Actor), verdict, dc.Step)
	}
	for _, name := range slices.Sorted(maps.Keys(r.Timers)) {
		tm := r.Timers[name]
		fmt.Fprintf(b, "  timer %s: %s", name, tm.Until.UTC().Format(time.RFC3339))
		if tm.Fired {
			b.WriteString(", fired")
		}
		b.WriteString("\n")
	}
	if len(r.Epochs) > 0 {
		var eps []string
		for _, ep := range r.Epochs {
			owner := ep.Owner
			if owner == "" {
				owner = "unclaimed"
			}
			eps = append(eps, fmt.Sprintf("%d %s (%s, term %d)", ep.Epoch, ep.Reason, owner, ep.Term))
		}
		fmt.Fprintf(b, "  epochs: %s\n", strings.Join(eps, "; "))
	}
	if r.Error != "" {
		fmt.Fprintf(b, "  error: %s\n", r.Error)
	}
	if r.FailedStep != "" {
		fmt.Fprintf(b, "  failed step: %s\n", r.FailedStep)
	}
	if r.DeadLetter != "" {
		fmt.Fprintf(b, "  dead letter: %s\n", r.DeadLetter)
	}
	for _, st := range v.Steps {
		name := st.Name
		if st.Foreach {
			name += "*"
		}
		fmt.Fprintf(b, "  step %s: %s, attempts %d", name, st.Status, st.Attempts)
		if st.Epoch != 0 {
			fmt.Fprintf(b, ", epoch %d", st.Epoch)
		}
		if st.Foreach {
			fmt.Fprintf(b, ", items %d/%d done", st.ItemsDone, st.Items)
		}
		if st.Seq != 0 {
			fmt.Fprintf(b, ", checkpoint seq %d", st.Seq)
		}
		if len(st.Output) > 0 {
			fmt.Fprintf(b, ", out %s", st.Output)
		}
		if st.Error != "" {
			fmt.Fprintf(b, ", error %q", st.Error)
		}
		b.WriteString("\n")
		for _, it := range st.ItemCheckpoints {
			fmt.Fprintf(b, "    item %d: epoch %d, owner %s, checkpoint seq %d.%d", it.Index, it.Epoch, it.Owner, it.Seq, it.Entry)
			if len(it.Output) > 0 {
				fmt.Fprintf(b, ", out %s", it.Output)
			}
			b.WriteString("\n")
		}
	}
	if len(v.Fenced) != r.Fenced {
		fmt.Fprintf(b, "  fenced count %d, but %d fenced records\n", r.Fenced, len(v.Fenced))
	}
	for _, f := range v.Fenced {
		fmt.Fprintf(b, "  fenced %d: %s%s by %s at epoch %d (run's %d): %s\n",
			f.Seq, f.Kind, stepRef(f.Step, f.Item), f.Owner, f.Epoch, f.CurrentEpoch, f.Reason)
	}
}

// stepRef prints " a" for a whole step, " b[2]" for an item, "" for none.
func stepRef(step string, item int) string {
	switch {
	case step == "":
		return ""
	case item == ItemWhole:
		return " " + step
	}
	return fmt.Sprintf(" %s[%d]", step, item)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (tr *transcript) printHistory(t *testing.T, d *datadriven.TestData, b *strings.Builder, id string) {
	v, err := tr.s.View(id)
	if err != nil {
		d.Fatalf(t, "view %s: %v", id, err)
	}
	for _, ev := range v.Events {
		fmt.Fprintf(b, "%d.%d %s%s", ev.Seq, ev.Index, ev.Kind, stepRef(ev.Step, ev.Item))
		switch {
		case ev.Epoch != 0 && ev.Kind == KindAssign:
			fmt.Fprintf(b, " (saw epoch %d)", ev.Epoch) // an assign carries the epoch it replaces
		case ev.Epoch != 0:
			fmt.Fprintf(b, " epoch %d", ev.Epoch)
		}
		if ev.Term != 0 {
			fmt.Fprintf(b, " term %d", ev.Term)
		}
		if ev.Owner != "" {
			fmt.Fprintf(b, " by %s", ev.Owner)
		}
		fmt.Fprintf(b, ": %s", ev.Outcome)
		if ev.Detail != "" {
			fmt.Fprintf(b, " (%s)", ev.Detail)
		}
		b.WriteString("\n")
	}
}

func (tr *transcript) runs(t *testing.T, d *datadriven.TestData) string {
	var opts ListOptions
	if d.HasArg("status") {
		var s string
		d.ScanArgs(t, "status", &s)
		opts.Status = RunStatus(s)
	}
	var b strings.Builder
	err := tr.s.EachRun(opts, func(r *Run) bool {
		fmt.Fprintf(&b, "%s %s\n", r.ID, r.Status)
		return true
	})
	if err != nil {
		d.Fatalf(t, "runs: %v", err)
	}
	if b.Len() == 0 {
		return "(none)"
	}
	return b.String()
}

func (tr *transcript) staleTerms(t *testing.T, d *datadriven.TestData) string {
	recs, err := tr.s.StaleTerms()
	if err != nil {
		d.Fatalf(t, "stale terms: %v", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "highest term %d\n", tr.s.HighestTerm())
	for _, st := range recs {
		fmt.Fprintf(&b, "rejected %d: %s %s, term %d < %d\n", st.Seq, st.Kind, orDash(st.Run), st.Term, st.HighestTerm)
	}
	return b.String()
}
