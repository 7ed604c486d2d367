package workflow

import (
	"fmt"
	"time"
)

// Data intervals: a run of a scheduled workflow closes the interval between
// the schedule's previous fire time and its own (its tick). Templates read them as
// schedule.tick and schedule.prev_tick (RFC 3339 in the schedule's timezone) and
// schedule.tick_date and schedule.prev_tick_date (YYYY-MM-DD there).

// IntervalKeys are the names under `schedule.` that templates may read.
var IntervalKeys = map[string]bool{"tick": true, "prev_tick": true, "tick_date": true, "prev_tick_date": true}

// Interval is the data interval of a run of w scheduled at tick (a fired, caught-up or
// backfilled run); for a run started by hand, at the schedule's latest fire time at or
// before started. nil when w has no schedule.
func Interval(w *Workflow, tick, started time.Time) map[string]any {
	if w == nil || w.Schedule == nil {
		return nil
	}
	sched, err := CronParser.Parse(w.Schedule.Cron)
	if err != nil {
		return nil
	}
	loc, err := time.LoadLocation(w.Schedule.Timezone)
	if err != nil {
		return nil
	}
	// The schedule's fire times are in its timezone (Next keeps its argument's).
	if tick.IsZero() {
		tick = prevFire(sched, started.In(loc).Add(time.Nanosecond))
		if tick.IsZero() {
			return nil
		}
	}
	tick = tick.In(loc)
	out := map[string]any{"tick": tick.Format(time.RFC3339), "tick_date": tick.Format("2006-01-02")}
	if prev := prevFire(sched, tick); !prev.IsZero() {
		prev = prev.In(loc)
		out["prev_tick"], out["prev_tick_date"] = prev.Format(time.RFC3339), prev.Format("2006-01-02")
	}
	return out
}

// prevFire is the latest fire time before t (within a year), or zero.
func prevFire(s interface{ Next(time.Time) time.Time }, t time.Time) time.Time {
	for _, back := range []time.Duration{time.Minute, time.Hour, 25 * time.Hour, 8 * 24 * time.Hour, 32 * 24 * time.Hour, 367 * 24 * time.Hour} {
		f := s.Next(t.Add(-back))
		if f.IsZero() || !f.Before(t) {
			continue
		}
		for n := s.Next(f); !n.IsZero() && n.Before(t); n = s.Next(n) {
			f = n
		}
		return f
	}
	return time.Time{}
}

// deadlineSpec is a parsed deadline: a time of day (hour, minute) or a duration.
type deadlineSpec struct {
	timeOfDay    bool
	hour, minute int
	after        time.Duration
}

func parseDeadline(s string) (deadlineSpec, error) {
	var h, m int
	if n, err := fmt.Sscanf(s, "%d:%d", &h, &m); err == nil && n == 2 && len(s) == 5 {
		if h < 0 || h > 23 || m < 0 || m > 59 {
			return deadlineSpec{}, fmt.Errorf("no such time of day")
		}
		return deadlineSpec{timeOfDay: true, hour: h, minute: m}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return deadlineSpec{}, fmt.Errorf("neither a time of day (HH:MM) nor a positive duration")
	}
	return deadlineSpec{after: d}, nil
}

// DeadlineFor is when a run of w scheduled at tick (zero: started by hand at started)
// should have succeeded: zero when w has no deadline. A time of day is the first one at
// or after the tick (or start) in the schedule's timezone (UTC without a schedule).
func DeadlineFor(w *Workflow, tick, started time.Time) time.Time {
	if w == nil || w.Deadline == "" {
		return time.Time{}
	}
	spec, err := parseDeadline(w.Deadline)
	if err != nil {
		return time.Time{}
	}
	base := tick
	if base.IsZero() {
		base = started
	}
	if !spec.timeOfDay {
		return base.Add(spec.after).UTC()
	}
	loc := time.UTC
	if w.Schedule != nil {
		if l, err := time.LoadLocation(w.Schedule.Timezone); err == nil {
			loc = l
		}
	}
	b := base.In(loc)
	at := time.Date(b.Year(), b.Month(), b.Day(), spec.hour, spec.minute, 0, 0, loc)
	if at.Before(b) {
		at = time.Date(b.Year(), b.Month(), b.Day()+1, spec.hour, spec.minute, 0, 0, loc)
	}
	return at.UTC()
}
