package client

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseRange reads a since and an until as ParseTime does ("" leaves its end open),
// naming sinceName or untilName in an error, and checks that since comes first.
func ParseRange(since, until, sinceName, untilName string, now time.Time, loc *time.Location) (from, to time.Time, err error) {
	if since != "" {
		if from, err = ParseTime(since, now, loc); err != nil {
			return from, to, fmt.Errorf("%s: %w", sinceName, err)
		}
	}
	if until != "" {
		if to, err = ParseTime(until, now, loc); err != nil {
			return from, to, fmt.Errorf("%s: %w", untilName, err)
		}
	}
	if !from.IsZero() && !to.IsZero() && !from.Before(to) {
		return from, to, fmt.Errorf("%s %s is not before %s %s", sinceName, from.Format(time.RFC3339), untilName, to.Format(time.RFC3339))
	}
	return from, to, nil
}

// ParseTime reads a time as `run list --since/--until` take it: RFC 3339
// (2026-12-04T02:00:00Z), a date (2026-12-04: its midnight in loc), or a duration back
// from now (24h, 90m, 7d: d is 24 hours).
func ParseTime(s string, now time.Time, loc *time.Location) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, loc); err == nil {
		return t, nil
	}
	if n, ok := strings.CutSuffix(s, "d"); ok {
		if days, err := strconv.Atoi(n); err == nil && days >= 0 && days <= 100000 {
			return now.Add(-time.Duration(days) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("time %q: give RFC 3339 (2026-12-04T02:00:00Z), a date (2026-12-04, midnight %s) or a duration back from now (24h, 90m, 7d)", s, loc)
}
