package backoff

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

func TestCeilingGrowsAndCaps(t *testing.T) {
	p := Policy{Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond}
	want := []time.Duration{10, 20, 40, 80, 100, 100}
	for i, w := range want {
		if got := p.Ceiling(i); got != w*time.Millisecond {
			t.Fatalf("Ceiling(%d) = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	if got := p.Ceiling(1000); got != 100*time.Millisecond {
		t.Fatalf("Ceiling(1000) = %v, want the cap", got)
	}
}

func TestDelayIsFullJitterWithinCeiling(t *testing.T) {
	p := Policy{Base: time.Millisecond, Cap: 8 * time.Millisecond}
	var low, high bool
	for i := 0; i < 2000; i++ {
		d := p.Delay(3)
		if d < 0 || d > 8*time.Millisecond {
			t.Fatalf("Delay(3) = %v, outside [0, 8ms]", d)
		}
		low = low || d < 2*time.Millisecond
		high = high || d > 6*time.Millisecond
	}
	if !low || !high {
		t.Fatalf("2000 draws never reached both ends of [0, 8ms]: not full jitter (low %v, high %v)", low, high)
	}
	if d := (Policy{Base: time.Second, NoJitter: true}).Delay(0); d != time.Second {
		t.Fatalf("NoJitter Delay(0) = %v, want 1s", d)
	}
}

// The jitter is spread evenly over [0, ceiling] across moments, and the same moment
// draws the same wait: two bubbles (synctest) on the same clock draw the same waits.
func TestDelayIsEvenAndReplays(t *testing.T) {
	p := Policy{Base: time.Millisecond, Cap: 8 * time.Millisecond}
	draw := func() []time.Duration {
		var out []time.Duration
		synctest.Test(t, func(t *testing.T) {
			for i := range 8000 {
				time.Sleep(time.Duration(i%97+1) * time.Microsecond)
				out = append(out, p.Delay(3))
			}
		})
		return out
	}
	a, b := draw(), draw()
	if !slices.Equal(a, b) {
		t.Fatal("the same moments drew different waits")
	}
	var buckets [8]int
	for _, d := range a {
		buckets[min(int(d/time.Millisecond), 7)]++
	}
	for i, n := range buckets {
		if n < 800 || n > 1200 { // 1000 expected
			t.Fatalf("bucket %d ms holds %d of 8000 draws (want about 1000): %v", i, n, buckets)
		}
	}
}
