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
