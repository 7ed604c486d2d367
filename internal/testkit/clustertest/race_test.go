package clustertest

import (
	"strings"
	"testing"
)

// RaceReports finds each report of the race detector in a process's output, whole, and
// nothing else.
func TestRaceReports(t *testing.T) {
	report := "WARNING: DATA RACE\nWrite at 0x00c000 by goroutine 7:\n  main.f()\n      /x.go:3 +0x1\n"
	log := `{"level":"INFO","msg":"flowd ready"}` + "\n==================\n" + report + "==================\n" +
		`{"level":"INFO","msg":"run"}` + "\n==================\n" + report + "==================\nFound 2 data race(s)\n"
	got := RaceReports(log)
	if strings.Count(got, "WARNING: DATA RACE") != 2 || !strings.Contains(got, "main.f()") || strings.Contains(got, "flowd ready") || strings.Contains(got, "Found 2") {
		t.Fatalf("RaceReports gave:\n%s", got)
	}
	if r := RaceReports(`{"level":"INFO","msg":"flowd ready"}`); r != "" {
		t.Fatalf("a clean log gave %q", r)
	}
}
