package checkpoint

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// BenchmarkEachQueuedAt: one admission pass (the first 64 runs by effective priority,
// as the leader's PlanAssign takes them) over 50,000 queued runs of 4 workflows, with
// every run at priority 0 and with them spread over 11 priorities (-5 to 5), aged at
// a minute: what priorities cost a pass (docs/perf.md).
func BenchmarkEachQueuedAt(b *testing.B) {
	for _, priorities := range []int{1, 11} {
		b.Run(fmt.Sprintf("priorities-%d", priorities), func(b *testing.B) {
			s, err := OpenStore("state", StoreOptions{FS: vfs.NewMem()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			const runs, perMsg = 50000, 100
			at := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
			for m := 0; m < runs/perMsg; m++ {
				var es []Entry
				for i := 0; i < perMsg; i++ {
					n := m*perMsg + i
					p := 0
					if priorities > 1 {
						p = n%priorities - priorities/2
					}
					es = append(es, Entry{Kind: KindSubmit, Run: fmt.Sprintf("r%06d", n), At: at.Add(time.Duration(n) * time.Second),
						Submit: &Submit{Workflow: fmt.Sprintf("w%d", n%4), Version: 1, Trigger: TriggerManual, MaxEpochs: 3, Steps: []StepSpec{{Name: "a"}}, Priority: p}})
				}
				msg, err := EncodeMessageIn(NewestLogFormat, "bench", es...)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.Apply(uint64(m+1), msg); err != nil {
					b.Fatal(err)
				}
			}
			now := at.Add(runs * time.Second)
			b.ResetTimer()
			for range b.N {
				taken := 0
				if err := s.EachQueuedAt(now, time.Minute, func(*Run) QueueVerdict {
					if taken++; taken == 64 {
						return QueueStop
					}
					return QueueNext
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
