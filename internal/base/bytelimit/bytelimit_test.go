package bytelimit

import (
	"testing"
	"time"
)

// A key spends its burst, then its rate; a refusal says how long until it would have
// been admitted and spends nothing; another key has its own allowance; idle keys go.
func TestTake(t *testing.T) {
	now := time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)
	l := New(100, 200)
	l.SetClock(func() time.Time { return now })
	if _, ok := l.Take("a", 200); !ok {
		t.Fatal("the burst")
	}
	wait, ok := l.Take("a", 50)
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("past the burst: %v %s; want refused, 500ms until admitted", ok, wait)
	}
	now = now.Add(500 * time.Millisecond)
	if _, ok := l.Take("a", 50); !ok {
		t.Fatal("the refusal spent the allowance")
	}
	if _, ok := l.Take("b", 200); !ok {
		t.Fatal("another key")
	}
	if wait, ok := l.Take("c", 201); ok || wait != 0 {
		t.Fatalf("more than a burst: %v %s; want refused for good", ok, wait)
	}
	now = now.Add(2 * time.Minute)
	if _, ok := l.Take("d", 1); !ok || l.Keys() != 1 {
		t.Fatalf("idle keys: %d kept", l.Keys())
	}
}
