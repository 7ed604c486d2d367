package leader

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/specs"
	"github.com/flowrun/flow/workflow"
)

// The leader's decisions as transcripts (testdata/*.txt): a state built by applying
// entries to a real checkpoint store, a table of live leases, and a clock that only
// moves when the transcript says so; each decision prints what it decided, and with
// `write` its entries are applied (at the next sequences), so a file reads as the leader
// acting on the state it leaves. `go test -run TestTranscripts -rewrite` regenerates.
//
// Commands (times print as offsets from t0 = 2026-11-29T02:00:00Z):
//
//	apply                      one log message of entries (checkpoint.ParseEntryText),
//	<entry>...                 written at the clock's time; prints the verdicts
//	workflow                   applies a workflow (its YAML as the input)
//	clock +D | clock =D        moves the clock forward by D, or to t0+D
//	leases                     the live leases, one "run epoch" per line (replaces them)
//	assign room=N [write] [unapplied] [nodrain] [aging=D]   PlanAssign with room N (Admission.Room gives it in
//	                           flowd); runs with concurrency keys are counted (keys.go) from
//	                           the state, the live leases and the watch (caught up as of the
//	                           clock unless `watch` says otherwise); prints the counts used;
//	                           nodrain is the control (SlotView.NoDrain)
//	nodes                      the live nodes' worker labels, one node per line
//	                           (comma-separated, "-" for none): assign then passes over
//	                           runs whose runs_on no live node has (placeable); before
//	                           it, every run is placeable
//	watch asof=D | watch now   the lease watch is caught up as of t0+D, or as of the clock
//	admission ahead=N [admitting=N]   Admission.Room for the state's assigned runs
//	reconcile [ttl=D] [write]  one Reconciler.Pass at the clock's time
//	lapse run=R epoch=E [owner=O] [delay=D] [write]   a lease (of O) lapsed: reclaim now, or
//	                           wait the lock delay
//	cron [grace=D] [write]     CronDue then PlanTicks per workflow, at the clock's time
//	compact snapshot=S [live=L] [applied=A]   KeepFrom
//	retire retention=D [limit=N] [write]      RetireDue with cutoff = clock - retention
//	runs                       every run: status, epoch, owner
//
// Scheduler entries a decision writes carry term=1 and owner=leader.

var t0 = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		tr := newTranscript(t)
		datadriven.RunTest(t, path, tr.handle)
	})
}

type transcript struct {
	s          *checkpoint.Store
	specs      *specs.Cache
	now        time.Time
	leases     map[string]int64
	reconciler Reconciler
	delays     LockDelay
	slots      *slotCounter
	released   uint64        // the slot count's cursor (checkpoint.Store.Released)
	asOf       *time.Time    // nil: the watch is caught up as of the clock
	aging      time.Duration // PlanAssign's priority aging (0: none)
	liveNodes  [][]string    // the live nodes' labels (nil: not given, every run placeable)
}

func newTranscript(t *testing.T) *transcript {
	s, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &transcript{s: s, specs: specs.New(s), now: t0, leases: map[string]int64{},
		reconciler: Reconciler{TTL: 10 * time.Second}, slots: newSlotCounter(t0.Add(-time.Second))}
}

func (tr *transcript) handle(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "apply":
		var entries []checkpoint.Entry
		for _, line := range lines(d.Input) {
			e, err := checkpoint.ParseEntryText(line, tr.now, tr.epochOf)
			if err != nil {
				d.Fatalf(t, "entry %q: %v", line, err)
			}
			entries = append(entries, e)
		}
		return tr.write(t, d, entries)
	case "workflow":
		w, err := workflow.Load("wf.yaml", []byte(d.Input), func(string) bool { return true })
		if err != nil {
			d.Fatalf(t, "workflow: %v", err)
		}
		spec, _ := json.Marshal(w)
		return tr.write(t, d, []checkpoint.Entry{{Kind: checkpoint.KindWorkflow, Owner: "api", At: tr.now,
			Workflow: &checkpoint.WorkflowDef{Name: w.Name, Digest: w.Digest, Spec: spec}}})
	case "clock":
		arg := d.CmdArgs[0].Key
		dur, err := time.ParseDuration(strings.TrimLeft(arg, "+="))
		if err != nil {
			d.Fatalf(t, "clock %s: %v", arg, err)
		}
		if strings.HasPrefix(arg, "=") {
			tr.now = t0.Add(dur)
		} else {
			tr.now = tr.now.Add(dur)
		}
		return "now " + tr.at(tr.now)
	case "leases":
		tr.leases = map[string]int64{}
		for _, line := range lines(d.Input) {
			var run string
			var ep int64
			if _, err := fmt.Sscanf(line, "%s %d", &run, &ep); err != nil {
				d.Fatalf(t, "lease %q: %v", line, err)
			}
			tr.leases[run] = ep
		}
		return fmt.Sprintf("%d live leases", len(tr.leases))
	case "nodes":
		tr.liveNodes = [][]string{}
		for _, line := range lines(d.Input) {
			labels, err := workflow.ParseLabels(strings.TrimPrefix(line, "-"))
			if err != nil {
				d.Fatalf(t, "nodes %q: %v", line, err)
			}
			tr.liveNodes = append(tr.liveNodes, labels)
		}
		return fmt.Sprintf("%d live nodes", len(tr.liveNodes))
	case "watch":
		if d.HasArg("now") {
			tr.asOf = nil
			return "watch caught up as of the clock"
		}
		var at string
		d.ScanArgs(t, "asof", &at)
		dur, err := time.ParseDuration(at)
		if err != nil {
			d.Fatalf(t, "watch asof=%s: %v", at, err)
		}
		a := t0.Add(dur)
		tr.asOf = &a
		return "watch caught up as of " + tr.at(a)
	case "assign":
		var room int
		d.ScanArgs(t, "room", &room)
		tr.aging = 0
		if d.HasArg("aging") {
			var a string
			d.ScanArgs(t, "aging", &a)
			var err error
			if tr.aging, err = time.ParseDuration(a); err != nil {
				d.Fatalf(t, "aging=%s: %v", a, err)
			}
		}
		var counted string
		slots := func() (KeyCounts, bool) {
			asOf := tr.now
			if tr.asOf != nil {
				asOf = *tr.asOf
			}
			var live []string
			for run := range tr.leases {
				live = append(live, run)
			}
			sort.Strings(live)
			released, next, complete := tr.s.Released(tr.released)
			tr.released = next
			v := SlotView{Holders: tr.s.KeyHolders(nil), Released: released, ReleasedComplete: complete, Live: live, AsOf: asOf,
				Now: tr.now, Unapplied: d.HasArg("unapplied"), NoDrain: d.HasArg("nodrain")}
			counts, ok := tr.slots.Count(v, func(id string) []workflow.KeyLimit {
				r, err := tr.s.Run(id)
				if err != nil {
					return nil
				}
				return RunKeys(tr.specs, r)
			})
			if !ok {
				counted = "slots: not countable yet\n"
				return nil, false
			}
			var keys []string
			for k, n := range counts {
				keys = append(keys, fmt.Sprintf("%s=%d", k, n))
			}
			sort.Strings(keys)
			var ending []string
			for id := range tr.slots.ending {
				ending = append(ending, id)
			}
			sort.Strings(ending)
			counted = fmt.Sprintf("slots: %s; ending: %s\n", orNone(keys), orNone(ending))
			return counts, true
		}
		var placeable func([]string) bool
		if tr.liveNodes != nil {
			placeable = func(need []string) bool {
				for _, have := range tr.liveNodes {
					if len(workflow.Missing(need, have)) == 0 {
						return true
					}
				}
				return false
			}
		}
		runs, err := PlanAssign(tr.s, tr.specs, room, PlanOptions{Slots: slots, Taken: tr.slots.admitted, Placeable: placeable, Now: tr.now, Aging: tr.aging})
		if err != nil {
			d.Fatalf(t, "plan: %v", err)
		}
		var b strings.Builder
		b.WriteString(counted)
		ids := make([]string, len(runs))
		for i, r := range runs {
			ids[i] = r.ID
		}
		fmt.Fprintf(&b, "assign: %s\n", orNone(ids))
		if d.HasArg("write") && len(runs) > 0 {
			var es []checkpoint.Entry
			for _, r := range runs {
				es = append(es, AssignEntry(r.ID, r.Epoch, ""))
			}
			b.WriteString(tr.writeScheduler(t, d, es))
		}
		return b.String()
	case "admission":
		var ahead, admitting int
		d.ScanArgs(t, "ahead", &ahead)
		if d.HasArg("admitting") {
			d.ScanArgs(t, "admitting", &admitting)
		}
		a := NewAdmission(ahead, nil)
		defer a.Writing(admitting)()
		assigned, running := tr.s.Held()
		return fmt.Sprintf("held: %d assigned, %d running; room %d", assigned, running, a.Room(assigned))
	case "reconcile":
		if d.HasArg("ttl") {
			tr.reconciler.TTL = durArg(t, d, "ttl")
		}
		p, err := tr.reconciler.Pass(tr.s, tr.live, tr.now)
		if err != nil {
			d.Fatalf(t, "reconcile: %v", err)
		}
		var b strings.Builder
		for _, id := range p.Announce {
			fmt.Fprintf(&b, "announce %s on the DLQ\n", id)
		}
		var es []checkpoint.Entry
		for _, rc := range p.Reclaim {
			fmt.Fprintf(&b, "reclaim %s epoch %d: %s\n", rc.Run, rc.Epoch, rc.Reason)
			es = append(es, AssignEntry(rc.Run, rc.Epoch, rc.Reason))
		}
		for _, rq := range p.Requeue {
			fmt.Fprintf(&b, "queue the task of %s epoch %d again\n", rq.Run, rq.Epoch)
		}
		sus := tr.reconciler.Suspects()
		ids := make([]string, 0, len(sus))
		for id := range sus {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			fmt.Fprintf(&b, "suspect %s since %s\n", id, tr.at(sus[id]))
		}
		if b.Len() == 0 {
			b.WriteString("nothing to do\n")
		}
		if d.HasArg("write") && len(es) > 0 {
			b.WriteString(tr.writeScheduler(t, d, es))
		}
		return b.String()
	case "lapse":
		var run string
		var ep int64
		d.ScanArgs(t, "run", &run)
		d.ScanArgs(t, "epoch", &ep)
		if d.HasArg("delay") {
			tr.delays.Delay = durArg(t, d, "delay")
		}
		var owner string
		if d.HasArg("owner") {
			d.ScanArgs(t, "owner", &owner)
		}
		r, err := tr.s.Run(run)
		if err != nil || !Reclaimable(r, Reclaim{Run: run, Epoch: ep, Owner: owner}) {
			if err == nil && r.Epoch == ep && r.Status == checkpoint.StatusRunning {
				return fmt.Sprintf("nothing: %s runs at epoch %d owned by %s, not by the lapsed lease's %s", run, ep, r.Owner, owner)
			}
			return fmt.Sprintf("nothing: %s no longer runs at epoch %d", run, ep)
		}
		due, first := tr.delays.Due(run, tr.now)
		if !due {
			if first {
				return fmt.Sprintf("wait: the lock delay of %s starts now", tr.delays.Delay)
			}
			return "wait: within the lock delay"
		}
		out := fmt.Sprintf("reclaim %s epoch %d: %s\n", run, ep, checkpoint.ReasonLeaseExpired)
		if d.HasArg("write") {
			out += tr.writeScheduler(t, d, []checkpoint.Entry{AssignEntry(run, ep, checkpoint.ReasonLeaseExpired)})
		}
		return out
	case "cron":
		grace := 30 * time.Second
		if d.HasArg("grace") {
			grace = durArg(t, d, "grace")
		}
		plans, next, err := CronDue(tr.s, tr.specs, tr.now)
		if err != nil {
			d.Fatalf(t, "cron: %v", err)
		}
		var b strings.Builder
		for _, p := range plans {
			entries, warn := PlanTicks(p, tr.now, grace, WorkflowActive(tr.s, p.Workflow.Name))
			if warn != nil {
				fmt.Fprintf(&b, "warning: %v\n", warn)
			}
			for _, e := range entries {
				fmt.Fprintf(&b, "%s tick %s: %s", e.Tick.Workflow, tr.at(e.Tick.At), e.Tick.Outcome)
				if e.Run != "" {
					fmt.Fprintf(&b, ", run %s", e.Run)
				}
				b.WriteString("\n")
			}
			if d.HasArg("write") && len(entries) > 0 {
				// One message per tick, in order, as the leader writes them.
				for _, e := range entries {
					b.WriteString(tr.writeScheduler(t, d, []checkpoint.Entry{e}))
				}
			}
		}
		if next.IsZero() {
			b.WriteString("next: none\n")
		} else {
			fmt.Fprintf(&b, "next: %s\n", tr.at(next))
		}
		return b.String()
	case "compact":
		var snap, live, applied uint64
		d.ScanArgs(t, "snapshot", &snap)
		anyLive := d.HasArg("live")
		if anyLive {
			d.ScanArgs(t, "live", &live)
		}
		applied = tr.s.Applied()
		if d.HasArg("applied") {
			d.ScanArgs(t, "applied", &applied)
		}
		return fmt.Sprintf("keep from %d", KeepFrom(snap, live, anyLive, applied))
	case "retire":
		retention := durArg(t, d, "retention")
		limit := RetireBatch
		if d.HasArg("limit") {
			d.ScanArgs(t, "limit", &limit)
		}
		entries, err := RetireDue(tr.s, tr.now.Add(-retention), limit)
		if err != nil {
			d.Fatalf(t, "retire: %v", err)
		}
		ids := make([]string, len(entries))
		for i, e := range entries {
			ids[i] = e.Run
		}
		out := fmt.Sprintf("retire: %s\n", orNone(ids))
		if d.HasArg("write") && len(entries) > 0 {
			out += tr.writeScheduler(t, d, entries)
		}
		return out
	case "runs":
		var b strings.Builder
		_ = tr.s.EachRun(checkpoint.ListOptions{}, func(r *checkpoint.Run) bool {
			fmt.Fprintf(&b, "%s: %s, epoch %d, owner %s\n", r.ID, r.Status, r.Epoch, orDash(r.Owner))
			return true
		})
		return b.String()
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}

// writeScheduler writes entries as the leader does: with its term and name.
func (tr *transcript) writeScheduler(t *testing.T, d *datadriven.TestData, es []checkpoint.Entry) string {
	for i := range es {
		es[i].Term, es[i].Owner, es[i].At = 1, "leader", tr.now
	}
	return tr.write(t, d, es)
}

// write applies entries as one message at the next sequence and prints the verdicts.
func (tr *transcript) write(t *testing.T, d *datadriven.TestData, es []checkpoint.Entry) string {
	if len(es) == 0 {
		d.Fatalf(t, "no entries")
	}
	msg, err := checkpoint.EncodeMessageIn(checkpoint.NewestLogFormat, "transcript", es...)
	if err != nil {
		d.Fatalf(t, "encode: %v", err)
	}
	seq := tr.s.Applied() + 1
	verdicts, err := tr.s.Apply(seq, msg)
	if err != nil {
		d.Fatalf(t, "apply: %v", err)
	}
	var b strings.Builder
	for i, e := range es {
		what := e.Run
		switch {
		case e.Kind == checkpoint.KindWorkflow:
			what = e.Workflow.Name
		case e.Kind == checkpoint.KindCronTick && e.Run == "":
			what = e.Tick.Workflow
		}
		fmt.Fprintf(&b, "%d.%d %s %s: %s\n", seq, i, e.Kind, what, checkpoint.VerdictText(tr.s, seq, e, verdicts[i]))
	}
	return b.String()
}

func (tr *transcript) epochOf(run string) (int64, bool) {
	r, err := tr.s.Run(run)
	if err != nil {
		return 0, false
	}
	return r.Epoch, true
}

func (tr *transcript) live(run string) (int64, bool) {
	ep, ok := tr.leases[run]
	return ep, ok
}

// at prints a time as an offset from t0 (and the UTC time for cron ticks).
func (tr *transcript) at(x time.Time) string {
	off := x.Sub(t0)
	if off%time.Minute == 0 && (off >= time.Hour || off <= -time.Hour) {
		return x.UTC().Format(time.RFC3339)
	}
	if off >= 0 {
		return "+" + off.String()
	}
	return off.String()
}

func durArg(t *testing.T, d *datadriven.TestData, key string) time.Duration {
	var s string
	d.ScanArgs(t, key, &s)
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%s=%s: %v", key, s, err)
	}
	return v
}

func lines(input string) []string {
	var out []string
	for _, l := range strings.Split(input, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func orNone(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
