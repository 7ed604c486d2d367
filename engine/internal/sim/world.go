package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/gate"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/logstream"
)

// The world around the cluster: its start, the faults, the end of the run and the
// checks that need the whole picture (liveness, the final states).

// start opens the reference store, the server and the nodes, and schedules the
// workload and the faults.
func (s *Sim) start() error {
	ref, err := checkpoint.OpenStore("ref", checkpoint.StoreOptions{FS: vfs.NewMem(), Hooks: s.cfg.Switches.Hooks})
	if err != nil {
		return err
	}
	s.ref = ref
	s.srv = newServer(s)
	// The nodes' appliers record the log's identity; the reference applies the same log.
	if err := ref.SetLogIdentity(logstream.Identity(port.LogStream, s.srv.created)); err != nil {
		return err
	}
	for i := 0; i < s.cfg.Nodes; i++ {
		s.nodes = append(s.nodes, newNode(s, i))
	}
	// The cluster was there before (a rolling upgrade under way): its roster has every
	// node, with the formats it reads, and perhaps an operator's hold on the version,
	// which the client releases at Release.
	r := gate.Roster{Members: map[string]gate.Member{}}
	for _, n := range s.nodes {
		m := gate.Member{Binary: "sim", Since: T0}
		for f := 1; f <= n.reads; f++ {
			m.Formats = append(m.Formats, f)
		}
		r.Members[n.name] = m
		s.check.Member(n.name, n.reads)
	}
	if s.cfg.Hold {
		r.Hold = &gate.Hold{By: "ops", Reason: "sim", At: T0}
	}
	raw, _ := json.Marshal(r)
	if _, err := s.srv.kv[port.ClusterBucket].create("roster", raw); err != nil {
		return err
	}
	for _, n := range s.nodes {
		n.boot()
	}
	s.cl = newClient(s)
	s.cl.start()
	s.scheduleFaults()
	if s.cfg.OldNode >= 0 && s.cfg.Upgrade > 0 {
		s.after(s.cfg.Upgrade, s.nodes[s.cfg.OldNode].upgrade)
	}
	return nil
}

// scheduleFaults draws the faults' times and targets, all before FaultsFor, when every
// fault heals.
func (s *Sim) scheduleFaults() {
	c := s.cfg
	window := int64(c.FaultsFor)
	pick := func() *node { return s.nodes[s.rng.IntN(len(s.nodes))] }
	for i := 0; i < c.Partitions; i++ {
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := 200*time.Millisecond + time.Duration(s.rng.Int64N(int64(3*c.TTL)))
		s.after(at, func() {
			if !n.partitioned && s.faultOn {
				n.partitioned = true
				s.stats.Partitions++
				s.tracef(n.name, "PARTITIONED for %s", d)
				s.after(d, func() { s.heal(n) })
			}
		})
	}
	for i := 0; i < c.Pauses; i++ {
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := 100*time.Millisecond + time.Duration(s.rng.Int64N(int64(3*c.TTL)))
		s.after(at, func() {
			if s.faultOn && n.alive && !n.paused {
				n.pause()
				s.after(d, n.resume)
			}
		})
	}
	for i := 0; i < c.Kills; i++ {
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := 100*time.Millisecond + time.Duration(s.rng.Int64N(int64(2*c.TTL)))
		s.after(at, func() {
			if s.faultOn && n.alive {
				n.kill()
				s.after(d, n.restart)
			}
		})
	}
	for i := 0; i < c.Drains; i++ {
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := 100*time.Millisecond + time.Duration(s.rng.Int64N(int64(2*c.TTL)))
		s.after(at, func() {
			if s.faultOn {
				n.drain(d)
			}
		})
	}
	for i := 0; i < c.LogCuts; i++ {
		// The log's stream and the buckets are separate JetStream assets, each with a
		// leader of its own: a node may reach the one and not the other. Its leases
		// renew, while it hears nothing of the log (a new epoch of its run, included).
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := 200*time.Millisecond + time.Duration(s.rng.Int64N(int64(3*c.TTL)))
		s.after(at, func() {
			if !n.logCut && s.faultOn {
				n.logCut = true
				s.stats.LogCuts++
				s.tracef(n.name, "LOG CUT OFF for %s (the buckets still reached)", d)
				s.after(d, func() { s.heal(n) })
			}
		})
	}
	for i := 0; i < c.Slows; i++ {
		n, at := pick(), time.Duration(s.rng.Int64N(window))
		d := time.Second + time.Duration(s.rng.Int64N(int64(4*c.TTL)))
		by := c.TTL/4 + time.Duration(s.rng.Int64N(int64(2*c.TTL)))
		s.after(at, func() {
			if s.faultOn {
				s.stats.Slows++
				n.slowUntil, n.slowBy = s.now.Add(d), by
				s.tracef(n.name, "SLOW for %s: its events run up to %s late", d, by)
			}
		})
	}
	s.after(c.FaultsFor, func() {
		s.faultOn = false
		s.tracef("--", "faults end")
		for _, n := range s.nodes {
			s.heal(n)
			n.resume()
			n.slowUntil = time.Time{}
			n.restart()
		}
		s.watchEnd()
	})
}

func (s *Sim) heal(n *node) {
	if n.logCut {
		n.logCut = false
		s.tracef(n.name, "log reached again")
	}
	if n.partitioned {
		n.partitioned = false
		s.tracef(n.name, "partition healed")
	}
}

// watchEnd looks, once the faults are over, for the end: every run ended and every
// node caught up; past Settle, a run still not ended breaks liveness.
func (s *Sim) watchEnd() {
	deadline := s.now.Add(s.cfg.Settle)
	var look func()
	look = func() {
		if s.finishedAll() {
			s.finished = true
			return
		}
		if !s.now.Before(deadline) {
			s.fail("liveness", "%s after the faults stopped, runs have not ended: %s", s.cfg.Settle, s.unfinished())
			return
		}
		s.after(250*time.Millisecond, look)
	}
	look()
}

// finishedAll: the client's work is done, every run ended, and every node is up and
// applied the whole log.
func (s *Sim) finishedAll() bool {
	if !s.cl.done() || s.unfinished() != "" {
		return false
	}
	for _, n := range s.nodes {
		if !n.up || n.eng.Applied() != s.srv.lastSeq() {
			return false
		}
	}
	return true
}

// unfinished lists the runs that have not ended, with their status ("" if none).
func (s *Sim) unfinished() string {
	var out []string
	for _, st := range []checkpoint.RunStatus{checkpoint.StatusPending, checkpoint.StatusRunning, checkpoint.StatusWaiting} {
		_ = s.ref.EachRun(checkpoint.ListOptions{Status: st}, func(r *checkpoint.Run) bool {
			out = append(out, fmt.Sprintf("%s (%s, epoch %d, owner %q)", r.ID, r.Status, r.Epoch, r.Owner))
			return true
		})
	}
	return strings.Join(out, ", ")
}

// shutdown ends every incarnation (as a kill: nothing more reaches the world) and waits
// for their engines' goroutines to end: the bubble must be empty when Run returns. The
// loop's events are dropped; the calls the engines make while they stop are answered
// with errDead.
func (s *Sim) shutdown() {
	for _, n := range s.nodes {
		if n.alive {
			n.die(true)
		}
	}
	s.faultOn = false
	s.closing = true
	for _, n := range s.nodes {
		for _, c := range n.heldOut {
			s.send(c)
		}
		n.heldOut = nil
	}
	for c := range s.open {
		s.deliverNow(c, result{err: fmt.Errorf("%s: %w", c.label, errDead)})
	}
	stopped := func() bool {
		for _, l := range s.lives {
			select {
			case <-l.stopped:
			default:
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(10 * time.Minute); !stopped(); {
		synctest.Wait()
		s.now = time.Now()
		if s.collect() {
			continue
		}
		if time.Now().After(deadline) {
			s.fail("sim", "the nodes' engines did not stop within 10 minutes of the end")
			break
		}
		t := time.NewTimer(100 * time.Millisecond) // their timers move on meanwhile
		select {
		case <-t.C:
		case <-s.in.kick:
		}
		t.Stop()
	}
	synctest.Wait()
	s.collect()
}

// final checks invariant 9 at the end: every node's state, with the rest of the log
// applied to it, is the reference's, byte for byte; and counts how the runs ended.
func (s *Sim) final() error {
	var want bytes.Buffer
	if err := s.ref.Dump(&want); err != nil {
		return err
	}
	for _, n := range s.nodes {
		st, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: n.fs, Hooks: s.cfg.Switches.Hooks})
		if err != nil {
			return fmt.Errorf("%s: open its state: %w", n.name, err)
		}
		for seq := st.Applied() + 1; seq <= s.srv.lastSeq(); seq++ {
			if _, err := st.Apply(seq, s.srv.log[seq-1]); err != nil {
				st.Close()
				return fmt.Errorf("%s: apply %d: %w", n.name, seq, err)
			}
		}
		var got bytes.Buffer
		err = st.Dump(&got)
		st.Close()
		if err != nil {
			return err
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			s.fail("9", "%s's state differs from the whole log's (%s)", n.name, firstDiff(got.String(), want.String()))
			return s.failure
		}
	}
	// Invariant "sws": a run that signal-with-start started holds that signal from its
	// first sequence on (the submit and the signal were one message).
	for i := 1; i <= s.cfg.SignalStarts; i++ {
		id := fmt.Sprintf("s%d", i)
		r, err := s.ref.Run(id)
		if errors.Is(err, checkpoint.ErrNotFound) && !s.signalStarted[id] {
			continue // no call got through
		}
		if err != nil {
			s.fail("sws", "run %s: %v (a signal-with-start said it got through)", id, err)
			return s.failure
		}
		if !slices.ContainsFunc(r.Inbox, func(sig checkpoint.SignalRecord) bool { return sig.Seq == r.CreatedSeq }) {
			s.fail("sws", "run %s, created at sequence %d, has no signal of that sequence (inbox %+v): started without its signal", id, r.CreatedSeq, r.Inbox)
			return s.failure
		}
		s.stats.SignalStarts++
	}
	// Invariant "event": a message started exactly one run, whichever nodes and leaders
	// its copies and retries reached (the run ID, rendered from the message, is the key).
	for i := 1; i <= s.cfg.Events; i++ {
		id := fmt.Sprintf("ev-%d", i)
		runs, err := s.ref.RunsWithIDPrefix(id, 10)
		if err != nil {
			return err
		}
		var mine []string
		for _, r := range runs {
			if r.ID == id || strings.HasPrefix(r.ID, id+"-") {
				mine = append(mine, r.ID)
				if r.Trigger != checkpoint.TriggerEvent {
					s.fail("event", "run %s has trigger %q, not event", r.ID, r.Trigger)
					return s.failure
				}
			}
		}
		switch {
		case len(mine) > 1:
			s.fail("event", "message %d started %d runs: %v", i, len(mine), mine)
			return s.failure
		case len(mine) == 0 && s.eventSettled[i]:
			s.fail("event", "message %d: a delivery said its run started or existed, and there is none", i)
			return s.failure
		case len(mine) == 1:
			s.stats.TriggerRuns++
		}
	}
	for _, st := range []checkpoint.RunStatus{checkpoint.StatusSucceeded, checkpoint.StatusFailed, checkpoint.StatusCancelled} {
		c, _ := s.ref.CountRuns(st)
		switch st {
		case checkpoint.StatusSucceeded:
			s.stats.Succeeded = c
		case checkpoint.StatusFailed:
			s.stats.Failed = c
		default:
			s.stats.Cancelled = c
		}
	}
	return nil
}

func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(la) && i < len(lb); i++ {
		if la[i] != lb[i] {
			return fmt.Sprintf("line %d: %.120s vs %.120s", i+1, la[i], lb[i])
		}
	}
	return fmt.Sprintf("%d lines vs %d", len(la), len(lb))
}

// observe counts what the log's verdicts show.
func (s *Sim) observe(entries []checkpoint.Entry, verdicts []error) {
	for i, e := range entries {
		v := verdicts[i]
		switch {
		case errors.Is(v, checkpoint.ErrFenced):
			s.stats.Fenced++
		case errors.Is(v, checkpoint.ErrStaleTerm):
			s.stats.Stale++
		case errors.Is(v, checkpoint.ErrDeadLettered):
			s.stats.DeadLettered++
		case v != nil:
			continue
		}
		if e.Term > 0 && !s.terms[e.Term] {
			s.terms[e.Term] = true
			s.stats.Terms++
		}
		switch e.Kind {
		case checkpoint.KindPark:
			s.stats.Parks++
		case checkpoint.KindWake:
			s.stats.Wakes++
			if s.alarms[e.Run] {
				s.stats.UntilWakes++
			}
			if _, slotted := s.keyStep[e.Run]; slotted {
				s.stats.SlotGrants++
			}
		case checkpoint.KindClusterVersion:
			s.stats.Raises++
		case checkpoint.KindSignal:
			s.stats.Signals++
		case checkpoint.KindDecide:
			s.stats.Decisions++
		case checkpoint.KindCancel:
			s.stats.Cancels++
		case checkpoint.KindDeadlineMissed:
			s.stats.DeadlinesMissed++
		case checkpoint.KindCronPause:
			s.stats.CronPauses++
		case checkpoint.KindRetry:
			s.stats.Retries++
			if len(e.Steps) > 0 {
				s.stats.RetriesFrom++
			}
		case checkpoint.KindSubmit, checkpoint.KindCronTick:
			switch {
			case e.Submit == nil:
			case e.Submit.Parent != nil:
				s.stats.Children++
			case e.Submit.Trigger == checkpoint.TriggerBackfill:
				s.stats.Backfilled++
			}
		}
		// A handler run is made by the store with the event that calls for it; its
		// first accepted entry counts it.
		if strings.Contains(e.Run, ".on-") && !s.handlers[e.Run] {
			s.handlers[e.Run] = true
			s.stats.Handlers++
			if strings.Contains(e.Run, ".on-dead-letter.") {
				s.stats.DeadLetterHandlers++
			}
		}
		switch {
		case e.Kind == checkpoint.KindCommit:
			s.stats.Commits++
		case e.Kind == checkpoint.KindAssign:
			s.stats.Assigns++
			if e.Reason != "" {
				s.stats.Reclaims++
			}
		case e.Kind == checkpoint.KindCronTick:
			s.stats.Ticks++
		}
	}
}

// entryText is an entry for the trace.
func entryText(e checkpoint.Entry) string {
	var b strings.Builder
	b.WriteString(string(e.Kind))
	if e.Run != "" {
		b.WriteString(" " + e.Run)
	}
	if e.Step != "" {
		fmt.Fprintf(&b, "/%s", e.Step)
		if e.Item != checkpoint.ItemWhole {
			fmt.Fprintf(&b, "[%d]", e.Item)
		}
	}
	if e.Epoch != 0 {
		fmt.Fprintf(&b, " epoch=%d", e.Epoch)
	}
	if e.Term != 0 {
		fmt.Fprintf(&b, " term=%d", e.Term)
	}
	if e.Owner != "" {
		fmt.Fprintf(&b, " by=%s", e.Owner)
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, " reason=%s", e.Reason)
	}
	if e.Status != "" {
		fmt.Fprintf(&b, " status=%s", e.Status)
	}
	if e.Tick != nil {
		fmt.Fprintf(&b, " %s@%s:%s", e.Tick.Workflow, e.Tick.At.Sub(T0), e.Tick.Outcome)
	}
	return b.String()
}
