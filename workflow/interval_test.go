package workflow

import (
	"testing"
	"time"
)

// The data interval of a nightly run: the tick and the fire time before it, in the
// schedule's timezone; a run started by hand gets the latest tick before it.
func TestIntervalOfANightlyRun(t *testing.T) {
	w := &Workflow{Schedule: &Schedule{Cron: "0 2 * * *", Timezone: "Asia/Jakarta"}}
	tick := time.Date(2026, 11, 28, 19, 0, 0, 0, time.UTC) // 02:00 on the 29th in Jakarta (UTC+7)
	iv := Interval(w, tick, time.Time{})
	want := map[string]any{"tick": "2026-11-29T02:00:00+07:00", "tick_date": "2026-11-29", "prev_tick": "2026-11-28T02:00:00+07:00", "prev_tick_date": "2026-11-28"}
	for k, v := range want {
		if iv[k] != v {
			t.Fatalf("%s = %v, want %v (%v)", k, iv[k], v, iv)
		}
	}
	manual := Interval(w, time.Time{}, time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC)) // 10:00 in Jakarta
	if manual["tick"] != "2026-11-29T02:00:00+07:00" {
		t.Fatalf("a run started by hand: %v", manual)
	}
	if Interval(&Workflow{}, tick, tick) != nil {
		t.Fatal("an unscheduled workflow has no interval")
	}
}

// A deadline of "06:00" is the first 06:00 after the tick in the schedule's timezone; a
// duration counts from the tick, or from the start of a run started by hand.
func TestDeadlineFor(t *testing.T) {
	w := &Workflow{Deadline: "06:00", Schedule: &Schedule{Cron: "0 2 * * *", Timezone: "Asia/Jakarta"}}
	tick := time.Date(2026, 11, 28, 19, 0, 0, 0, time.UTC) // 02:00 Jakarta
	if got := DeadlineFor(w, tick, time.Time{}); !got.Equal(time.Date(2026, 11, 28, 23, 0, 0, 0, time.UTC)) {
		t.Fatalf("06:00 after a 02:00 tick: %s", got)
	}
	late := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC) // 08:00 Jakarta: the next day's 06:00
	if got := DeadlineFor(w, late, time.Time{}); !got.Equal(time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC)) {
		t.Fatalf("06:00 after an 08:00 tick: %s", got)
	}
	w.Deadline = "4h"
	if got := DeadlineFor(w, time.Time{}, late); !got.Equal(late.Add(4 * time.Hour)) {
		t.Fatalf("4h after a start: %s", got)
	}
	for _, bad := range []string{"25:00", "6am", "-1h", "0s"} {
		if _, err := parseDeadline(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}
