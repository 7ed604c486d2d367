package checkpoint

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/flowrun/flow/checkpoint/checkpointtest"
)

// kindName is an entry's kind, with fail split into final and not and cron_tick into
// fired and not.
func kindName(e Entry) string {
	switch {
	case e.Kind == KindFail && e.Final:
		return "fail final"
	case e.Kind == KindFail:
		return "fail not final"
	case e.Kind == KindCronTick && e.Submit != nil:
		return "cron_tick fired"
	case e.Kind == KindCronTick:
		return "cron_tick not fired"
	}
	return string(e.Kind)
}

// everyKind are the kind names (kindName) that a random log must have accepted.
func everyKind() []string {
	want := []string{"fail final", "fail not final", "cron_tick fired", "cron_tick not fired"}
	for _, k := range checkpointtest.Kinds {
		if k != "fail" && k != "cron_tick" {
			want = append(want, k)
		}
	}
	return want
}

// randomLogCoverage applies msgs to a fresh store and counts, by kind, the entries
// accepted, with fail split into final and not and cron_tick into fired and not, and
// the runs submitted again after a retire.
func randomLogCoverage(t *testing.T, msgs [][]byte) (map[string]int, int) {
	t.Helper()
	s := memStore(t, nil)
	accepted := map[string]int{}
	retired := map[string]bool{}
	again := 0
	for i, m := range msgs {
		seq := uint64(i + 1)
		entries, err := DecodeEnvelope(seq, m)
		if err != nil {
			t.Fatalf("message %d does not decode: %v\n%s", seq, err, m)
		}
		verdicts, err := s.Apply(seq, m)
		if err != nil {
			t.Fatalf("apply %d: %v", seq, err)
		}
		for j, e := range entries {
			if verdicts[j] != nil {
				continue
			}
			accepted[kindName(e)]++
			switch e.Kind {
			case KindRetire:
				retired[e.Run] = true
			case KindSubmit, KindCronTick:
				if retired[e.Run] {
					again++
					delete(retired, e.Run)
				}
			}
		}
	}
	return accepted, again
}

// The random log that the snapshot, replay and crash tests apply teaches every kind of
// entry: over a long log, each kind (fail final and not, cron_tick fired and not) is
// accepted, and a retired run's ID is submitted again. A kind the generator stops
// producing, or whose entries the state always refuses, fails this test.
func TestRandomLogCoversEveryKind(t *testing.T) {
	want := everyKind()
	for _, k := range []Kind{KindSubmit, KindAssign, KindClaim, KindStart, KindCommit, KindFail, KindComplete,
		KindCancel, KindDeadLetter, KindRequeue, KindRetry, KindCronTick, KindWorkflow, KindPurge, KindRetire} {
		if !slices.Contains(checkpointtest.Kinds, string(k)) {
			t.Errorf("checkpointtest.Kinds lacks %q: the random log does not know a kind of the format", k)
		}
	}
	for _, seed := range []uint64{1, 2, 3} {
		accepted, again := randomLogCoverage(t, checkpointtest.RandomLog(seed, 1000))
		var missing []string
		for _, k := range want {
			if accepted[k] == 0 {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 || again == 0 {
			t.Errorf("seed %d: a random log of 1000 messages has no accepted %s (runs submitted again after a retire: %d); accepted: %v",
				seed, strings.Join(missing, ", "), again, accepted)
		}
		t.Logf("seed %d: accepted %v; %d runs submitted again after their retire", seed, fmt.Sprint(accepted), again)
	}
}
