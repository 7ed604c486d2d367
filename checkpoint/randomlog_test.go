package checkpoint

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/flowrun/flow/checkpoint/checkpointtest"
)

// facet is a case of an entry kind that a random log must have accepted besides the
// kind itself: fail final and not, cron_tick fired and not, a retry from a step, a
// child's submit, a commit that consumes a signal, a tick's missed deadline, each kind
// of park ("" if the entry is none of these).
func facet(e Entry) string {
	switch {
	case e.Kind == KindFail && e.Final:
		return "fail final"
	case e.Kind == KindFail:
		return "fail not final"
	case e.Kind == KindCronTick && e.Submit != nil:
		return "cron_tick fired"
	case e.Kind == KindCronTick:
		return "cron_tick not fired"
	case e.Kind == KindRetry && len(e.Steps) > 0:
		return "retry from a step"
	case e.Kind == KindSubmit && e.Submit != nil && e.Submit.Parent != nil:
		return "submit of a child"
	case e.Kind == KindSubmit && e.Submit != nil && e.Submit.Trigger == TriggerEvent:
		return "submit by a message (format 3)"
	case e.Kind == KindCommit && e.Consume > 0:
		return "commit consuming a signal"
	case e.Kind == KindDeadlineMissed && e.Run == "":
		return "deadline-missed of a tick"
	case e.Kind == KindPark && e.Wait != nil:
		return "park for " + e.Wait.Kind
	}
	return ""
}

// Effects of accepted entries that a random log must have shown, counted from the
// store: a run's ID submitted again after its retire, a cancel cascading to a child,
// a handler run started.
const (
	effectAgain    = "a retired run's ID submitted again"
	effectCascade  = "a cancel cascading to a child"
	effectHandlers = "a handler run started"
)

// everyKind are what a random log must have accepted: every kind the decoder accepts
// (Kinds, which the decoder itself reads), every facet, every effect.
func everyKind() []string {
	var want []string
	for _, k := range Kinds() {
		want = append(want, string(k))
	}
	return append(want, "fail final", "fail not final", "cron_tick fired", "cron_tick not fired", "retry from a step",
		"submit of a child", "submit by a message (format 3)", "commit consuming a signal", "deadline-missed of a tick", "park for signal",
		"park for approval", "park for timer", "park for child", "park for concurrency", effectAgain, effectCascade, effectHandlers)
}

// logCoverage is what applying a random log to a fresh store accepted and refused, by
// kind, facet and effect.
type logCoverage struct {
	accepted, refused map[string]int
}

// randomLogCoverage applies msgs to a fresh store and counts, by kind and facet, the
// entries accepted and refused, and the effects the store shows.
func randomLogCoverage(t *testing.T, msgs [][]byte) logCoverage {
	t.Helper()
	s := memStore(t, nil)
	cov := logCoverage{accepted: map[string]int{}, refused: map[string]int{}}
	retired := map[string]bool{}
	status := func(id string) (*Run, bool) {
		r, err := s.Run(id)
		if errors.Is(err, ErrNotFound) {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return r, true
	}
	for i, m := range msgs {
		seq := uint64(i + 1)
		entries, err := DecodeEnvelope(seq, m)
		if err != nil {
			t.Fatalf("message %d does not decode: %v\n%s", seq, err, m)
		}
		// Before: the children a cancel may cascade to, the handler runs of each run.
		handlers := map[string]int{}
		live := map[string][]string{}
		for _, e := range entries {
			r, ok := status(e.Run)
			if !ok {
				continue
			}
			handlers[e.Run] = len(r.HandlerRuns)
			if e.Kind == KindCancel {
				for _, c := range r.Children {
					if cr, ok := status(c); ok && !cr.Status.Terminal() {
						live[e.Run] = append(live[e.Run], c)
					}
				}
			}
		}
		verdicts, err := s.Apply(seq, m)
		if err != nil {
			t.Fatalf("apply %d: %v\n%s", seq, err, m)
		}
		for j, e := range entries {
			counts := cov.accepted
			if verdicts[j] != nil {
				counts = cov.refused
			}
			counts[string(e.Kind)]++
			if f := facet(e); f != "" {
				counts[f]++
			}
			if verdicts[j] != nil {
				continue
			}
			switch e.Kind {
			case KindRetire:
				retired[e.Run] = true
			case KindSubmit, KindCronTick:
				if retired[e.Run] {
					cov.accepted[effectAgain]++
					delete(retired, e.Run)
				}
			}
		}
		for id, children := range live {
			for _, c := range children {
				if cr, ok := status(c); ok && cr.Status == StatusCancelled {
					cov.accepted[effectCascade]++
				}
			}
			_ = id
		}
		for id, n := range handlers {
			if r, ok := status(id); ok && len(r.HandlerRuns) > n {
				cov.accepted[effectHandlers] += len(r.HandlerRuns) - n
			}
		}
	}
	return cov
}

// Kinds is the decoder's list: each of its kinds decodes at the newest revision and
// passes Validate's switch (its error, if any, is about the entry's fields, not an
// unknown kind); a kind not in it is corruption to the decoder.
func TestKindsAreWhatTheDecoderAccepts(t *testing.T) {
	kinds := Kinds()
	if len(kinds) < 23 {
		t.Fatalf("Kinds() has %d kinds, want at least the 23 of revision 4: %v", len(kinds), kinds)
	}
	for _, k := range append(kinds, "nope", "Submit") {
		msg := fmt.Appendf(nil, `{"v":%d,"node":"x","entries":[{"k":%q,"at":"2026-11-29T02:00:00Z"}]}`, MaxRevision(LogFormatJSON), k)
		_, err := DecodeMessage(1, msg)
		var corrupt *CorruptError
		unknown := errors.As(err, &corrupt) && strings.Contains(corrupt.Detail, "unknown kind")
		if known := slices.Contains(kinds, k); known == unknown {
			t.Errorf("kind %q: in Kinds() %v, but the decoder says %v", k, known, err)
		}
		e := Entry{Kind: k}
		if verr := e.Validate(); slices.Contains(kinds, k) && verr != nil && strings.Contains(verr.Error(), "unknown kind") {
			t.Errorf("kind %q is in Kinds() but Validate does not know it: %v", k, verr)
		}
	}
}

// The random log that the snapshot, replay, crash tests and fuzzers apply teaches every
// kind of entry the decoder accepts (Kinds, not a list of this test's): over a long
// log, each kind and facet is accepted, a good share of each kind's entries is
// accepted and some are refused, and each effect is seen. A kind the generator does
// not produce, or whose entries the state always refuses, fails this test.
func TestRandomLogCoversEveryKind(t *testing.T) {
	want := everyKind()
	for _, seed := range []uint64{1, 2, 3} {
		cov := randomLogCoverage(t, checkpointtest.RandomLog(seed, 1000))
		var missing []string
		for _, k := range want {
			if cov.accepted[k] == 0 {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			t.Errorf("seed %d: a random log of 1000 messages has no accepted %s", seed, strings.Join(missing, ", "))
		}
		var lines []string
		for _, k := range Kinds() {
			a, r := cov.accepted[string(k)], cov.refused[string(k)]
			lines = append(lines, fmt.Sprintf("%s %d/%d", k, a, r))
			switch {
			case r == 0:
				t.Errorf("seed %d: no %s entry refused (%d accepted): the log never tries one the state must refuse", seed, k, a)
			case k != KindClusterVersion && a*10 < a+r:
				// The cluster version moves up once a log: its entries are mostly refused.
				t.Errorf("seed %d: %d of %d %s entries accepted, under a tenth: the log mostly tries what the state refuses", seed, a, a+r, k)
			}
		}
		for _, k := range want[len(Kinds()):] {
			lines = append(lines, fmt.Sprintf("%s %d/%d", k, cov.accepted[k], cov.refused[k]))
		}
		t.Logf("seed %d, accepted/refused: %s", seed, strings.Join(lines, ", "))
	}
}
