package rates

import (
	"context"
	"testing"
	"time"

	"github.com/flowrun/flow/workflow"
)

// BenchmarkReserve is the cost of one start's reservation on a real embedded NATS
// server (read, conditional write, read back), alone and with four nodes' limiters
// contending for one key (conflicts retried).
func BenchmarkReserve(b *testing.B) {
	for _, nodes := range []int{1, 4} {
		b.Run(map[int]string{1: "one-node", 4: "four-nodes"}[nodes], func(b *testing.B) {
			kvs := benchBuckets(b, nodes)
			var ls []*Limiter
			for _, kv := range kvs {
				ls = append(ls, New(Config{KV: kv}))
			}
			r := workflow.RateLimit{Key: "bench", Limit: 1_000_000, Per: workflow.Duration(time.Hour)}
			ctx := context.Background()
			next := make(chan *Limiter, len(ls))
			for _, l := range ls {
				next <- l
			}
			b.ResetTimer()
			if nodes == 1 { // one start at a time: the round trips alone
				for b.Loop() {
					if _, err := ls[0].Reserve(ctx, r); err != nil {
						b.Fatal(err)
					}
				}
				return
			}
			b.SetParallelism(2) // four starters on two cores, one per connection
			b.RunParallel(func(pb *testing.PB) {
				l := <-next
				next <- l
				for pb.Next() {
					if _, err := l.Reserve(ctx, r); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			var conflicts int64
			for _, l := range ls {
				conflicts += l.StatsOf("bench").Conflicts.Load()
			}
			b.ReportMetric(float64(conflicts)/float64(b.N), "conflicts/op")
		})
	}
}
