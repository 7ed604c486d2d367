package engine

import (
	"github.com/flowrun/flow/checkpoint"
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestZZTimeline(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Workers = 8; c.Lease.TTL = 10 * time.Second })
	apply(t, e, chainWorkflow("w2", 10))
	ctx := ctxT(t, time.Minute)
	var lat []time.Duration
	var parts [6][]time.Duration
	for r := 0; r < 200; r++ {
		start := time.Now()
		id, err := e.StartRun(ctx, "w2", nil, RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.WaitRun(ctx, id); err != nil {
			t.Fatal(err)
		}
		end := time.Now()
		lat = append(lat, end.Sub(start))
		v, _ := e.Run(id)
		var sub, asg, clm, s1, last, cpl time.Time
		for _, ev := range v.Events {
			switch {
			case ev.Kind == "submit":
				sub = ev.At
			case ev.Kind == "assign":
				asg = ev.At
			case ev.Kind == "claim":
				clm = ev.At
			case ev.Kind == "start" && ev.Step == "s1":
				s1 = ev.At
			case ev.Kind == "commit" && ev.Step == "s10":
				last = ev.At
			case ev.Kind == "complete":
				cpl = ev.At
			}
		}
		parts[0] = append(parts[0], asg.Sub(sub))
		parts[1] = append(parts[1], clm.Sub(asg))
		parts[2] = append(parts[2], s1.Sub(clm))
		parts[3] = append(parts[3], last.Sub(s1))
		parts[4] = append(parts[4], cpl.Sub(last))
		parts[5] = append(parts[5], end.Sub(cpl))
	}
	slices.Sort(lat)
	fmt.Println("p50", lat[100], "p99", lat[198])
	for i, n := range []string{"submit>assign", "assign>claim", "claim>s1", "s1>s10", "s10>complete", "complete>wake"} {
		slices.Sort(parts[i])
		fmt.Println(n, parts[i][100])
	}
}

func TestZZAckApply(t *testing.T) {
	TestZZTimeline(t)
	a := slices.Clone(checkpoint.AckToApply)
	p := slices.Clone(checkpoint.PubDur)
	slices.Sort(a)
	slices.Sort(p)
	fmt.Println("ack->applied p50", a[len(a)/2], "p10", a[len(a)/10], "p90", a[len(a)*9/10], "n", len(a))
	fmt.Println("publish p50", p[len(p)/2], "p10", p[len(p)/10], "p90", p[len(p)*9/10])
}
