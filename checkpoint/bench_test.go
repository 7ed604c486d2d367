package checkpoint

import (
	"encoding/json"
	"os"
	"testing"
)

// BenchmarkApply: the state machine alone (Pebble NoSync), 16 commits per message.
func BenchmarkApply(b *testing.B) {
	s := memStore(b, nil)
	mustApply(b, s, submitEntry("bench", StepSpec{Name: "each", Foreach: true}))
	epoch := int64(mustApply(b, s, Entry{Kind: KindAssign, Run: "bench", Term: 1, At: t0}))
	mustApply(b, s, Entry{Kind: KindClaim, Run: "bench", Epoch: epoch, Owner: "w", At: t0})
	out := json.RawMessage(`{"driver":"d-000123","cents":123456}`)
	per := 16
	if os.Getenv("APPLY_PER") == "1" {
		per = 1
	}
	msgs := make([][]byte, 0, b.N/per+1)
	for i := 0; i < b.N; i += per {
		var es []Entry
		for j := i; j < min(i+per, b.N); j++ {
			es = append(es, Entry{Kind: KindCommit, Run: "bench", Step: "each", Item: j, Epoch: epoch, Owner: "w", Output: out, At: t0})
		}
		msgs = append(msgs, msg(b, es...))
	}
	b.ResetTimer()
	for _, m := range msgs {
		if _, err := s.Apply(s.Applied()+1, m); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
}
