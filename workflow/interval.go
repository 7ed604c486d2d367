package workflow

import "time"

// Data intervals (issue 27): a run of a scheduled workflow closes the interval between
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
