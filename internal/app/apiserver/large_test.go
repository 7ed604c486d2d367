package apiserver

import (
	"strings"
	"testing"
)

// Large requests are bounded per user before they are decoded (issue 36); small ones are
// never counted, other users keep their allowance. Control: the switch off, all pass.
func TestLargeRequestsPerUser(t *testing.T) {
	for _, off := range []bool{false, true} {
		l := &largeLimiter{off: off}
		refusedAt := 0
		for i := 1; i <= 20; i++ {
			if why, hold, ok := l.admit("ACC/mallory", "mallory", 900<<10); !ok {
				if hold <= 0 || hold > largeHold {
					t.Fatalf("the refusal is held back %s; want until the allowance would admit it, at most %s", hold, largeHold)
				}
				if !strings.Contains(why, "mallory sent more than") {
					t.Fatalf("the refusal %q does not name the user", why)
				}
				refusedAt = i
				break
			}
		}
		switch {
		case off && refusedAt != 0:
			t.Fatalf("control: refused at %d", refusedAt)
		case !off && (refusedAt == 0 || refusedAt > 10):
			t.Fatalf("900 KB requests at once: refused at %d; want within the 4 MiB burst", refusedAt)
		}
		if _, _, ok := l.admit("ACC/mallory", "mallory", 1000); !ok {
			t.Fatal("a small request was counted")
		}
		if _, _, ok := l.admit("ACC/ann", "ann", 900<<10); !ok {
			t.Fatal("another user was refused")
		}
	}
}
