package client

import (
	"testing"
	"time"
)

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skip("no time zone data:", err)
	}
	for in, want := range map[string]time.Time{
		"2026-12-04T02:00:00Z":      time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC),
		"2026-12-04T02:00:00+01:00": time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC),
		"2026-12-04":                time.Date(2026, 12, 3, 23, 0, 0, 0, time.UTC), // midnight in Berlin
		"24h":                       now.Add(-24 * time.Hour),
		"90m":                       now.Add(-90 * time.Minute),
		"7d":                        now.Add(-7 * 24 * time.Hour),
		" 1h ":                      now.Add(-time.Hour),
	} {
		got, err := ParseTime(in, now, berlin)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "yesterday", "-2h", "12/04/2026", "2026-13-01", "3x", "-1d"} {
		if _, err := ParseTime(in, now, berlin); err == nil {
			t.Errorf("ParseTime(%q): no error", in)
		}
	}
}
